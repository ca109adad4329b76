"""Per-chain step-size adaptation for HMC, fed by ``HMCInfo.accept_prob``; sampling itself never changes.

Every function works on [chains] tensors on any device, without host syncs.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor


class DualAveragingState(NamedTuple):
    log_step: Tensor      # [chains] current log step size (the one to use next)
    log_step_avg: Tensor  # [chains] iterate average, x_bar
    h_avg: Tensor         # [chains] running average of (target - accept_prob)
    count: Tensor         # [chains] number of updates t
    mu: Tensor            # [chains], log(10 * initial step size)


class DualAveraging:
    """Hoffman & Gelman 2014, Algorithm 5 (Sec. 3.2.1), per chain: the step size moves so that the mean
    acceptance probability approaches ``target_accept`` (delta). After the t-th acceptance probability alpha_t:

        H_bar_t   = (1 - 1/(t + t0)) H_bar_{t-1} + (delta - alpha_t) / (t + t0)
        log eps_t = mu - sqrt(t) / gamma * H_bar_t
        x_bar_t   = t^-kappa log eps_t + (1 - t^-kappa) x_bar_{t-1}

    with mu = log(10 eps_0). Sample with ``step_size`` while adapting and with ``final_step_size``
    (exp x_bar) afterwards. ``max_count`` (default None) caps t, which turns the averages into
    exponential moving averages, so that adaptation keeps responding when the target drifts (e.g. the
    posterior changes during MCEM training).
    """

    def __init__(self, target_accept: float = 0.65, gamma: float = 0.05, t0: float = 10.0, kappa: float = 0.75,
                 max_count: int | None = None) -> None:
        self.target_accept, self.gamma, self.t0, self.kappa = target_accept, gamma, t0, kappa
        self.max_count = max_count

    def init(self, step_size: Tensor) -> DualAveragingState:
        """x_bar starts at log eps_0 rather than the paper's 0, so ``final_step_size`` is eps_0 before any
        update; the first update overwrites it either way (its weight is 1^-kappa = 1)."""
        log_step = torch.as_tensor(step_size).log()
        # Five distinct tensors, so that callers may update rows of the state in place.
        return DualAveragingState(log_step, log_step.clone(), torch.zeros_like(log_step), torch.zeros_like(log_step),
                                  log_step + math.log(10.0))

    def update(self, state: DualAveragingState, accept_prob: Tensor) -> DualAveragingState:
        t = state.count + 1
        if self.max_count is not None:
            t = t.clamp(max=self.max_count)
        alpha = torch.nan_to_num(accept_prob.to(state.h_avg), nan=0.0)  # NaN acceptance counts as rejection
        w = 1.0 / (t + self.t0)
        h_avg = (1 - w) * state.h_avg + w * (self.target_accept - alpha)
        log_step = state.mu - t.sqrt() / self.gamma * h_avg
        eta = t.pow(-self.kappa)
        log_step_avg = eta * log_step + (1 - eta) * state.log_step_avg
        return DualAveragingState(log_step, log_step_avg, h_avg, t, state.mu)

    @staticmethod
    def step_size(state: DualAveragingState) -> Tensor:
        """The step size to use while adapting, exp(log eps_t)."""
        return state.log_step.exp()

    @staticmethod
    def final_step_size(state: DualAveragingState) -> Tensor:
        """The step size to use once adaptation stops, exp(x_bar_t)."""
        return state.log_step_avg.exp()


def multiplicative_adapt(step_size: Tensor, accept_prob: Tensor, target: float = 0.65, up: float = 1.02,
                         down: float = 0.98, min_step: float = 1e-4, max_step: float | None = 0.5) -> Tensor:
    """Wu, Burda, Salakhutdinov & Grosse 2017 (AIS for decoder-based models, Sec. 5): per chain, multiply the
    step size by ``up`` where the acceptance probability exceeded the target, else by ``down``; clamped
    to [min_step, max_step] (``max_step=None``: no upper clamp). The 0.5 default binds on posteriors whose
    scale is near 1 (an auxiliary-form net, prior N(0, I)), holding the acceptance above its target."""
    return torch.where(accept_prob > target, step_size * up, step_size * down).clamp(min_step, max_step)
