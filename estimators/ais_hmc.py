"""log p(x) for models with continuous latent variables (Gaussian belief nets): AIS from the prior to the
posterior with HMC transitions (Wu, Burda, Salakhutdinov & Grosse 2017), one chain per example x run.

The path tempers the likelihood, f_beta(s) = p(s) p(x | s)^beta, from the normalised prior (beta = 0, Z_0 = 1) to
the unnormalised posterior p(s) p(x | s) (beta = 1, Z_1 = p(x)); the generic loop of ``nvil.estimators.ais`` takes
each weight increment (beta_k - beta_{k-1}) log p(x | s) before the move. Each move is one HMC transition at
beta_k (Neal 2011, Sec. 5.3.2). exp(log w) is unbiased for p(x) (Neal 2001) when the kernel of every move
leaves its f_beta invariant and is chosen independently of the chain it moves, so log p(x) is under-estimated in
expectation (Jensen).

Step sizes (``nvil.estimators.model_paths.pilot_steps``): a pilot AIS run of ``pilot_chains`` chains per example, each with its own step
size multiplied by 1.02 or 0.98 after every move towards an acceptance of ``target_accept`` (Wu et al. 2017,
Sec. 5), kept within [1e-4, ``max_step_size``]; per example and beta, the geometric mean over its pilot chains is
the step size every main chain of that example uses at that beta. The pilot chains are then thrown away: the
step sizes depend on x and the pilot's random numbers only, so each main move is a fixed f_beta-invariant kernel.
Adapting on the main chain itself breaks this: the step size of move k is set from the acceptance of move k - 1,
which depends on the state move k starts from. On a linear-Gaussian net (2 latents, 5 visibles, sigma 0.5;
1,000 sigmoid betas, 10 leapfrog steps, 600 examples x 16 chains) such chains average exp(log w) / p(x) =
1.072 +- 0.004 and their per-example log-mean-exp sits 0.066 +- 0.003 nats above log p(x), a "lower bound" above
the truth; with 3 leapfrog steps the error changes sign (0.906 +- 0.003). With pilot step sizes the average is
1.000 +- 0.004 (tests/test_ais_hmc_unbiased.py). ``adapt=false``: every move uses the constant ``step_size``,
and no pilot runs.

The path is the one every AIS over a model's latent variables runs, ``nvil.estimators.model_paths.ModelPath``, with
the prior as its base; the net declares ``closed_form_gradient``, so its leapfrog steps use ``GaussianNet.posterior``
instead of autograd (``nvil.backend.registry``). The sampler runs in the auxiliary form by default (the state is eps, the prior is N(0, I)); ``form=centred``
runs on z. Both estimate the same p(x).
"""

from __future__ import annotations

import torch

from nvil.backend.accel import check_mode
from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.estimators.annealing import ais
from nvil.estimators.annealing import schedule as schedule_betas
from nvil.estimators.base import NO_PROGRESS, BatchProgress
from nvil.estimators.model_paths import ModelPath, pilot_steps
from nvil.estimators.per_example import PerExample
from nvil.models.gaussian import FORMS
from nvil.models.protocol import CONTINUOUS_LATENTS, Latent, ProtocolModel, capable

CONTINUOUS_HINT = "model=gbn or dbn_dynamic"
# Upper clamp of the adapted step size: large enough not to bind (in auxiliary form the posterior's scale is at
# most the prior's, 1), only a guard against runaway growth where a direction is flat.
MAX_STEP_SIZE = 10.0


class ContinuousLatent:
    """A Gaussian net in the sampler's ``form``, as the model protocol sees it (``nvil.models.protocol``): its
    densities, draws and closed-form gradient in that form, so the one AIS path (``ModelPath``) runs on it."""

    needs_log_z = False  # the prior is normalised: exp(log w) estimates p(x) itself

    def __init__(self, model, estimator: str, form: str) -> None:
        if not capable(model, CONTINUOUS_LATENTS):
            raise ConfigError(f"estimator={estimator} integrates over continuous latent variables ({CONTINUOUS_HINT}); "
                              f"this checkpoint holds a {type(model).__name__}: use chib, ais_posterior, harmonic or "
                              "iwae for binary latents, ais or raise for Boltzmann machines")
        if form not in FORMS:
            raise ConfigError(f"estimator.form must be one of {list(FORMS)}, got {form!r}")
        self.model, self.form = model, form
        self.latent = Latent.continuous(model.n_latent)
        self.capabilities = model.capabilities

    def log_prior(self, state):
        return self.model.log_prior(state, self.form)

    def log_likelihood(self, x, state):
        return self.model.log_likelihood(x, state, self.form)

    def log_joint(self, x, state):
        return self.model.log_joint(x, state, self.form)

    def posterior(self, x):
        """log p(s) + log p(x | s) with its closed-form gradient (``GaussianNet.posterior``); ``tempered(beta)``."""
        return self.model.posterior(x, self.form)

    def sample_prior(self, n: int, generator, device=None):
        return self.model.sample_prior(n, generator, device or generator.device, self.form)

    def sample_likelihood(self, state, generator):
        if self.form != self.model.form:
            state = self.model.to_centred(state) if self.form == "auxiliary" else self.model.to_auxiliary(state)
        return self.model.sample_likelihood(state, generator)


def fixed_kernel_path(lm: ContinuousLatent, x: torch.Tensor, betas: torch.Tensor, *, chains: int = 1,
                      pilot_chains: int = 2, num_leapfrog: int = 10, step_size: float = 0.05,
                      target_accept: float = 0.65, adapt: bool = True, generator=None, accel: str = "none",
                      max_step_size: float | None = MAX_STEP_SIZE, on_step=None) -> ModelPath:
    """The prior-to-posterior path for ``x`` (``chains`` rows per example, example-major) along ``ModelPath`` whose
    every move is a fixed f_beta-invariant HMC kernel: step sizes from a pilot run (``model_paths.pilot_steps``)
    where ``adapt``, else ``step_size`` throughout. Used in either direction (forward AIS, and reverse AIS in
    ``nvil.estimators.reverse_ais.BDMC``)."""
    if x.shape[0] % chains:
        raise ValueError(f"{x.shape[0]} rows are not whole examples of {chains} chains each")
    pm = ProtocolModel(lm, "the Gaussian net")
    settings = {"num_leapfrog": num_leapfrog, "target_accept": target_accept, "max_step_size": max_step_size,
                "accel": accel}
    if adapt:
        steps = pilot_steps(pm, x[::chains], "prior", betas, pilot_chains, step_size, chains, generator, on_step,
                            **settings)
    else:
        constant = torch.full((x.shape[0],), float(step_size), device=x.device)
        steps = {beta: constant for beta in betas.tolist()}
    return ModelPath(pm, x, pm.base("prior", x), adapt=False, steps=steps, **settings)


def ais_hmc_log_w(lm: ContinuousLatent, x: torch.Tensor, betas: torch.Tensor, *, chains: int = 1,
                  pilot_chains: int = 2, num_leapfrog: int = 10, step_size: float = 0.05, target_accept: float = 0.65,
                  adapt: bool = True, generator=None, accel: str = "none",
                  max_step_size: float | None = MAX_STEP_SIZE, on_step=None):
    """One AIS run per row of x (``chains`` rows per example, example-major; each row its own example by
    default), its step sizes from ``fixed_kernel_path``: (log w [rows] float64, final ``ModelState``).
    ``on_step(k, increment)``: as in ``nvil.estimators.annealing.ais`` (progress), over the pilot's steps, then
    the run's."""
    path = fixed_kernel_path(lm, x, betas, chains=chains, pilot_chains=pilot_chains, num_leapfrog=num_leapfrog,
                             step_size=step_size, target_accept=target_accept, adapt=adapt, generator=generator,
                             accel=accel, max_step_size=max_step_size, on_step=on_step)
    return ais(path, path.start(generator, step_size), betas, generator, on_step=on_step)


class AISHMC(PerExample):
    """``estimator=ais_hmc``: ``num_runs`` AIS chains per example, their weights averaged (log-mean-exp)."""

    name = "ais_hmc"
    importance_runs = True  # each run's exp(log w) is an importance weight: per-example ESS over runs

    def __init__(self, *, num_betas: int = 1000, schedule: str = "sigmoid", num_runs: int = 16, num_leapfrog: int = 10,
                 step_size: float = 0.05, target_accept: float = 0.65, max_step_size: float | None = MAX_STEP_SIZE,
                 adapt: bool = True, pilot_chains: int = 2, form: str = "auxiliary", batch_size: int = 100,
                 accel: str = "none", min_example_ess: float | None = None) -> None:
        """Defaults: configs/estimator/ais_hmc.yaml. ``num_betas`` steps on the ladder ``schedule`` (sigmoid |
        linear | paper); ``num_runs``: chains per example; ``num_leapfrog``: leapfrog steps per HMC move;
        ``step_size``: the initial step size of a pilot run of ``pilot_chains`` chains per example adapting
        towards ``target_accept``, clamped at ``max_step_size`` (None: no clamp), whose per-example geometric
        means the main chains use (``nvil.estimators.model_paths.pilot_steps``); ``adapt=False``: ``step_size`` throughout; ``form``:
        auxiliary (eps) | centred (z), the same p(x);
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
        self.pilot_chains = positive_int(pilot_chains, "estimator.pilot_chains")
        self.max_step_size = None if max_step_size is None else positive_float(max_step_size, "estimator.max_step_size")
        self.form = form
        self.accel = check_mode(accel, what="estimator.accel")
        self.accept: list[torch.Tensor] = []
        self.final_steps: list[torch.Tensor] = []

    def latent_model(self, model, inference):
        return ContinuousLatent(model, self.name, self.form)

    def run_batch(self, lm: ContinuousLatent, x: torch.Tensor, generator,
                  progress: BatchProgress = NO_PROGRESS) -> torch.Tensor:
        """Progress: one unit per AIS step (one HMC transition) of the pilot run and of the main run."""
        progress.plan((1 + self.adapt) * (len(self.betas) - 1))
        log_w, final = ais_hmc_log_w(lm, x, self.betas, chains=self.num_runs, pilot_chains=self.pilot_chains,
                                     num_leapfrog=self.num_leapfrog, step_size=self.step_size,
                                     target_accept=self.target_accept, adapt=self.adapt, generator=generator,
                                     accel=self.accel, max_step_size=self.max_step_size,
                                     on_step=lambda k, increment: progress.advance())
        self.accept.append((final.accept_sum / max(1, len(self.betas) - 2)).cpu())
        self.final_steps.append(final.step_size.cpu())
        return log_w

    def settings(self) -> dict:
        out = {"num_betas": self.num_betas, "schedule": self.schedule, "num_leapfrog": self.num_leapfrog,
               "form": self.form, "adapt": self.adapt, "pilot_chains": self.pilot_chains,
               "max_step_size": self.max_step_size}
        if self.accept:
            accept, steps = torch.cat(self.accept), torch.cat(self.final_steps)
            q = torch.quantile(steps.double(), torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
            out.update({"accept_rate": round(accept.mean().item(), 4), "step_size_q10_q50_q90": [round(v, 5) for v in q]})
        return out
