"""Sigmoid belief network (Neal 1992), as trained in Mnih & Gregor 2014.

p(x, h) = p(x | h_1) prod_{i=1}^{n-1} p(h_i | h_{i+1}) p(h_n), every conditional a factorial
Bernoulli with logits W_i h_{i+1} + b_i, and p(h_n) factorial with learnable logits.

Tensors may carry any leading dimensions (samples, examples, enumerated states): the Linear layers
and ``bernoulli_log_prob`` broadcast over them, so estimators never loop over samples or examples.
"""

from __future__ import annotations

import torch
from torch import nn

from nvil.ops import bernoulli_log_prob


class SBN(nn.Module):
    """A sigmoid belief network with ``layers`` = [|h_1|, ..., |h_n|] binary latent units."""

    def __init__(self, n_visible: int, layers: list[int]) -> None:
        super().__init__()
        if not layers or any(int(n) < 1 for n in layers):
            raise ValueError(f"layers must be a non-empty list of positive sizes, got {layers}")
        self.n_visible = int(n_visible)
        self.layers = [int(n) for n in layers]
        sizes = [self.n_visible] + self.layers
        # decoders[i] maps h_{i+1} to the logits of h_i (h_0 = x).
        self.decoders = nn.ModuleList(nn.Linear(sizes[i + 1], sizes[i]) for i in range(len(self.layers)))
        self.prior_logits = nn.Parameter(torch.zeros(self.layers[-1]))

    @property
    def n_latent(self) -> int:
        return sum(self.layers)

    @torch.no_grad()
    def init_visible_bias(self, train_mean: torch.Tensor, eps: float = 1e-3) -> None:
        """Start the output bias at logit(mean training image), so step 0 already models the marginals."""
        p = train_mean.clamp(eps, 1 - eps).to(self.decoders[0].bias)
        self.decoders[0].bias.copy_(torch.log(p) - torch.log1p(-p))

    def log_prob_layers(self, x: torch.Tensor, hs: list[torch.Tensor]) -> list[torch.Tensor]:
        """[log p(x | h_1), log p(h_1 | h_2), ..., log p(h_n)], each summed over units.

        These are the per-layer terms NVIL's layer-wise learning signals are built from
        (Mnih & Gregor 2014, Sec. 2.3.3).
        """
        below = [x] + list(hs[:-1])
        terms = [bernoulli_log_prob(dec(h), v) for dec, h, v in zip(self.decoders, hs, below)]
        terms.append(bernoulli_log_prob(self.prior_logits, hs[-1]))
        return terms

    def log_joint(self, x: torch.Tensor, hs: list[torch.Tensor]) -> torch.Tensor:
        """log p(x, h_1, ..., h_n)."""
        return torch.stack(torch.broadcast_tensors(*self.log_prob_layers(x, hs))).sum(0)

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Ancestral sample: (x [n, n_visible], [h_1, ..., h_n])."""
        h = _bernoulli(self.prior_logits.expand(n, -1), generator)
        hs = [h]
        for dec in reversed(self.decoders[1:]):
            h = _bernoulli(dec(h), generator)
            hs.insert(0, h)
        x = _bernoulli(self.decoders[0](hs[0]), generator)
        return x, hs

    @torch.no_grad()
    def visible_probs(self, hs: list[torch.Tensor]) -> torch.Tensor:
        """p(x_j = 1 | h_1): what sample grids show, less noisy than binary samples."""
        return torch.sigmoid(self.decoders[0](hs[0]))


def _bernoulli(logits: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    u = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=logits.dtype)
    return (u < torch.sigmoid(logits)).to(logits.dtype)
