"""log p(x) for models with continuous latent variables (Gaussian belief nets): AIS from the prior to the
posterior with HMC transitions (Wu, Burda, Salakhutdinov & Grosse 2017), one chain per example x run.

The path tempers the likelihood, f_beta(s) = p(s) p(x | s)^beta, from the normalised prior (beta = 0, Z_0 = 1) to
the unnormalised posterior p(s) p(x | s) (beta = 1, Z_1 = p(x)); the generic loop of ``nvil.estimators.ais`` takes
each weight increment (beta_k - beta_{k-1}) log p(x | s) before the move. Each move is one HMC transition at
beta_k, with a per-chain step size adapted after every move towards an acceptance of 0.65 (Wu et al. 2017,
Sec. 5), kept within [1e-4, ``max_step_size``]. The adaptation uses only the chain's past, so every transition
still leaves its own f_beta invariant and exp(log w) stays unbiased for p(x): log p(x) is under-estimated in
expectation.

The sampler runs in the auxiliary form by default (the state is eps, the prior is N(0, I)); ``form=centred``
runs on z. Both estimate the same p(x).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from nvil.backend.accel import accelerate, check_mode, compiled
from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.estimators.annealing import ais
from nvil.estimators.annealing import schedule as schedule_betas
from nvil.estimators.base import NO_PROGRESS, BatchProgress
from nvil.estimators.per_example import PerExample
from nvil.mcmc.adapt import multiplicative_adapt
from nvil.mcmc.hmc import HMC
from nvil.models.gaussian import FORMS

CONTINUOUS_HINT = "model=gbn or dbn_dynamic"
# Upper clamp of the adapted step size: large enough not to bind (in auxiliary form the posterior's scale is at
# most the prior's, 1), only a guard against runaway growth where a direction is flat.
MAX_STEP_SIZE = 10.0


class ContinuousLatent:
    """A Gaussian net seen by a per-example estimator: the state of every chain lives in ``form``."""

    needs_log_z = False  # the prior is normalised: exp(log w) estimates p(x) itself

    def __init__(self, model, estimator: str, form: str) -> None:
        if not model.family == "continuous":
            raise ConfigError(f"estimator={estimator} integrates over continuous latent variables ({CONTINUOUS_HINT}); "
                              f"this checkpoint holds a {type(model).__name__}: use chib, ais_posterior, harmonic or "
                              "iwae for binary latents, ais or raise for Boltzmann machines")
        if form not in FORMS:
            raise ConfigError(f"estimator.form must be one of {list(FORMS)}, got {form!r}")
        self.model, self.form = model, form

    def log_prior(self, state):
        return self.model.log_prior(state, self.form)

    def log_likelihood(self, x, state):
        return self.model.log_likelihood(x, state, self.form)

    def log_joint(self, x, state):
        return self.model.log_joint(x, state, self.form)

    def posterior(self, x):
        """log p(s) + log p(x | s) with its closed-form gradient (``GaussianNet.posterior``); ``tempered(beta)``."""
        return self.model.posterior(x, self.form)

    def sample_prior(self, n: int, generator, device):
        return self.model.sample_prior(n, generator, device, self.form)


class PathState(NamedTuple):
    position: torch.Tensor   # [chains, n_latent]
    log_prior: torch.Tensor  # log p(s)
    log_lik: torch.Tensor    # log p(x | s)
    step_size: torch.Tensor  # [chains], adapted
    accept_sum: torch.Tensor  # [chains], sum of acceptance probabilities so far (for the report)


class PriorPosteriorPath:
    """f_beta(s) = p(s) p(x | s)^beta for each chain's own x; HMC moves with per-chain step sizes."""

    def __init__(self, lm: ContinuousLatent, x: torch.Tensor, num_leapfrog: int, target_accept: float, adapt: bool,
                 accel: str = "none", max_step_size: float | None = MAX_STEP_SIZE):
        self.lm, self.x = lm, x
        self.num_leapfrog, self.target_accept, self.adapt = num_leapfrog, target_accept, adapt
        self.max_step_size = max_step_size
        # Compiled (with accel) once per path, beta a tensor argument so that a new beta is not a new graph.
        self._tempered = accelerate(self._tempered_log_density, accel, x.device, "estimator.accel")
        # Eager, the net's closed-form gradient instead of autograd (V^T x computed once per path).
        self._posterior = None if compiled(accel) else lm.posterior(x)

    def _tempered_log_density(self, s: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        return self.lm.log_prior(s) + beta * self.lm.log_likelihood(self.x, s)

    @torch.no_grad()
    def state(self, position, step_size, accept_sum) -> PathState:
        return PathState(position, self.lm.log_prior(position), self.lm.log_likelihood(self.x, position), step_size, accept_sum)

    def log_f(self, state: PathState, beta: float) -> torch.Tensor:
        return state.log_prior + beta * state.log_lik

    def transition(self, state: PathState, beta: float, generator=None) -> PathState:
        beta_t = torch.tensor(beta, dtype=state.position.dtype, device=state.position.device)
        target = (lambda s: self._tempered(s, beta_t)) if self._posterior is None else self._posterior.tempered(beta_t)
        hmc = HMC(target, self.num_leapfrog)
        new, info = hmc.step(hmc.init(state.position), generator=generator, step_size=state.step_size)
        step = (multiplicative_adapt(state.step_size, info.accept_prob, self.target_accept, max_step=self.max_step_size)
                if self.adapt else state.step_size)
        return self.state(new.position, step, state.accept_sum + info.accept_prob)


def ais_hmc_log_w(lm: ContinuousLatent, x: torch.Tensor, betas: torch.Tensor, *, num_leapfrog: int = 10,
                  step_size: float = 0.05, target_accept: float = 0.65, adapt: bool = True, generator=None,
                  accel: str = "none", max_step_size: float | None = MAX_STEP_SIZE, on_step=None):
    """One AIS run per row of x: (log w [rows] float64, final PathState). ``on_step(k, increment)``: as in
    ``nvil.estimators.ais.ais`` (progress)."""
    path = PriorPosteriorPath(lm, x, num_leapfrog, target_accept, adapt, accel, max_step_size)
    n = x.shape[0]
    start = path.state(lm.sample_prior(n, generator, x.device), torch.full((n,), float(step_size), device=x.device),
                       torch.zeros(n, device=x.device))
    return ais(path, start, betas, generator, on_step=on_step)


class AISHMC(PerExample):
    """``estimator=ais_hmc``: ``num_runs`` AIS chains per example, their weights averaged (log-mean-exp)."""

    name = "ais_hmc"
    importance_runs = True  # each run's exp(log w) is an importance weight: per-example ESS over runs

    def __init__(self, *, num_betas: int = 1000, schedule: str = "sigmoid", num_runs: int = 16, num_leapfrog: int = 10,
                 step_size: float = 0.05, target_accept: float = 0.65, max_step_size: float | None = MAX_STEP_SIZE,
                 adapt: bool = True, form: str = "auxiliary", batch_size: int = 100, accel: str = "none",
                 min_example_ess: float | None = None) -> None:
        """Defaults: configs/estimator/ais_hmc.yaml. ``num_betas`` steps on the ladder ``schedule`` (sigmoid |
        linear | paper); ``num_runs``: chains per example; ``num_leapfrog``: leapfrog steps per HMC move;
        ``step_size``: the initial step size, then adapted per chain (``adapt``) towards ``target_accept`` and
        clamped at ``max_step_size`` (None: no clamp); ``form``: auxiliary (eps) | centred (z), the same p(x);
        ``batch_size``: examples per batch (chains = batch_size x num_runs); ``accel``: none | compile (the
        tempered log density compiled) | cudagraphs (CUDA only); ``min_example_ess``: as ``PerExample``."""
        super().__init__(num_runs=num_runs, batch_size=batch_size, min_example_ess=min_example_ess)
        self.num_betas = positive_int(num_betas, "estimator.num_betas")
        self.schedule = schedule
        self.betas = schedule_betas(self.schedule, self.num_betas)
        self.num_leapfrog = positive_int(num_leapfrog, "estimator.num_leapfrog")
        self.step_size = positive_float(step_size, "estimator.step_size")
        self.target_accept = positive_float(target_accept, "estimator.target_accept")
        self.adapt = bool(adapt)
        self.max_step_size = None if max_step_size is None else positive_float(max_step_size, "estimator.max_step_size")
        self.form = form
        self.accel = check_mode(accel, what="estimator.accel")
        self.accept: list[torch.Tensor] = []
        self.final_steps: list[torch.Tensor] = []

    def latent_model(self, model, inference):
        return ContinuousLatent(model, self.name, self.form)

    def run_batch(self, lm: ContinuousLatent, x: torch.Tensor, generator,
                  progress: BatchProgress = NO_PROGRESS) -> torch.Tensor:
        """Progress: one unit per AIS step (one HMC transition)."""
        progress.plan(len(self.betas) - 1)
        log_w, final = ais_hmc_log_w(lm, x, self.betas, num_leapfrog=self.num_leapfrog, step_size=self.step_size,
                                     target_accept=self.target_accept, adapt=self.adapt, generator=generator,
                                     accel=self.accel, max_step_size=self.max_step_size,
                                     on_step=lambda k, increment: progress.advance())
        self.accept.append((final.accept_sum / max(1, len(self.betas) - 2)).cpu())
        self.final_steps.append(final.step_size.cpu())
        return log_w

    def settings(self) -> dict:
        out = {"num_betas": self.num_betas, "schedule": self.schedule, "num_leapfrog": self.num_leapfrog,
               "form": self.form, "adapt": self.adapt, "max_step_size": self.max_step_size}
        if self.accept:
            accept, steps = torch.cat(self.accept), torch.cat(self.final_steps)
            q = torch.quantile(steps.double(), torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
            out.update({"accept_rate": round(accept.mean().item(), 4), "step_size_q10_q50_q90": [round(v, 5) for v in q]})
        return out
