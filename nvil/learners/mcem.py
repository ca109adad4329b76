"""Monte Carlo EM for Gaussian belief nets with a Hybrid Monte Carlo E-step (Wei & Tanner 1990; Kingma 2013, Sec. 4.1).

Every training example owns a persistent chain over its latent state, in the model's form (eps in auxiliary
form, z in centred form); the chains live in one [num_train, n_latent] tensor, travel in checkpoints and resume
exactly. One iteration on a minibatch of examples:

- E-step: ``e_steps`` HMC transitions (``num_leapfrog`` leapfrog steps each) on the minibatch's chains, all in
  one batched call, targeting p(x, s | theta). The step size is the paper's fixed 0.01, or per chain by dual
  averaging towards ``target_accept`` (Hoffman & Gelman 2014, Alg. 5).
- M-step: ``m_steps`` Adagrad steps on theta ascending mean log p(x, s | theta) + log p(theta) / N with the
  chains' states held fixed (MAP with a Gaussian prior N(0, prior_std^2) on weights and biases).

In auxiliary form the M-step moves z(eps) with theta; in centred form z stays where the sampler left it. That is
the whole difference between the two forms in training, so they compare directly (bench/auxiliary_vs_centred.py).

``trainer.accel=compile`` (or ``cudagraphs``) compiles the E-step's gradient of log p(x, s) in s (HMC's target,
``nvil.mcmc.hmc.Accelerated``) and the M-step's objective, forward and backward (``nvil.backend.accel.accelerate``); the
transitions, their random draws and the optimiser stay eager, so the random stream and the chains are the same in
every mode (up to float rounding). ``auto`` and ``native`` leave both eager: there is no C kernel here, and on a CPU
the compilation costs more than it gains (the E-step's gradient is bound by its products; the M-step gains little).

Under data parallelism each rank moves the chains of its share of the minibatch, then the ranks exchange the
moved rows, so every rank holds the whole table (and rank 0's checkpoint is complete).

``learner=map_latents`` (``MAPLatents``) treats the latents as parameters instead: its E-step is plain gradient
ascent on log p(x, s) in s (Kingma 2013, Sec. 4; Neal & Hinton 1998), which optimises a bound and may overfit.
"""

from __future__ import annotations

import torch
from torch import nn

from nvil.backend.accel import accelerate, check_mode, compiled
from nvil.core import distributed
from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.learners.base import DataParallel, grad_norms
from nvil.mcmc.adapt import DualAveraging
from nvil.mcmc.hmc import HMC, differentiable
from nvil.models.protocol import CONTINUOUS_LATENTS, capable

ADAPT = ("fixed", "dual_averaging")


def _rows(state, idx):
    """The rows ``idx`` of a NamedTuple of per-chain tensors."""
    return type(state)(*(f[idx] for f in state))


def _set_rows(state, idx, new) -> None:
    for f, g in zip(state, new):
        f[idx] = g


class MCEM(DataParallel):
    per_example_state = True  # the loop passes each minibatch's training-row indices

    NAME = "mcem_hmc"

    def __init__(self, model: nn.Module, inference: nn.Module | None = None, *, device: torch.device | str = "cpu",
                 seed: int = 0, lr: float = 0.01, m_steps: int = 5, e_steps: int = 1, num_leapfrog: int = 5,
                 step_size: float = 0.01, adapt: str = "fixed", target_accept: float = 0.65, adapt_window: int = 100,
                 prior_std: float | None = 1.0) -> None:
        """Defaults: configs/learner/mcem_hmc.yaml. ``lr``: Adagrad's initial step size (M-step); ``m_steps``: Adagrad
        steps per iteration (the paper's 5); ``e_steps``: HMC transitions per chain per iteration; ``num_leapfrog``:
        leapfrog steps per transition (the paper's 5); ``step_size``: the paper's fixed 0.01, or with
        ``adapt="dual_averaging"`` the starting one; ``adapt``: fixed | dual_averaging (per chain, towards
        ``target_accept``; its gain stops falling after ``adapt_window`` updates, so it follows the drifting
        posterior); ``prior_std``: the N(0, prior_std^2) prior on weights and biases (MAP), None for maximum
        likelihood. ``device`` and ``seed``: the generator, and the chains' start (``bind_data``)."""
        super().__init__()
        if not capable(model, CONTINUOUS_LATENTS):
            raise ConfigError(f"learner={self.NAME} trains Gaussian belief nets (model=gbn or dbn_dynamic), "
                              f"not a {type(model).__name__}")
        self.model, self.device, self.seed = model, torch.device(device), seed
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adagrad([{"params": params, "name": "model"}],
                                             lr=positive_float(lr, "learner.lr"))
        self.m_steps = positive_int(m_steps, "learner.m_steps")
        self.e_steps = positive_int(e_steps, "learner.e_steps")
        self.num_leapfrog = positive_int(num_leapfrog, "learner.num_leapfrog")
        self.step_size = positive_float(step_size, "learner.step_size")
        self.adapt = adapt
        if self.adapt not in ADAPT:
            raise ConfigError(f"learner.adapt must be one of {list(ADAPT)}, got {self.adapt!r}")
        self.prior_std = None if prior_std is None else positive_float(prior_std, "learner.prior_std")
        self.dual = DualAveraging(positive_float(target_accept, "learner.target_accept"),
                                  max_count=positive_int(adapt_window, "learner.adapt_window"))
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.grad_evals = 0  # gradient evaluations of the minibatch log joint, E- and M-steps together
        self.chains: torch.Tensor | None = None
        self.accel = "none"  # the E-step target's (``accelerate``)
        self.objective = self.map_objective  # the M-step's, compiled by ``accelerate``

    def accelerate(self, mode: str, device=None, steps: int | None = None) -> "MCEM":
        """``trainer.accel``: ``compile`` / ``cudagraphs`` compile the E-step target's gradient and the M-step's
        objective (see the module's docstring); other modes leave both eager."""
        if compiled(check_mode(mode, device, "trainer.accel")):
            self.accel = mode
            self.objective = accelerate(self.map_objective, mode, device, "trainer.accel")
        return self

    # ---- per-example state ---------------------------------------------------------------------------
    @torch.no_grad()
    def bind_data(self, train: torch.Tensor) -> None:
        """One chain per training example, started from a prior draw (the same draw in either form)."""
        self.num_train = train.shape[0]
        g = torch.Generator(device=self.device).manual_seed(self.seed + 104_729)
        self.chains = self.model.sample_prior(self.num_train, g, self.device)
        self.adaptation = self.dual.init(torch.full((self.num_train,), self.step_size, device=self.device))

    # ---- one iteration ---------------------------------------------------------------------------------
    def step(self, x: torch.Tensor, diagnostics: bool = False, indices: torch.Tensor | None = None) -> dict:
        if self.chains is None or indices is None:
            raise RuntimeError("MCEM needs bind_data(train) and the minibatch's row indices")
        s, metrics = self.e_step(x, indices, diagnostics)
        if self.data_parallel:
            self.share_rows(indices)
        metrics.update(self.m_step(x, s, diagnostics))
        metrics["train/grad_evals"] = torch.tensor(float(self.grad_evals))
        return metrics

    def e_step(self, x: torch.Tensor, idx: torch.Tensor, diagnostics: bool = False) -> tuple[torch.Tensor, dict]:
        hmc = HMC(self.model.posterior(x), self.num_leapfrog, accel=self.accel)  # the net's closed-form gradient
        adaptation = _rows(self.adaptation, idx)
        step_size = self.dual.step_size(adaptation) if self.adapt == "dual_averaging" else self.step_size
        state = hmc.init(self.chains[idx])  # theta moved since this chain's last visit: its density is recomputed
        accept = divergent = 0.0
        for _ in range(self.e_steps):
            state, info = hmc.step(state, generator=self.generator, step_size=step_size)
            accept, divergent = accept + info.accept_prob, divergent + info.divergent.float()
            if self.adapt == "dual_averaging":
                adaptation = self.dual.update(adaptation, info.accept_prob)
                step_size = self.dual.step_size(adaptation)
        self.chains[idx] = state.position
        _set_rows(self.adaptation, idx, adaptation)
        self.grad_evals += 1 + self.e_steps * self.num_leapfrog
        accept = accept / self.e_steps
        metrics = {"train/log_joint": state.log_density.mean(), "mcmc/accept_rate": accept.mean(),
                   "mcmc/accept_below_0.1": (accept < 0.1).float().mean(), "mcmc/divergences": divergent.sum()}
        if diagnostics:  # a sort over the minibatch: only when the loop logs
            steps = torch.as_tensor(step_size, device=x.device).expand(x.shape[0]).float()
            q = torch.quantile(steps, torch.tensor([0.1, 0.5, 0.9], device=x.device))
            metrics.update({"mcmc/step_size_q10": q[0], "mcmc/step_size_q50": q[1], "mcmc/step_size_q90": q[2]})
        return state.position, metrics

    def distribute(self, d: distributed.Dist, device: torch.device) -> None:
        """Every rank starts from rank 0's chains (each rank drew its own in ``bind_data``)."""
        super().distribute(d, device)
        for table in (self.chains, *self.adaptation):
            distributed.broadcast_(table)

    @torch.no_grad()
    def share_rows(self, idx: torch.Tensor) -> None:
        """Every rank's moved chains (and their step-size adaptation) written into every rank's table."""
        every_idx = distributed.gather_rows(idx)
        self.chains[every_idx] = distributed.gather_rows(self.chains[idx])
        for field in self.adaptation:
            field[every_idx] = distributed.gather_rows(field[idx])

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """The M-step's objective (``map_objective``, compiled where ``accelerate`` says); DDP's wrapper calls it."""
        return self.objective(x, s)

    def map_objective(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """The M-step's objective, mean log p(x, s | theta) + log p(theta) / N."""
        objective = self.model.log_joint(x, s).mean()
        if self.prior_std is not None:
            objective = objective + self.model.log_param_prior(self.prior_std) / self.num_train
        return objective

    def m_step(self, x: torch.Tensor, s: torch.Tensor, diagnostics: bool) -> dict:
        """``m_steps`` Adagrad steps on -(mean log p(x, s | theta) + log p(theta) / N), s fixed."""
        s = s.detach()
        for _ in range(self.m_steps):
            self.optimizer.zero_grad(set_to_none=True)
            objective = self.loss_module()(x, s)
            (-objective).backward()
            self.optimizer.step()
        self.grad_evals += self.m_steps
        out = {"train/map_objective": objective.detach()}
        if diagnostics:
            out.update(grad_norms(self.optimizer))
        return out

    # ---- state for resume ------------------------------------------------------------------------------
    def learner_state(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state(),
                "grad_evals": self.grad_evals, "chains": self.chains,
                "adaptation": self.adaptation._asdict()}

    def load_learner_state(self, state: dict) -> None:
        if state["chains"].shape != self.chains.shape:
            raise ValueError(f"the checkpoint holds {tuple(state['chains'].shape)} chains, this run's data needs "
                             f"{tuple(self.chains.shape)}")
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"].cpu())
        self.grad_evals = int(state["grad_evals"])
        self.chains = state["chains"].to(self.device)
        self.adaptation = type(self.adaptation)(**{k: v.to(self.device) for k, v in state["adaptation"].items()})


class MAPLatents(MCEM):
    """``learner=map_latents``: the E-step ascends log p(x, s) in the minibatch's latents, ``e_steps`` gradient
    steps of size ``latent_lr``, instead of sampling; the M-step is MCEM's."""

    NAME = "map_latents"

    def __init__(self, model: nn.Module, inference: nn.Module | None = None, *, device: torch.device | str = "cpu",
                 seed: int = 0, lr: float = 0.01, m_steps: int = 5, e_steps: int = 1, num_leapfrog: int = 5,
                 step_size: float = 0.01, adapt: str = "fixed", target_accept: float = 0.65, adapt_window: int = 100,
                 prior_std: float | None = 1.0, latent_lr: float = 0.01) -> None:
        """MCEM's keywords (configs/learner/map_latents.yaml includes mcem_hmc.yaml; the HMC ones go unused) and
        ``latent_lr``, the E-step's gradient-ascent step size."""
        super().__init__(model, inference, device=device, seed=seed, lr=lr, m_steps=m_steps, e_steps=e_steps,
                         num_leapfrog=num_leapfrog, step_size=step_size, adapt=adapt, target_accept=target_accept,
                         adapt_window=adapt_window, prior_std=prior_std)
        self.latent_lr = positive_float(latent_lr, "learner.latent_lr")

    def e_step(self, x: torch.Tensor, idx: torch.Tensor, diagnostics: bool = False) -> tuple[torch.Tensor, dict]:
        s, posterior = self.chains[idx], differentiable(self.model.posterior(x), self.accel)
        for _ in range(self.e_steps):
            log_joint, grad = posterior.value_and_grad(s)
            s = s + self.latent_lr * grad
        self.chains[idx] = s
        self.grad_evals += self.e_steps
        return s, {"train/log_joint": log_joint.mean()}
