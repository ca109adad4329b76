"""``estimator=smc``: a Boltzmann machine's log Z by adaptive tempered SMC (``nvil.estimators.smc``) with the
certificate of ``estimator=ais``, and the per-example log p(v) = -F(v) - log Z (an RBM or semi-RBM; a DBM's
mean-field bound less the log Z of its top machine).

``num_runs`` independent SMC runs of ``num_particles`` particles each, batched, walk the ladder a pilot run of
``pilot_runs`` x ``num_particles`` particles of its own chose (each next beta at the conditional ESS share ``cess``),
resampling a run whose ESS falls below ``resample_ess`` of its particles and moving every particle by
``num_moves`` block-Gibbs sweeps per beta. Each run's Z_r is unbiased for Z; the estimate is their mean, its
standard error from their spread (the delta method on Z_hat = mean_r Z_r), its ESS over the runs. The certificate
(``nvil.estimators.certify``): the hard lower bound from probe states, reverse AIS from each reverse source on
``reverse_fraction`` of the SMC ladder's steps, the ESS over runs, and the forward-reverse gap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import torch

from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.estimators.ais import AIS
from nvil.estimators.ais_per_example import ModelAIS
from nvil.estimators.ais_rbm import ForwardRun, base_rate
from nvil.estimators.annealing import Ladder, LogZ
from nvil.estimators.base import NO_PROGRESS
from nvil.estimators.certify import certified_log_z
from nvil.estimators.model_paths import ModelPath, fixed_kernel_path
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


class ModelSMC(ModelAIS):
    """``estimator=smc`` on a model whose latents are integrated out (a user's model, the VAE, a Gaussian net: the
    route of ``nvil.estimators.PROTOCOL_ROUTES``): per example, ``num_runs`` independent SMC runs of
    ``num_particles`` particles from the base (``start``: prior or proposal) to the posterior along
    ``nvil.estimators.model_paths.ModelPath``. Per batch, a pilot system (``pilot_runs`` runs per example, its
    HMC chains adapting their own step sizes) chooses one ladder by the conditional ESS share ``cess`` in the
    example that needs the smallest steps; for continuous z the step sizes are then fixed on that ladder by the
    pilot of ``estimator=ais`` (``fixed_kernel_path``), and the runs walk it with fresh particles, resampling a run
    whose ESS falls below ``resample_ess`` and moving every particle ``num_moves`` times per beta (a Gibbs scan,
    ``num_latent`` Metropolis flips, or an HMC move of ``num_leapfrog`` steps). Each run's estimate is unbiased for
    p(x); the certificate is ``estimator=ais``'s over the runs (per-example ESS, run spread, above IWAE, and BDMC on
    simulated data by AIS on the SMC ladder)."""

    name = "smc"
    runs_name = "num_runs"

    def __init__(self, *, num_particles: int = 16, num_runs: int = 4, cess: float = 0.9, resample_ess: float = 0.5,
                 num_moves: int = 1, max_betas: int = 100_000, pilot_runs: int = 1, start: str | None = None,
                 batch_size: int = 50, num_leapfrog: int = 10, step_size: float = 0.05, target_accept: float = 0.65,
                 max_step_size: float | None = 10.0, adapt: bool = True, pilot_chains: int = 2, moves: str = "gibbs",
                 num_flips: int = 1, iwae_samples: int = 1000, num_simulated: int = 50, max_gap: float = 1.0,
                 accel: str = "none", min_example_ess: float | None = None) -> None:
        self.sampler = SMCSampler(num_particles, num_runs, cess, resample_ess, num_moves, max_betas, pilot_runs)
        super().__init__(num_chains=self.sampler.num_runs, start=start, batch_size=batch_size,
                         num_leapfrog=num_leapfrog, step_size=step_size, target_accept=target_accept,
                         max_step_size=max_step_size, adapt=adapt, pilot_chains=pilot_chains, moves=moves,
                         num_flips=num_flips, iwae_samples=iwae_samples, num_simulated=num_simulated,
                         max_gap=max_gap, accel=accel, min_example_ess=min_example_ess)
        self.ladders: list[torch.Tensor] = []
        self.events = 0

    def run_batch(self, pm, x, generator, progress=NO_PROGRESS) -> torch.Tensor:
        """Each row of ``x`` is one run of its example (``num_runs`` rows per example): [rows] log p(x) per run."""
        s, n, runs = self.sampler, self.sampler.num_particles, self.num_runs
        start = self.start or pm.default_base()
        kernel = {k: self.path_settings[k] for k in ("num_leapfrog", "target_accept", "max_step_size", "moves",
                                                     "num_flips", "accel")}
        pilot_rows = x[::runs].repeat_interleave(s.pilot_runs * n, 0)
        pilot = ModelPath(pm, pilot_rows, pm.base(start, pilot_rows), adapt=self.path_settings["adapt"], **kernel)
        betas = adaptive_betas(pilot, pilot.start(generator, self.step_size), pilot_rows.shape[0] // n,
                               target=s.cess, resample_ess=s.resample_ess, num_moves=s.num_moves,
                               max_betas=s.max_betas, generator=generator)
        progress.plan(2 * (len(betas) - 1))
        rows = x.repeat_interleave(n, 0)
        path = fixed_kernel_path(pm, rows, betas, start=start, chains=runs * n, generator=generator,
                                 **self.path_settings)
        log_w, final, events = smc(path, path.start(generator, self.step_size), betas, x.shape[0],
                                   resample_ess=s.resample_ess, num_moves=s.num_moves, generator=generator,
                                   on_step=lambda k, inc: progress.advance())
        self.ladders.append(betas)
        self.events += events
        moves = max(1, (len(betas) - 2) * s.num_moves)
        self.accept.append((final.accept_sum / moves).cpu())
        self.final_steps.append(final.step_size.cpu())
        return group_log_z(log_w, x.shape[0])

    def check_schedule(self, pm, result, seed: int) -> None:
        """BDMC on simulated data at the SMC's cost (``ModelAIS.check_schedule``): forward and reverse AIS with
        ``num_runs`` chains on the longest ladder the batches chose, refined to ``num_particles`` x ``num_moves``
        times its steps (the same log-density evaluations per example as the SMC runs), so a small gap says that
        this much work per example resolves the posterior on data from the model."""
        longest = SMCLadder.of(max(self.ladders, key=len))
        steps = longest.pilot_steps * self.sampler.num_particles * self.sampler.num_moves
        self.num_betas, self.betas, self.schedule = steps, longest.betas(steps), "linear"
        super().check_schedule(pm, result, seed)
        result.extras["bdmc_num_betas"] = steps

    def bdmc(self, **settings):
        bdmc = super().bdmc(**settings)
        bdmc.betas = self.betas
        return bdmc

    def settings(self, pm=None) -> dict:
        out = super().settings(pm)
        steps = [len(b) - 1 for b in self.ladders]
        out.update({"schedule": "smc", "num_betas": max(steps) if steps else None, "num_runs": self.num_runs,
                    "num_particles": self.sampler.num_particles, "cess": self.sampler.cess,
                    "resampling_events": self.events})
        out.pop("num_chains", None)
        return out
