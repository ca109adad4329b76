"""NVIL baselines (Mnih & Gregor 2014, Sec. 2.3.1-2.3.2).

- ``InputDependentBaseline``: b_psi(h_{i-1}), an MLP with one hidden layer of 100 tanh units.
- The constant baseline c and the variance v are ``nvil.ops.RunningMoments`` (smoothing 0.8).
"""

from __future__ import annotations

import torch
from torch import nn


class InputDependentBaseline(nn.Module):
    """b_psi(x): R^d -> R, one hidden layer of ``hidden`` tanh units (the paper uses 100)."""

    def __init__(self, in_dim: int, hidden: int = 100) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        # Start at b = 0 so an untrained baseline leaves the signal unchanged.
        nn.init.zeros_(self.net[2].weight)
        nn.init.zeros_(self.net[2].bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)
