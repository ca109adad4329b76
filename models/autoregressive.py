"""Autoregressive binary layers: p(h_j = 1 | h_<j) = sigmoid(a_j + sum_{k<j} W_jk h_k).

Used by fDARN's prior (Gregor et al. 2014; Mnih & Gregor 2014, Sec. 4) and by autoregressive
inference-network layers (Mnih & Gregor 2014, Table 2). W is kept strictly lower-triangular by a mask.

- ``log_prob``: one masked matmul, batched over any leading dimensions.
- ``sample``: a loop over the units of the layer only (never over examples or samples). The logits are
  updated incrementally, logits += h_j * W[:, j], so the whole draw costs one matmul's worth of work. With
  ``sample_mode`` ``native`` or ``auto`` (``trainer.accel``, set by the learner) on a CPU the loop runs as one C call
  (``nvil.backend.native.autoregressive``): the same uniforms and operations, no per-unit kernel launches.
"""

from __future__ import annotations

import torch
from torch import nn

from nvil.backend import native
from nvil.backend.native.bernoulli_log_prob import bernoulli_log_prob


class AutoregressiveLinear(nn.Module):
    """The strictly lower-triangular connections among the n units of one layer."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n, n))
        self.register_buffer("mask", torch.tril(torch.ones(n, n), diagonal=-1))
        self.sample_mode = "none"  # trainer.accel: native / auto draw the units in C on a CPU (nvil.backend.native)

    def accelerate_sampling(self, mode: str) -> None:
        """``trainer.accel`` for ``sample`` (the learners' protocol for modules with sequential draws)."""
        self.sample_mode = mode

    def masked_weight(self) -> torch.Tensor:
        return self.weight * self.mask

    def logits(self, base_logits: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """a + W h with W strictly lower-triangular: the logits of every unit given its predecessors."""
        return base_logits + h @ self.masked_weight().T

    def log_prob(self, base_logits: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return bernoulli_log_prob(self.logits(base_logits, h), h)

    @torch.no_grad()
    def sample(self, base_logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        u = torch.rand(base_logits.shape, generator=generator, device=base_logits.device, dtype=base_logits.dtype)
        return self.sample_given(base_logits, u)

    @torch.no_grad()
    def sample_given(self, base_logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The draw of ``sample`` for its uniforms ``u`` (one per unit): h_j = [u_j < sigmoid(a_j + sum_{k<j} W_jk h_k)],
        j in index order."""
        w = self.masked_weight()
        logits = base_logits.detach().clone()
        if native.wanted(self.sample_mode, logits.device):
            return native.autoregressive(logits, w.T.contiguous(), u)
        h = torch.zeros_like(logits)
        for j in range(logits.shape[-1]):
            h_j = (u[..., j] < torch.sigmoid(logits[..., j])).to(logits.dtype)
            h[..., j] = h_j
            logits += h_j.unsqueeze(-1) * w[:, j]  # only units after j see h_j
        return h
