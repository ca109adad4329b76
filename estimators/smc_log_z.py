"""``estimator=smc``: a Boltzmann machine's log Z by adaptive tempered SMC (``nvil.estimators.smc``) with the
certificate of ``estimator=ais``, and the per-example log p(v) = -F(v) - log Z (an RBM or semi-RBM; a DBM's
mean-field bound less the log Z of its top machine).

``num_runs`` independent SMC runs of ``num_particles`` particles each, batched, walk the ladder a pilot run of
``pilot_runs`` x ``num_particles`` particles of its own chose (each next beta at the conditional ESS share ``cess``),
resampling a run whose ESS falls below ``resample_ess`` of its particles and moving every particle by
``num_moves`` block-Gibbs sweeps per beta. Each run's Z_r is unbiased for Z; the estimate is their mean, its
standard error from their spread (the delta method on Z_hat = mean_r Z_r), its ESS over the runs. The certificate
(``nvil.estimators.certify``): the hard lower bound from probe states, reverse AIS from each reverse source on the
SMC ladder at ``reverse_fraction`` of the forward cost (``SMCSampler.reverse``), the ESS over runs, and the
forward-reverse gap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import torch

from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.estimators.ais import AIS
from nvil.estimators.ais_rbm import ForwardRun, base_rate
from nvil.estimators.annealing import Ladder, LogZ
from nvil.estimators.certify import certified_log_z
from nvil.estimators.smc import adaptive_betas, group_log_z, smc


@dataclass
class SMCLadder(Ladder):
    """The ladder an adaptive SMC pilot chose (``knots``, one unit of ``rate`` mass per step, so ``betas(K)`` spaces
    any number of steps as the pilot did: the reverse run's), with what the runs did on it."""

    cess: float = 0.9
    num_particles: int = 0
    num_runs: int = 0
    resampling_events: int = 0

    @classmethod
    def of(cls, betas: torch.Tensor, **what) -> "SMCLadder":
        return cls("adaptive", betas, 1.0 / betas.diff().clamp(min=1e-300), len(betas) - 1, None, **what)

    def extras(self) -> dict:
        return {"schedule": "smc", "num_betas": self.pilot_steps, "cess": self.cess,
                "num_particles": self.num_particles, "num_runs": self.num_runs,
                "resampling_events": self.resampling_events}


@dataclass(frozen=True)
class SMCSampler:
    """The forward side of ``certified_log_z`` by SMC (the module docstring)."""

    num_particles: int
    num_runs: int
    cess: float
    resample_ess: float
    num_moves: int
    max_betas: int
    pilot_runs: int
    steps: ClassVar[list[str]] = ["pilot SMC", "forward SMC"]

    def __post_init__(self) -> None:
        for key in ("num_particles", "num_runs", "pilot_runs", "num_moves", "max_betas"):
            object.__setattr__(self, key, positive_int(getattr(self, key), f"estimator.{key}"))
        for key in ("cess", "resample_ess"):
            value = float(getattr(self, key))
            if not 0.0 < value < 1.0:
                raise ConfigError(f"estimator.{key} must lie strictly between 0 and 1, got {value}")
            object.__setattr__(self, key, value)
        if self.num_particles < 2:
            raise ConfigError("estimator.num_particles must be at least 2 (resampling needs a choice)")

    def reverse(self, num_betas: int, cert) -> tuple[int, int]:
        """(chains, steps) of the reverse AIS run on this ladder of ``num_betas`` steps: 2 x ``num_runs`` chains
        on ``reverse_fraction`` x ``num_betas`` x ``num_particles`` / 2 steps, so it costs ``reverse_fraction``
        of the forward runs as in ``estimator=ais``, spent on longer chains: the resampling that lets SMC take
        large steps is not open to reverse AIS, whose bound needs small ones."""
        chains = 2 * self.num_runs
        return chains, max(1, round(cert.reverse_fraction * num_betas * self.num_particles * self.num_runs / chains))

    def settings(self) -> dict:
        return {"num_particles": self.num_particles, "num_runs": self.num_runs, "cess": self.cess,
                "resample_ess": self.resample_ess, "num_moves": self.num_moves, "pilot_runs": self.pilot_runs}

    def run(self, path, generator, progress, announce) -> tuple[ForwardRun, SMCLadder]:
        n = self.num_particles
        announce("pilot SMC")
        betas = adaptive_betas(path, path.sample_base(self.pilot_runs * n, generator), self.pilot_runs,
                               target=self.cess, resample_ess=self.resample_ess, num_moves=self.num_moves,
                               max_betas=self.max_betas, generator=generator)
        announce("forward SMC")
        t0 = time.perf_counter()
        log_w, end, events = smc(path, path.sample_base(self.num_runs * n, generator), betas, self.num_runs,
                                 resample_ess=self.resample_ess, num_moves=self.num_moves, generator=generator)
        estimate = LogZ.from_log_w(group_log_z(log_w, self.num_runs), path.log_z0(), "forward", len(betas) - 1,
                                   time.perf_counter() - t0)
        ladder = SMCLadder.of(betas, cess=self.cess, num_particles=n, num_runs=self.num_runs,
                              resampling_events=events)
        return ForwardRun(estimate, end, log_w), ladder


class SMC(AIS):
    """``estimator=smc`` (the module docstring). From Python:
    ``SMC(num_particles=100, num_runs=10).estimate(rbm, x_test, train=x_train)``. The keywords (defaults:
    configs/estimator/smc.yaml): ``num_particles``, ``num_runs``, ``cess``, ``resample_ess``, ``num_moves``,
    ``max_betas`` (more temperatures than this is refused), ``pilot_runs``; the certificate's and the free
    energies' as ``AIS`` (``base_smoothing``, ``certify``, ``reverse_fraction``, ``reverse_sources``,
    ``reverse_burn_in``, ``max_gap``, ``min_ess_fraction`` (of the runs), ``num_climb``, ``num_data_probes``,
    ``batch_size``, ``accel``, ``cache``)."""

    name = "smc"

    def __init__(self, *, num_particles: int = 100, num_runs: int = 10, cess: float = 0.9,
                 resample_ess: float = 0.5, num_moves: int = 1, max_betas: int = 100_000, pilot_runs: int = 2,
                 base_smoothing: float = 0.05, certify: bool = True, reverse_fraction: float = 0.5,
                 reverse_sources: list[str] = ["forward", "particles"],  # noqa: B006  (the yaml's list)
                 reverse_burn_in: int | None = None, max_gap: float = 1.0, min_ess_fraction: float = 0.1,
                 num_climb: int = 256, num_data_probes: int = 1000, batch_size: int = 1000, accel: str = "auto",
                 cache: bool = True) -> None:
        self.sampler = SMCSampler(num_particles, num_runs, cess, resample_ess, num_moves, max_betas, pilot_runs)
        super().__init__(num_chains=self.sampler.num_particles * self.sampler.num_runs, schedule="adaptive",
                         num_betas=max_betas, base_smoothing=base_smoothing, certify=certify,
                         reverse_fraction=positive_float(reverse_fraction, "estimator.reverse_fraction"),
                         reverse_sources=reverse_sources, reverse_burn_in=reverse_burn_in, max_gap=max_gap,
                         min_ess_fraction=min_ess_fraction, num_climb=num_climb, num_data_probes=num_data_probes,
                         batch_size=batch_size, accel=accel, cache=cache)

    def certified_log_z(self, model, train, rows, generator, progress, particles=None, phase=None):
        base = base_rate(model, train, self.settings.base_smoothing)
        return certified_log_z(model, base, self.settings, self.cert, generator, data_rows=rows, particles=particles,
                               progress=progress, accel=self.accel, phase=phase, sources=self.reverse_sources,
                               sampler=self.sampler)

    def cache_extra(self) -> dict:
        return {"sampler": "smc", **self.sampler.settings()}

    def schedule_label(self) -> str:
        return "smc"

