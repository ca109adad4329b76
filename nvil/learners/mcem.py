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
    """Monte Carlo EM for a Gaussian belief net: an HMC E-step on persistent per-example chains, an Adagrad M-step.

    Every training example owns a persistent chain over its latent state s (``bind_data``; the module's
    docstring). One iteration on a minibatch: ``e_steps`` HMC transitions of its chains targeting p(x, s | theta)
    (``e_step``), then ``m_steps`` Adagrad steps on theta ascending mean log p(x, s | theta) + log p(theta) / N with
    s held fixed (``m_step``; Wei & Tanner 1990, Kingma 2013, Sec. 4.1). Defaults: configs/learner/mcem_hmc.yaml.
    ``device`` and ``seed``: the generator, and the chains' start (``bind_data``).

    Parameters
    ----------
    model : torch.nn.Module
        The model, one with continuous latents (the ``continuous_latents`` capability: model=gbn or dbn_dynamic,
        ``nvil.models.gaussian``); trained in place.
    inference : None, default None
        Unused (the E-step samples the posterior itself); taken so every learner is called alike.
    device : torch.device or str, default "cpu"
        Device of the generator and of the chains.
    seed : int, default 0
        Seed of the learner's generator (the HMC draws); the chains start from a prior draw seeded
        ``seed + 104729``.
    lr : float, default 0.01
        Adagrad's initial step size (M-step); positive.
    m_steps : int, default 5
        Adagrad steps per iteration (the paper's 5); positive.
    e_steps : int, default 1
        HMC transitions per chain per iteration; positive.
    num_leapfrog : int, default 5
        Leapfrog steps per transition (the paper's 5); positive.
    step_size : float, default 0.01
        The leapfrog step size: the paper's fixed 0.01, or with ``adapt="dual_averaging"`` the starting one;
        positive.
    adapt : str, default "fixed"
        ``fixed`` | ``dual_averaging``: per chain, towards ``target_accept`` (Hoffman & Gelman 2014, Alg. 5).
    target_accept : float, default 0.65
        Dual averaging's target acceptance probability delta; positive.
    adapt_window : int, default 100
        Updates after which dual averaging's gain stops falling, so it follows the drifting posterior; positive.
    prior_std : float or None, default 1.0
        The N(0, prior_std^2) prior on weights and biases (MAP); None for maximum likelihood.

    Raises
    ------
    nvil.core.errors.ConfigError
        If ``model`` has no continuous latents, if a rate, size or count is not positive, or if ``adapt`` is not
        fixed or dual_averaging.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import GaussianBeliefNet
    >>> from nvil.learners import MCEM
    >>> gbn = GaussianBeliefNet(6, [3])
    >>> x = (torch.rand(8, 6) < 0.5).float()
    >>> learner = MCEM(gbn, None, e_steps=2)
    >>> learner.bind_data(x)                                # one chain per training row
    >>> learner.chains.shape
    torch.Size([8, 3])
    >>> metrics = learner.step(x[:4], indices=torch.arange(4))
    >>> sorted(metrics)
    ['mcmc/accept_below_0.1', 'mcmc/accept_rate', 'mcmc/divergences', 'train/grad_evals', 'train/log_joint',
     'train/map_objective']
    >>> metrics["train/grad_evals"].item()                  # 1 + e_steps * num_leapfrog, then m_steps
    16.0
    """

    per_example_state = True  # the loop passes each minibatch's training-row indices

    NAME = "mcem_hmc"

    def __init__(self, model: nn.Module, inference: nn.Module | None = None, *, device: torch.device | str = "cpu",
                 seed: int = 0, lr: float = 0.01, m_steps: int = 5, e_steps: int = 1, num_leapfrog: int = 5,
                 step_size: float = 0.01, adapt: str = "fixed", target_accept: float = 0.65, adapt_window: int = 100,
                 prior_std: float | None = 1.0) -> None:
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
        """Apply ``trainer.accel``: ``compile`` / ``cudagraphs`` compile the E-step's gradient and the M-step objective.

        See the module's docstring; other modes leave both eager. The random stream is the same in every mode.

        Parameters
        ----------
        mode : str
            ``trainer.accel``: none | compile | cudagraphs | native | auto (``nvil.backend.accel``).
        device : torch.device or str or None, default None
            The run's device, checked against ``mode`` (None: wherever CUDA is available).
        steps : int or None, default None
            The run's length where known; unused here.

        Returns
        -------
        MCEM
            The learner itself.

        Raises
        ------
        nvil.core.errors.ConfigError
            If ``mode`` is unknown or impossible on ``device``.
        """
        if compiled(check_mode(mode, device, "trainer.accel")):
            self.accel = mode
            self.objective = accelerate(self.map_objective, mode, device, "trainer.accel")
        return self

    # ---- per-example state ---------------------------------------------------------------------------
    @torch.no_grad()
    def bind_data(self, train: torch.Tensor) -> None:
        """One chain per training example, started from a prior draw (the same draw in either form).

        Also starts each chain's step-size adaptation at ``step_size``. Called before a resume restores the chains.

        Parameters
        ----------
        train : torch.Tensor
            ``(num_train, n_visible)``: the training set, in the row order of ``step``'s ``indices``; N =
            ``num_train`` scales the prior in the M-step's objective.
        """
        self.num_train = train.shape[0]
        g = torch.Generator(device=self.device).manual_seed(self.seed + 104_729)
        self.chains = self.model.sample_prior(self.num_train, g, self.device)
        self.adaptation = self.dual.init(torch.full((self.num_train,), self.step_size, device=self.device))

    # ---- one iteration ---------------------------------------------------------------------------------
    def step(self, x: torch.Tensor, diagnostics: bool = False, indices: torch.Tensor | None = None) -> dict:
        """One MCEM iteration on the minibatch ``x``: the E-step on its rows' chains, then the M-step.

        Under data parallelism the ranks exchange the moved rows between the two (``share_rows``).

        Parameters
        ----------
        x : torch.Tensor
            ``(batch, n_visible)`` training rows.
        diagnostics : bool, default False
            A logging step: add the step sizes' quantiles and the gradient norms.
        indices : torch.Tensor or None, default None
            ``(batch,)``: the rows of ``x`` in the training set (``bind_data``'s), whose chains move; required.

        Returns
        -------
        dict of str to torch.Tensor
            ``e_step``'s and ``m_step``'s metrics and ``train/grad_evals``, the gradient evaluations of the
            minibatch log joint so far.

        Raises
        ------
        RuntimeError
            If ``bind_data`` has not been called or ``indices`` is None.
        """
        if self.chains is None or indices is None:
            raise RuntimeError("MCEM needs bind_data(train) and the minibatch's row indices")
        s, metrics = self.e_step(x, indices, diagnostics)
        if self.data_parallel:
            self.share_rows(indices)
        metrics.update(self.m_step(x, s, diagnostics))
        metrics["train/grad_evals"] = torch.tensor(float(self.grad_evals))
        return metrics

    def e_step(self, x: torch.Tensor, idx: torch.Tensor, diagnostics: bool = False) -> tuple[torch.Tensor, dict]:
        """The E-step: ``e_steps`` HMC transitions of the chains ``idx``, all in one batched call, targeting p(x, s).

        The step size is the fixed ``step_size`` or each chain's dual-averaging one, adapted after every
        transition; the chains and their adaptation are written back into the tables.

        Parameters
        ----------
        x : torch.Tensor
            ``(batch, n_visible)``: the minibatch.
        idx : torch.Tensor
            ``(batch,)``: its rows in the training set, the chains that move.
        diagnostics : bool, default False
            A logging step: add the quantiles of the step sizes (a sort over the minibatch).

        Returns
        -------
        tuple of torch.Tensor and dict
            The chains' new states s, ``(batch, n_latent)``, and the metrics: ``train/log_joint`` (mean log p(x, s)),
            ``mcmc/accept_rate``, ``mcmc/accept_below_0.1``, ``mcmc/divergences`` and, at a logging step,
            ``mcmc/step_size_q10`` / ``q50`` / ``q90``.
        """
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
        """Make the learner one rank of a data-parallel run; every rank starts from rank 0's chains.

        Each rank drew its own chains in ``bind_data``; they and their adaptation are overwritten by rank 0's.

        Parameters
        ----------
        d : nvil.core.distributed.Dist
            This process's rank and the world size.
        device : torch.device
            This rank's device.
        """
        super().distribute(d, device)
        for table in (self.chains, *self.adaptation):
            distributed.broadcast_(table)

    @torch.no_grad()
    def share_rows(self, idx: torch.Tensor) -> None:
        """Every rank's moved chains (and their step-size adaptation) written into every rank's table.

        Parameters
        ----------
        idx : torch.Tensor
            ``(batch,)``: this rank's rows of the minibatch, whose chains it moved.
        """
        every_idx = distributed.gather_rows(idx)
        self.chains[every_idx] = distributed.gather_rows(self.chains[idx])
        for field in self.adaptation:
            field[every_idx] = distributed.gather_rows(field[idx])

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """The M-step's objective (``map_objective``, compiled where ``accelerate`` says); DDP's wrapper calls it.

        Parameters
        ----------
        x : torch.Tensor
            ``(batch, n_visible)``: the minibatch.
        s : torch.Tensor
            ``(batch, n_latent)``: its chains' states, held fixed.

        Returns
        -------
        torch.Tensor
            The scalar objective, with its autograd graph in theta.
        """
        return self.objective(x, s)

    def map_objective(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """The M-step's objective, mean log p(x, s | theta) + log p(theta) / N.

        N is the training set's size; without ``prior_std`` the prior term is left out (maximum likelihood).

        Parameters
        ----------
        x : torch.Tensor
            ``(batch, n_visible)``: the minibatch.
        s : torch.Tensor
            ``(batch, n_latent)``: its latent states.

        Returns
        -------
        torch.Tensor
            The scalar objective, with its autograd graph in theta.
        """
        objective = self.model.log_joint(x, s).mean()
        if self.prior_std is not None:
            objective = objective + self.model.log_param_prior(self.prior_std) / self.num_train
        return objective

    def m_step(self, x: torch.Tensor, s: torch.Tensor, diagnostics: bool) -> dict:
        """The M-step: ``m_steps`` Adagrad steps on -(mean log p(x, s | theta) + log p(theta) / N), s fixed.

        Parameters
        ----------
        x : torch.Tensor
            ``(batch, n_visible)``: the minibatch.
        s : torch.Tensor
            ``(batch, n_latent)``: the E-step's states (detached: in auxiliary form z(eps) still moves with theta).
        diagnostics : bool
            A logging step: add the gradient norms.

        Returns
        -------
        dict of str to torch.Tensor
            ``train/map_objective`` (the objective before the last Adagrad step) and, at a logging step,
            ``grad_norm/model``.
        """
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
        """Everything a resumed run needs beyond the model: optimiser, generator, chains and their adaptation.

        Returns
        -------
        dict
            ``optimizer``, ``generator``, ``grad_evals``, ``chains`` (``(num_train, n_latent)``) and ``adaptation``
            (the dual-averaging state's fields, one row per chain).
        """
        return {"optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state(),
                "grad_evals": self.grad_evals, "chains": self.chains,
                "adaptation": self.adaptation._asdict()}

    def load_learner_state(self, state: dict) -> None:
        """Restore what ``learner_state`` returned (after ``bind_data``), so the run resumes exactly.

        Parameters
        ----------
        state : dict
            A ``learner_state()`` dictionary; its tensors are moved to the learner's device.

        Raises
        ------
        ValueError
            If the checkpoint's chains do not match this run's training set (another number of rows or latents).
        """
        if state["chains"].shape != self.chains.shape:
            raise ValueError(f"the checkpoint holds {tuple(state['chains'].shape)} chains, this run's data needs "
                             f"{tuple(self.chains.shape)}")
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"].cpu())
        self.grad_evals = int(state["grad_evals"])
        self.chains = state["chains"].to(self.device)
        self.adaptation = type(self.adaptation)(**{k: v.to(self.device) for k, v in state["adaptation"].items()})


class MAPLatents(MCEM):
    """``learner=map_latents``: MCEM whose E-step ascends log p(x, s) in the minibatch's latents instead of sampling.

    The E-step takes ``e_steps`` gradient steps of size ``latent_lr``; the M-step is MCEM's. The latents are
    treated as parameters (Kingma 2013, Sec. 4; Neal & Hinton 1998), which optimises a bound and may overfit.
    MCEM's keywords (configs/learner/map_latents.yaml includes mcem_hmc.yaml; the HMC ones go unused) and
    ``latent_lr``, the E-step's gradient-ascent step size.

    Parameters
    ----------
    model : torch.nn.Module
        The model, one with continuous latents (model=gbn or dbn_dynamic); trained in place.
    inference : None, default None
        Unused; taken so every learner is called alike.
    device : torch.device or str, default "cpu"
        Device of the generator and of the latents' table.
    seed : int, default 0
        Seed of the learner's generator; the latents start from a prior draw seeded ``seed + 104729``.
    lr : float, default 0.01
        Adagrad's initial step size (M-step); positive.
    m_steps : int, default 5
        Adagrad steps per iteration; positive.
    e_steps : int, default 1
        Gradient-ascent steps on the latents per iteration; positive.
    num_leapfrog : int, default 5
        Unused (MCEM's HMC setting); still checked positive.
    step_size : float, default 0.01
        Unused (MCEM's HMC setting); still checked positive.
    adapt : str, default "fixed"
        Unused (MCEM's HMC setting); still checked to be fixed or dual_averaging.
    target_accept : float, default 0.65
        Unused (MCEM's HMC setting); still checked positive.
    adapt_window : int, default 100
        Unused (MCEM's HMC setting); still checked positive.
    prior_std : float or None, default 1.0
        The N(0, prior_std^2) prior on weights and biases (MAP); None for maximum likelihood.
    latent_lr : float, default 0.01
        The E-step's gradient-ascent step size, s <- s + latent_lr * d log p(x, s) / ds; positive.

    Raises
    ------
    nvil.core.errors.ConfigError
        If ``latent_lr`` is not positive, or as ``MCEM`` refuses the model or a setting.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import GaussianBeliefNet
    >>> from nvil.learners import MAPLatents
    >>> gbn = GaussianBeliefNet(6, [3])
    >>> x = (torch.rand(8, 6) < 0.5).float()
    >>> learner = MAPLatents(gbn, None, latent_lr=0.05)
    >>> learner.bind_data(x)
    >>> metrics = learner.step(x[:4], indices=torch.arange(4))
    >>> sorted(metrics)
    ['train/grad_evals', 'train/log_joint', 'train/map_objective']
    >>> metrics["train/grad_evals"].item()                  # e_steps, then m_steps
    6.0
    """

    NAME = "map_latents"

    def __init__(self, model: nn.Module, inference: nn.Module | None = None, *, device: torch.device | str = "cpu",
                 seed: int = 0, lr: float = 0.01, m_steps: int = 5, e_steps: int = 1, num_leapfrog: int = 5,
                 step_size: float = 0.01, adapt: str = "fixed", target_accept: float = 0.65, adapt_window: int = 100,
                 prior_std: float | None = 1.0, latent_lr: float = 0.01) -> None:
        super().__init__(model, inference, device=device, seed=seed, lr=lr, m_steps=m_steps, e_steps=e_steps,
                         num_leapfrog=num_leapfrog, step_size=step_size, adapt=adapt, target_accept=target_accept,
                         adapt_window=adapt_window, prior_std=prior_std)
        self.latent_lr = positive_float(latent_lr, "learner.latent_lr")

    def e_step(self, x: torch.Tensor, idx: torch.Tensor, diagnostics: bool = False) -> tuple[torch.Tensor, dict]:
        """The E-step: ``e_steps`` gradient-ascent steps s <- s + latent_lr * d log p(x, s) / ds on the rows ``idx``.

        The new latents are written back into the table.

        Parameters
        ----------
        x : torch.Tensor
            ``(batch, n_visible)``: the minibatch.
        idx : torch.Tensor
            ``(batch,)``: its rows in the training set, the latents that move.
        diagnostics : bool, default False
            Unused (no extra metrics).

        Returns
        -------
        tuple of torch.Tensor and dict
            The new latents, ``(batch, n_latent)``, and ``{"train/log_joint": mean log p(x, s)}`` at the latents
            before the last step.
        """
        s, posterior = self.chains[idx], differentiable(self.model.posterior(x), self.accel)
        for _ in range(self.e_steps):
            log_joint, grad = posterior.value_and_grad(s)
            s = s + self.latent_lr * grad
        self.chains[idx] = s
        self.grad_evals += self.e_steps
        return s, {"train/log_joint": log_joint.mean()}
