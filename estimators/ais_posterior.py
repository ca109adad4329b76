"""``estimator=ais_posterior``: per test case, AIS from the approximate posterior Q(h | v) to P(h | v) over binary
latent units (Murray & Salakhutdinov 2009, Sec. 2.3), for a built-in net with its inference network, a DBN, a DBM or
a user's binary-latent model (``nvil.estimators.latent_model.LatentModel``):

- ``PosteriorPath``: log f_beta(h) = (1 - beta) log Q(h | v) + beta log P*(v, h), moved by sequential Gibbs at
  each beta; Z_0 = 1, so exp(log w) is unbiased for sum_h P*(v, h). BDMC's binary side runs the same path;
- ``posterior_ladder``: the ladder of one batch, fixed before the main run (adaptive: from a pilot over the batch's
  own chains started from Q).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch

from nvil.core.config import positive_float, positive_int
from nvil.estimators.annealing import ais, check_schedule, make_ladder, pilot_betas
from nvil.estimators.base import NO_PROGRESS, BatchProgress
from nvil.estimators.latent_model import LatentModel
from nvil.estimators.per_example import PerExample
from nvil.estimators.settings import LOG_Z, LogZSettings
from nvil.mcmc.flip_gibbs import site_gibbs


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


def pilot_steps(kind: str, num_betas: int, pilot_fraction: float = 0.05) -> int:
    """The AIS steps of the pilot run that ``posterior_ladder`` makes for ladder ``kind`` (none for a fixed one)."""
    return len(pilot_betas(num_betas, pilot_fraction)) - 1 if kind == "adaptive" else 0


def posterior_ladder(path: PosteriorPath, lm: LatentModel, x: torch.Tensor, kind: str, num_betas: int, num_runs: int,
                     generator, pilot_fraction: float = 0.05, on_step=None):
    """The ladder of one batch of per-example AIS (chains = examples x ``num_runs``, example-major): with
    ``adaptive``, from a pilot over this batch's own chains started from Q (each example's runs a group, their
    increment spreads averaged), fixed before the main run, so every example's weights stay unbiased given it.
    ``on_step(k, increment)`` sees each pilot step (progress)."""
    return make_ladder(kind, num_betas, pilot=lambda: (path, path.state(lm.sample_q(x, generator))),
                       generator=generator, groups=x.shape[0] // num_runs, pilot_fraction=pilot_fraction,
                       on_step=on_step)


class AISPosterior(PerExample):
    """``estimator=ais_posterior``: per test case, AIS from Q(h | v) to P(h | v) with sequential Gibbs at each beta.

    Murray & Salakhutdinov 2009, Sec. 2.3: the path log f_beta(h) = (1 - beta) log Q(h | v) + beta log P*(v, h)
    (``PosteriorPath``), Z_0 = 1. Each run's exp(log w) is unbiased for sum_h P*(v, h); the ``num_runs`` runs'
    weights are averaged per test case, and a DBN's top-RBM log Z is subtracted. It serves a built-in net with its
    inference network, a DBN, a DBM or a user's binary-latent model. Defaults: configs/estimator/ais_posterior.yaml.

    Parameters
    ----------
    num_betas : int, default 300
        AIS steps (K; adaptive at 100 matched linear at 300 on a 12-latent SBN).
    schedule : str, default "adaptive"
        adaptive (one ladder per batch from a pilot run) | linear | sigmoid | paper.
    pilot_fraction : float, default 0.05
        Adaptive only: the pilot's steps as a share of num_betas.
    num_runs : int, default 10
        Chains per test case, their weights averaged.
    batch_size : int, default 50
        Test cases per batch (chains = batch_size x num_runs).
    accel : str, default "auto"
        auto (each beta's sweep in C on a CPU, one Triton kernel on CUDA) | none | native.
    log_z : LogZSettings or Mapping, default LOG_Z
        A DBN's top-RBM log Z settings, as ``PerExample`` (``LogZSettings`` or a mapping of its fields).
    min_example_ess : float or None, default None
        The per-example ESS over its runs below which the certificate fails, as ``PerExample`` (None:
        max(1.5, 0.2 num_runs)).

    Raises
    ------
    nvil.core.errors.ConfigError
        If a count or ``pilot_fraction`` is not positive, the schedule or ``accel`` mode is unknown, or ``log_z``
        is not a valid log Z block.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import build_sbn
    >>> from nvil.estimators import AISPosterior, Exact
    >>> sbn, q = build_sbn(6, layers=[3])
    >>> v, _ = sbn.sample(5)
    >>> result = AISPosterior(num_betas=20, num_runs=4).estimate(sbn, v, inference=q)
    >>> result.log_p.shape, result.checks
    (torch.Size([5]), ['nonzero_estimates', 'example_ess', 'run_spread'])
    >>> abs(result.mean_log_p - Exact().estimate(sbn, v, inference=q).mean_log_p) < 0.1  # 3 latents: exact sum
    True
    """

    name = "ais_posterior"
    importance_runs = True
    serves_protocol = True  # a user's binary-latent model too (``LatentModel``)

    def __init__(self, *, num_betas: int = 300, schedule: str = "adaptive", pilot_fraction: float = 0.05,
                 num_runs: int = 10, batch_size: int = 50, accel: str = "auto",
                 log_z: LogZSettings | Mapping = LOG_Z, min_example_ess: float | None = None) -> None:
        super().__init__(num_runs=num_runs, batch_size=batch_size, accel=accel, log_z=log_z,
                         min_example_ess=min_example_ess)
        self.num_betas = positive_int(num_betas, "estimator.num_betas")
        self.schedule = schedule
        self.pilot_fraction = positive_float(pilot_fraction, "estimator.pilot_fraction")
        check_schedule(self.schedule, self.num_betas)
        self.pilot_steps = 0

    def settings(self) -> dict:
        """The estimator's settings for the result's ``extras``.

        Returns
        -------
        dict
            ``num_betas`` and ``schedule``; with ``adaptive``, ``pilot_steps_per_batch`` (the last batch's pilot
            steps).
        """
        out = {"num_betas": self.num_betas, "schedule": self.schedule}
        if self.schedule == "adaptive":
            out["pilot_steps_per_batch"] = self.pilot_steps
        return out

    def run_batch(self, lm: LatentModel, x: torch.Tensor, generator,
                  progress: BatchProgress = NO_PROGRESS) -> torch.Tensor:
        """One batch's AIS runs from Q(h | v) to P(h | v): a log-weight per chain, exp of each unbiased for P*(v).

        With ``adaptive`` the batch's ladder comes from a pilot over its own chains, fixed before the main run.
        Progress: one unit per AIS step, the pilot's and the main run's (each a sequential-Gibbs sweep).

        Parameters
        ----------
        lm : LatentModel
            The model's binary latents with Q(h | v) (``nvil.estimators.latent_model.LatentModel``).
        x : torch.Tensor
            ``[chains, n_visible]``: each test case repeated ``num_runs`` times, example-major.
        generator : torch.Generator
            The batch's source of randomness (seeded by (seed, first row)).
        progress : BatchProgress, default NO_PROGRESS
            The batch's share of the evaluation bar.

        Returns
        -------
        torch.Tensor
            ``[chains]`` log w, each an estimate of log sum_h P*(v, h) (a DBN's top log Z not yet subtracted).
        """
        progress.plan(pilot_steps(self.schedule, self.num_betas, self.pilot_fraction) + self.num_betas)
        step = lambda k, increment: progress.advance()  # noqa: E731
        path = PosteriorPath(lm.joint(x), lm.q_density(x), self.accel)
        ladder = posterior_ladder(path, lm, x, self.schedule, self.num_betas, self.num_runs, generator,
                                  self.pilot_fraction, on_step=step)
        self.pilot_steps = ladder.pilot_steps
        log_w, _ = ais(path, path.state(lm.sample_q(x, generator)), ladder.betas(self.num_betas), generator,
                       on_step=step)
        return log_w
