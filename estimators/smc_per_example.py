"""``estimator=smc`` per example: adaptive tempered SMC (``nvil.estimators.smc``) from a base density to each
example's posterior, ``num_runs`` independent runs of ``num_particles`` particles per example, each run's estimate
unbiased for p(x) (for the built-in nets, for sum_h P*(v, h)), certified as the per-example AIS of the same path.

- ``ModelSMC``: a model whose latents are integrated out through the protocol (a user's model, the VAE, a Gaussian
  net), along ``nvil.estimators.model_paths.ModelPath`` (HMC, Gibbs or Metropolis flips);
- ``PosteriorSMC``: a built-in net's binary latents (SBN, fDARN, DBN), from Q(h | v) along
  ``nvil.estimators.ais_posterior.PosteriorPath`` (sequential Gibbs), the DBN's top log Z as ``ais_posterior``'s.
"""

from __future__ import annotations

import torch

from nvil.core.ops import log_mean_exp
from nvil.estimators.ais_per_example import ModelAIS
from nvil.estimators.annealing import ais
from nvil.estimators.ais_posterior import AISPosterior, PosteriorPath
from nvil.estimators.base import NO_PROGRESS, BatchProgress
from nvil.estimators.latent_model import LatentModel
from nvil.estimators.model_paths import ModelPath, fixed_kernel_path
from nvil.estimators.settings import LOG_Z, LogZSettings
from nvil.estimators.smc import SMCLadder, SMCSampler, adaptive_betas, group_log_z, smc


def weighted_reverse(log_w: torch.Tensor, log_w_rev: torch.Tensor, groups: int, runs: int) -> torch.Tensor:
    """Each example's log p(x) from above, from reverse runs started at weighted SMC particles: per run, the
    particles' normalised weights times exp(log w_rev) estimate 1 / p(x); their mean over the ``runs`` runs of an
    example, log'd and negated. ``log_w``, ``log_w_rev``: [groups x particles], group-major; [groups / runs]."""
    w = torch.log_softmax(log_w.double().view(groups, -1), 1)
    per_run = torch.logsumexp(w + log_w_rev.double().view(groups, -1), 1)
    return -log_mean_exp(per_run.view(-1, runs), 1)


class ModelSMC(ModelAIS):
    """``estimator=smc`` on a model whose latents are integrated out (a user's model, the VAE, a Gaussian net: the
    route of ``nvil.estimators.ROUTES``): per example, ``num_runs`` independent SMC runs of
    ``num_particles`` particles from the base (``start``: prior or proposal) to the posterior along
    ``nvil.estimators.model_paths.ModelPath``. Per batch, a pilot system (``pilot_runs`` runs per example, its
    HMC chains adapting their own step sizes) chooses one ladder by the conditional ESS share ``cess`` in the
    example that needs the smallest steps; for continuous z the step sizes are then fixed on that ladder by the
    pilot of ``estimator=ais`` (``fixed_kernel_path``), and the runs walk it with fresh particles, resampling a run
    whose ESS falls below ``resample_ess`` and moving every particle ``num_moves`` times per beta (a Gibbs scan,
    ``num_latent`` Metropolis flips, or an HMC move of ``num_leapfrog`` steps). Each run's estimate is unbiased for
    p(x); the certificate is ``estimator=ais``'s over the runs (per-example ESS, run spread, above IWAE, and BDMC on
    simulated data by AIS on the SMC ladder), and, with ``reverse``, ``reverse_order`` against reverse AIS from the
    weighted final particles along the same ladder (``weighted_reverse``)."""

    name = "smc"
    runs_name = "num_runs"

    def __init__(self, *, num_particles: int = 16, num_runs: int = 4, cess: float = 0.9, resample_ess: float = 0.5,
                 num_moves: int = 1, max_betas: int = 100_000, pilot_runs: int = 1, start: str | None = None,
                 batch_size: int = 50, num_leapfrog: int = 10, step_size: float = 0.05, target_accept: float = 0.65,
                 max_step_size: float | None = 10.0, adapt: bool = True, pilot_chains: int = 2, moves: str = "gibbs",
                 num_flips: int = 1, iwae_samples: int = 1000, num_simulated: int = 50, max_gap: float = 1.0,
                 reverse: bool = True, accel: str = "none", min_example_ess: float | None = None) -> None:
        self.sampler = SMCSampler(num_particles, num_runs, cess, resample_ess, num_moves, max_betas, pilot_runs)
        super().__init__(num_chains=self.sampler.num_runs, start=start, batch_size=batch_size,
                         num_leapfrog=num_leapfrog, step_size=step_size, target_accept=target_accept,
                         max_step_size=max_step_size, adapt=adapt, pilot_chains=pilot_chains, moves=moves,
                         num_flips=num_flips, iwae_samples=iwae_samples, num_simulated=num_simulated,
                         max_gap=max_gap, reverse=reverse, accel=accel, min_example_ess=min_example_ess)
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
        progress.plan((3 if self.reverse else 2) * (len(betas) - 1))
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
        if self.reverse:  # back from the weighted final particles along the same ladder and kernels (ModelAIS)
            back = path.state(final.z, final.step_size, torch.zeros_like(final.accept_sum))
            log_w_rev, _ = ais(path, back, betas.flip(0), generator, on_step=lambda k, inc: progress.advance())
            self.reverse_upper.append(weighted_reverse(log_w, log_w_rev, x.shape[0], runs).cpu())
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


class PosteriorSMC(AISPosterior):
    """``estimator=smc`` on a built-in net with binary latents (the module docstring): per example, ``num_runs``
    SMC runs of ``num_particles`` particles from Q(h | v) to P(h | v) with sequential Gibbs (``num_moves`` sweeps
    per beta) on the ladder a pilot of ``pilot_runs`` runs per example chose by the conditional ESS share ``cess``
    (one ladder per batch, in its hardest example), resampling a run whose ESS falls below ``resample_ess``; the
    checks of ``ais_posterior`` over the runs."""

    name = "smc"

    def __init__(self, *, num_particles: int = 16, num_runs: int = 10, cess: float = 0.9, resample_ess: float = 0.5,
                 num_moves: int = 1, max_betas: int = 100_000, pilot_runs: int = 1, batch_size: int = 50,
                 accel: str = "auto", log_z: LogZSettings | dict = LOG_Z, min_example_ess: float | None = None) -> None:
        self.sampler = SMCSampler(num_particles, num_runs, cess, resample_ess, num_moves, max_betas, pilot_runs)
        super().__init__(num_runs=self.sampler.num_runs, batch_size=batch_size, accel=accel, log_z=log_z,
                         min_example_ess=min_example_ess)
        self.ladders: list[torch.Tensor] = []
        self.events = 0

    def settings(self) -> dict:
        steps = [len(b) - 1 for b in self.ladders]
        return {"schedule": "smc", "num_betas": max(steps) if steps else None, "num_particles": self.sampler.num_particles,
                "cess": self.sampler.cess, "resampling_events": self.events}

    def run_batch(self, lm: LatentModel, x: torch.Tensor, generator,
                  progress: BatchProgress = NO_PROGRESS) -> torch.Tensor:
        s, n = self.sampler, self.sampler.num_particles
        pilot_rows = x[::self.num_runs].repeat_interleave(s.pilot_runs * n, 0)
        pilot = PosteriorPath(lm.joint(pilot_rows), lm.q_density(pilot_rows), self.accel)
        betas = adaptive_betas(pilot, pilot.state(lm.sample_q(pilot_rows, generator)), pilot_rows.shape[0] // n,
                               target=s.cess, resample_ess=s.resample_ess, num_moves=s.num_moves,
                               max_betas=s.max_betas, generator=generator)
        progress.plan(len(betas) - 1)
        rows = x.repeat_interleave(n, 0)
        path = PosteriorPath(lm.joint(rows), lm.q_density(rows), self.accel)
        log_w, _, events = smc(path, path.state(lm.sample_q(rows, generator)), betas, x.shape[0],
                               resample_ess=s.resample_ess, num_moves=s.num_moves, generator=generator,
                               on_step=lambda k, inc: progress.advance())
        self.ladders.append(betas)
        self.events += events
        return group_log_z(log_w, x.shape[0])
