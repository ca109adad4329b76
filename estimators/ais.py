"""Annealed importance sampling, one import for all of it: the machinery (``nvil.estimators.annealing``: ladders, the
loop, ``LogZ``), the Boltzmann machine's path from its base-rate model (``nvil.estimators.ais_rbm``) and, here, the
per-example path over the latent units (estimator=ais_posterior, and bdmc's binary side):

- ``PosteriorPath``: log f_beta(h) = (1 - beta) log Q(h | v) + beta log P*(v, h), from the inference network's Q
  to the posterior, by sequential Gibbs (Murray & Salakhutdinov 2009, Sec. 2.3); Z_0 = 1, so exp(log w) is
  unbiased for sum_h P*(v, h).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from nvil.estimators.ais_rbm import (
    RBMPath,
    RBMState,
    TemperedRBM,
    base_rate,
    check_boltzmann,
    forward_log_z,
    free_energy_log_p,
    rbm_log_z,
    rbm_log_z_reverse,
    reverse_log_z,
)
from nvil.estimators.annealing import (
    FIXED_SCHEDULES,
    PAPER_SEGMENTS,
    SCHEDULES,
    Ladder,
    LogZ,
    adaptive_ladder,
    ais,
    check_schedule,
    make_ladder,
    pilot_betas,
    pilot_grid,
    schedule,
)
from nvil.estimators.settings import AISSettings
from nvil.mcmc.flip_gibbs import site_gibbs

__all__ = ["FIXED_SCHEDULES", "PAPER_SEGMENTS", "SCHEDULES", "AISSettings", "Ladder", "LogZ", "PosteriorPath",
           "PosteriorState", "RBMPath", "RBMState", "TemperedRBM", "adaptive_ladder", "ais", "base_rate",
           "check_boltzmann", "check_schedule", "forward_log_z", "free_energy_log_p", "make_ladder", "pilot_betas", "pilot_grid",
           "rbm_log_z", "rbm_log_z_reverse", "reverse_log_z", "schedule"]


class PosteriorState(NamedTuple):
    h: torch.Tensor
    log_p: torch.Tensor  # log P*(v, h)
    log_q: torch.Tensor  # log Q(h | v)


class PosteriorPath:
    """f_beta(h) = Q(h | v)^(1 - beta) P*(v, h)^beta for each chain's own v; sequential Gibbs moves (``accel``:
    ``nvil.backend.accel``; ``native`` / ``auto`` run each sweep as one C call, so a new beta costs nothing extra)."""

    def __init__(self, joint, q, accel: str = "none") -> None:
        self.joint, self.q, self.accel = joint, q, accel

    def state(self, h: torch.Tensor) -> PosteriorState:
        return PosteriorState(h, self.joint.log_prob(h), self.q.log_prob(h))

    def log_f(self, state: PosteriorState, beta: float) -> torch.Tensor:
        return (1 - beta) * state.log_q + beta * state.log_p

    def transition(self, state: PosteriorState, beta: float, generator=None) -> PosteriorState:
        h, _ = site_gibbs([(1 - beta, self.q), (beta, self.joint)], self.accel).sweep(state.h, generator=generator)
        return self.state(h)
