"""NVIL's learning signal and its baselines (Mnih & Gregor 2014, Sec. 2.3; supplementary Algorithm 1).

- ``layerwise_signals``: the signal l_i of each layer (Sec. 2.3.3), or the full l for every layer.
- ``InputDependentBaseline``: b_psi(h_{i-1}), an MLP with one hidden layer of 100 tanh units (Sec. 2.3.1).
- ``learning_signal``: centring by b_psi and the constant baseline c, and variance normalisation by v
  (Sec. 2.3.1-2.3.2), with c and v running moments (``nvil.core.ops.RunningMoments``, smoothing 0.8);
  ``baseline_loss`` (and its gradient in b, ``baseline_loss_grad``): the baseline's own loss.

``SignalFlags`` switches each technique off for the paper's Fig. 1 ablation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from nvil.core.ops import RunningMoments


@dataclass(frozen=True)
class SignalFlags:
    """Which variance-reduction techniques are on (``learner.input_baseline`` etc.)."""

    input_baseline: bool = True
    constant_baseline: bool = True
    variance_normalisation: bool = True
    layerwise: bool = True


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


def layerwise_signals(log_p: list[torch.Tensor], log_q: list[torch.Tensor], layerwise: bool) -> list[torch.Tensor]:
    """Learning signals l_1..l_n from per-layer log-probabilities (Mnih & Gregor 2014, Sec. 2.3.3).

    ``log_p`` = [log p(x | h_1), ..., log p(h_{n-1} | h_n), log p(h_n)] (n + 1 terms) and
    ``log_q`` = [log q(h_1 | x), ..., log q(h_n | h_{n-1})] (n terms). Layer i (0-based j = i - 1) keeps
    the terms that depend on h_i..h_n: l_j = sum_{k >= j} log_p[k] - sum_{k >= j} log_q[k].
    Without layer-wise signals every layer gets the full signal l = log p(x, h) - log q(h | x).
    """
    n = len(log_q)
    signals = []
    suffix = log_p[n]
    for j in reversed(range(n)):
        suffix = suffix + log_p[j] - log_q[j]
        signals.insert(0, suffix)
    if not layerwise:
        signals = [signals[0]] * n
    return signals


def _centre_and_scale(moments: RunningMoments, flags: SignalFlags):
    """(c, max(1, sqrt v)), or 0 and 1 for a technique switched off."""
    c = moments.mean if flags.constant_baseline else 0.0
    scale = moments.var.sqrt().clamp(min=1.0) if flags.variance_normalisation else 1.0
    return c, scale


class LearningSignal(NamedTuple):
    """One layer's centred, normalised signal and what its baseline's update needs.

    ``a`` = (l - b - c) / max(1, sqrt(v)) (detached), the factor of grad_phi log q (Eq. 6); ``residual`` =
    l - c - b, the input-dependent baseline's error (b with its graph on the autograd path); ``scale`` =
    max(1, sqrt(v)) (or 1).
    """

    a: torch.Tensor
    residual: torch.Tensor
    scale: torch.Tensor | float


def learning_signal(l: torch.Tensor, b: torch.Tensor, moments: RunningMoments, flags: SignalFlags,
                    update_moments: bool = True) -> LearningSignal:
    """The ``LearningSignal`` of one layer's signal ``l`` [batch] and input-dependent baseline ``b`` [batch].

    c and v are the running mean and variance of l - b, updated with this minibatch before they are used
    (Algorithm 1; ``update_moments=False`` keeps them fixed). Both gradient paths of ``nvil.learners.nvil`` (autograd
    and the hand-derived one of ``nvil.learners.fused``) take a, c and v from here.
    """
    centred = l - b.detach()
    if update_moments:
        moments.update(centred)
    c, scale = _centre_and_scale(moments, flags)
    return LearningSignal(((centred - c) / scale).detach(), l - c - b, scale)


def baseline_loss(signal: LearningSignal, flags: SignalFlags) -> torch.Tensor:
    """0.5 mean((l - c - b)^2) / max(1, sqrt(v)): Algorithm 1 moves psi along a * grad b, this loss's negative
    gradient. 0 without an input baseline."""
    if not flags.input_baseline:
        return signal.residual.new_zeros(())
    return 0.5 * (signal.residual.pow(2) / signal.scale).mean()


def baseline_loss_grad(signal: LearningSignal) -> torch.Tensor:
    """d baseline_loss / d b [batch] = -(l - c - b) / (max(1, sqrt(v)) batch), what the hand-derived path
    backpropagates into b_psi. Written in the order autograd evaluates it, so both paths round alike: the first
    minibatch sets c to the mean of l - b, which makes the output bias's gradient sum(l - c - b) = 0 up to rounding,
    and Adam would turn a difference in that rounding into a full step."""
    return (2 * signal.residual).mul_(0.5 / signal.residual.shape[0] / signal.scale).neg_()


def signal_metrics(l: torch.Tensor, b: torch.Tensor, moments: RunningMoments, flags: SignalFlags,
                   prefix: str) -> dict[str, torch.Tensor]:
    """What a logging step reports of one layer's signal: the centred signal's mean and variance, c, v and the
    baseline's mean squared error (l - c - b)^2."""
    centred = (l - b).detach()
    c, _ = _centre_and_scale(moments, flags)
    return {f"{prefix}/signal_mean": centred.mean(), f"{prefix}/signal_var": centred.var(unbiased=False),
            f"{prefix}/c": moments.mean.detach().clone(), f"{prefix}/v": moments.var.detach().clone(),
            f"{prefix}/baseline_mse": (l - c - b).detach().pow(2).mean()}
