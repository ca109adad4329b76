"""Inference networks q(h | x) for directed binary models.

Factorial, layer by layer (Mnih & Gregor 2014, Eq. 11):
q(h | x) = q(h_1 | x) prod_{i=2}^{n} q(h_i | h_{i-1}), each a factorial Bernoulli with logits
U_i h_{i-1} + c_i. The input x is centred by the training mean before it enters the network, which the
paper reports as essential.
"""

from __future__ import annotations

import torch
from torch import nn

from nvil.ops import bernoulli_log_prob


class FactorialInference(nn.Module):
    def __init__(self, n_visible: int, layers: list[int]) -> None:
        super().__init__()
        sizes = [int(n_visible)] + [int(n) for n in layers]
        # encoders[i] maps h_i to the logits of h_{i+1} (h_0 = centred x).
        self.encoders = nn.ModuleList(nn.Linear(sizes[i], sizes[i + 1]) for i in range(len(layers)))
        self.register_buffer("input_mean", torch.zeros(int(n_visible)))

    @torch.no_grad()
    def set_input_mean(self, mean: torch.Tensor) -> None:
        self.input_mean.copy_(mean)

    def centre(self, x: torch.Tensor) -> torch.Tensor:
        return x - self.input_mean

    def sample(
        self, x: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(h_layers, log_q_layers): binary samples (no gradient) and log q(h_i | h_{i-1}) (with gradient)."""
        h = self.centre(x)
        hs, log_qs = [], []
        for enc in self.encoders:
            logits = enc(h)
            with torch.no_grad():
                u = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=logits.dtype)
                h = (u < torch.sigmoid(logits)).to(logits.dtype)
            hs.append(h)
            log_qs.append(bernoulli_log_prob(logits, h))
        return hs, log_qs

    def log_prob_layers(self, hs: list[torch.Tensor], x: torch.Tensor) -> list[torch.Tensor]:
        """[log q(h_1 | x), log q(h_2 | h_1), ...]; broadcasts over leading dimensions."""
        below = [self.centre(x)] + list(hs[:-1])
        return [bernoulli_log_prob(enc(v), h) for enc, v, h in zip(self.encoders, below, hs)]

    def log_prob(self, hs: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return torch.stack(torch.broadcast_tensors(*self.log_prob_layers(hs, x))).sum(0)
