"""Maximum-likelihood learners for Boltzmann machines. They differ only in the negative phase.

All of them follow the gradient of the average log-likelihood,
    d/dtheta mean log p(x) = -mean_data dF(x)/dtheta + E_model[dF(x)/dtheta],
with F the free energy (h summed out analytically), through the surrogate mean F(data) - mean F(negatives).
Where the negatives come from is ``nvil.learners.negative_phase`` (``PHASES``, keyed on ``learner.name``):

- ``sap``: the stochastic approximation procedure (Younes 1989; Tieleman 2008's persistent CD;
  Salakhutdinov 2009, Algorithm 1). M persistent particles, each moved by k block-Gibbs sweeps per update.
- ``trans_sap``: SAP whose particles also take one tempered-transitions run every ``tt.every`` updates
  from ``tt.start_step`` on (Salakhutdinov 2009, Sec. 3; parameters are not updated during the run).
- ``pt_sap``: the particles are the beta = 1 replicas of parallel-tempering chains.
- ``cd``: contrastive divergence, CD-k: chains restart at the minibatch and take k sweeps.
- ``exact_ml``: the exact gradient, E_model by enumeration through log Z (models with <= 20 units to sum).

The learner keeps the optimiser, the schedule of k and of the learning rate, fixed for ``schedule.t0``
updates, then a / (b + t) with t counted from the switch (the paper's schedule: 0.01 then 10 / (1000 + t) is
continuous at t0 only so), and the weight cost (``learner.weight_decay``), added to the gradient of the weights
W, U, L and never of the biases, as Salakhutdinov's ``rbm.m`` does (``weightcost * vishid``). The DBN recipe of
Salakhutdinov & Murray 2008 adds a staircase for k (``k_every``), a rate divided by k (``lr_over_k``) and rbm.m's
momentum switch (``momentum_initial`` for the first ``momentum_switch`` updates, then ``momentum``).

The surrogate's gradient is taken in closed form, from the sufficient statistics of the data and the negatives
(``nvil.models.rbm_grad``: <v p'>, <p>, <v>, ... with p = p(h | x)), for every machine that has them
(``model.closed_form_grad``: binary, Gaussian and lateral pixels, labels) and every phase; the optimiser's step is
the same. Autograd through the free energy remains the general path: other visible layers, exact ML,
data-parallel runs (whose gradients DistributedDataParallel averages in backward) and ``learner.closed_form=false``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import torch
from torch import nn

from nvil.backend.accel import check_mode
from nvil.core import distributed
from nvil.core.errors import ConfigError
from nvil.learners.base import DataParallel, grad_norms
from nvil.learners.negative_phase import PHASES
from nvil.learners.settings import PTSettings, SAPSettings, ScheduleSettings, TTSettings
from nvil.models.protocol import FREE_ENERGY, capable
from nvil.models.rbm import State


def paper_schedule(lr: float, t0: int | None, a: float | None, b: float | None):
    """LambdaLR factor: lr for t < t0, then a / (b + t - t0), t counted from the switch (Salakhutdinov 2009,
    Sec. 4: 0.01 for 10,000 updates, then 10 / (1000 + t); 0.05, then 100 / (2000 + t): each continuous at t0)."""
    if t0 is None:
        return lambda t: 1.0
    if a is None or b is None or a <= 0 or b <= 0:
        raise ConfigError("learner.schedule needs a > 0 and b > 0 when t0 is set (the rate is a / b at the switch)")
    return lambda t: 1.0 if t < t0 else (a / (b + t - t0)) / lr


def filter_grid(w: torch.Tensor, n: int = 64) -> torch.Tensor:
    """The first n receptive fields, each rescaled to [0, 1] for an image grid."""
    w = w[:n]
    lo, hi = w.min(1, keepdim=True).values, w.max(1, keepdim=True).values
    return (w - lo) / (hi - lo).clamp(min=1e-8)


class SAP(DataParallel):
    """Maximum likelihood for a Boltzmann machine; ``mode`` picks the negative phase (sap, trans_sap, cd, ...).

    The model is one with the ``free_energy`` capability (model=rbm or srbm); ``mode`` is one of ``MODES`` (sap,
    trans_sap, pt_sap, cd, exact_ml; the module's docstring). Each update follows the gradient of the mean
    log-likelihood, -mean_data dF(x)/dtheta + E_model[dF(x)/dtheta], through the surrogate mean F(data) - mean
    F(negatives) (``forward``). The keywords are those of ``SAPSettings`` (``nvil.learners.settings``, where each is
    documented), defaults configs/learner/sap.yaml: ``SAP(rbm, None, lr=0.01, num_particles=100, k=1)``,
    ``SAP(rbm, None, mode="cd", k=25)``. ``device`` and ``seed``: the learner's generator.

    Parameters
    ----------
    model : torch.nn.Module
        The Boltzmann machine to train (``nvil.models.rbm.BoltzmannMachine``: model=rbm or srbm); its parameters
        are updated in place.
    inference : None, default None
        Unused (a Boltzmann machine has no inference network); taken so every learner is called alike.
    device : torch.device or str, default "cpu"
        Device of the learner's generator (the model's).
    seed : int, default 0
        Seed of the learner's generator: the chains' starting rows and every sweep's draws.
    mode : str, default "sap"
        The negative phase (``learner.name``): ``sap`` (persistent chains, Salakhutdinov 2009, Algorithm 1),
        ``trans_sap`` (with tempered transitions), ``pt_sap`` (parallel tempering), ``cd`` (CD-k) or ``exact_ml``
        (E_model by enumeration through log Z).
    lr : float, default 0.01
        SGD's learning rate (the schedule's rate for its first ``schedule.t0`` updates); positive.
    momentum : float, default 0.0
        SGD's momentum (from update ``momentum_switch`` on, where ``momentum_initial`` is set).
    weight_decay : float, default 0.0
        The weight cost, ``weight_decay * W`` added to the gradient of the weights W (and U, L), never of the
        biases (rbm.m's ``weightcost * vishid``); >= 0.
    num_particles : int, default 100
        M, the persistent chains of sap / trans_sap (pt_sap: chains of ``pt.num_temps`` replicas each); cd and
        exact_ml keep none. Under data parallelism, the total over the ranks.
    k : int, default 1
        Block-Gibbs sweeps per update (CD-k's k); with ``k_final``, where k starts.
    closed_form : bool, default True
        Take the gradient from sufficient statistics (``nvil.models.rbm_grad``) where the machine has them
        (``model.closed_form_grad``); False: autograd through the free energy, the same update, slower.
    reuse_hidden : bool, default False
        Sweep x | h, then h | x, and reuse p(h | negatives) for their statistics (scikit-learn's BernoulliRBM;
        a different, tested chain; ``nvil.learners.negative_phase``).
    k_final : int or None, default None
        If set, k rises from ``k`` to ``k_final``: linearly over ``k_ramp`` updates, or by one every ``k_every``
        updates (``sweeps_at``; Salakhutdinov & Murray 2008 raised CD's k from 1 to 25).
    k_ramp : int, default 1
        Updates over which k rises linearly to ``k_final``.
    k_every : int or None, default None
        With ``k_final``: k one more every ``k_every`` updates instead (S&M 2008: k = ceil(epoch / 20)).
    lr_over_k : bool, default False
        Divide the rate by the current k (S&M 2008's CD recipe: 0.05 / k).
    momentum_initial : float or None, default None
        With ``momentum_switch``: the momentum of the first ``momentum_switch`` updates (rbm.m: 0.5).
    momentum_switch : int or None, default None
        Updates that use ``momentum_initial`` before ``momentum`` takes over (rbm.m: 5 epochs, then 0.9).
    schedule : ScheduleSettings or Mapping or None, default ScheduleSettings()
        The learning-rate schedule: ``lr`` for ``t0`` updates, then a / (b + t - t0) (Salakhutdinov 2009, Sec. 4);
        None or ``t0`` None keeps ``lr`` fixed.
    tt : TTSettings or Mapping or None, default TTSettings()
        trans_sap's tempered transitions: ``num_betas`` inverse temperatures from ``beta_min`` to 1, a run every
        ``every`` updates from ``start_step`` on; other modes ignore it.
    pt : PTSettings or Mapping or None, default PTSettings()
        pt_sap's parallel tempering: ``num_temps`` replicas per chain, betas from ``beta_min`` to 1; other modes
        ignore it.

    Raises
    ------
    nvil.core.errors.ConfigError
        If ``mode`` is not one of ``MODES``, if ``model`` has no ``free_energy`` (not a Boltzmann machine), if a
        setting is refused (``SAPSettings``, ``ScheduleSettings``, ``TTSettings``, ``PTSettings``), or, for
        exact_ml, if the model has more than 20 units to sum.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import RBM
    >>> from nvil.learners import SAP
    >>> rbm = RBM(6, 4)
    >>> x = (torch.rand(8, 6) < 0.5).float()
    >>> learner = SAP(rbm, None, lr=0.01, num_particles=10, k=1)
    >>> learner.step(x)                      # plain SGD, not a logging step: no metrics
    {}
    >>> learner.updates, learner.particles.x.shape
    (1, torch.Size([10, 6]))
    >>> sorted(learner.step(x, diagnostics=True))
    ['grad_norm/model', 'mcmc/gibbs_sweeps', 'mcmc/k', 'train/free_energy_gap', 'train/lr',
     'train/reconstruction_error']
    >>> cd = SAP(rbm, None, mode="cd", k=25)
    >>> cd.sweeps_now(), cd.particles is None
    (25, True)
    """

    MODES = tuple(PHASES)

    def __init__(self, model: nn.Module, inference: nn.Module | None = None, *, device: torch.device | str = "cpu",
                 seed: int = 0, mode: str = "sap", lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0,
                 num_particles: int = 100, k: int = 1, closed_form: bool = True, reuse_hidden: bool = False,
                 k_final: int | None = None, k_ramp: int = 1, k_every: int | None = None, lr_over_k: bool = False,
                 momentum_initial: float | None = None, momentum_switch: int | None = None,
                 schedule: ScheduleSettings | Mapping | None = ScheduleSettings(),
                 tt: TTSettings | Mapping | None = TTSettings(),
                 pt: PTSettings | Mapping | None = PTSettings()) -> None:
        super().__init__()
        if mode not in PHASES:
            raise ConfigError(f"SAP's mode must be one of {list(PHASES)}, got {mode!r}")
        if not capable(model, FREE_ENERGY):
            raise ConfigError(f"learner={mode} trains Boltzmann machines (model=rbm or srbm), not this model")
        s = self.settings = SAPSettings(lr, momentum, weight_decay, num_particles, k, closed_form, reuse_hidden,
                                        k_final, k_ramp, k_every, lr_over_k, momentum_initial, momentum_switch, schedule,
                                        tt, pt)
        self.model, self.mode = model, mode
        self.optimizer = torch.optim.SGD([{"params": list(model.parameters()), "name": "model"}], lr=s.lr,
                                         momentum=s.momentum)
        self.weight_cost = s.weight_decay
        self.weights = [p for p in model.parameters() if p.dim() >= 2]  # W, U, L: the biases take no weight cost
        self.momentum, self.momentum_initial, self.momentum_switch = s.momentum, s.momentum_initial, s.momentum_switch
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.k, self.k_final, self.k_ramp, self.k_every = s.k, s.k_final, s.k_ramp, s.k_every
        self.lr_over_k = s.lr_over_k
        paper = paper_schedule(s.lr, s.schedule.t0, s.schedule.a, s.schedule.b)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, (lambda t: paper(t) / self.sweeps_at(t)) if self.lr_over_k else paper)
        extra = {"trans_sap": {"tt": s.tt}, "pt_sap": {"pt": s.pt}}.get(mode, {})
        self.phase = PHASES[mode](model, self.generator, num_particles=s.num_particles, reuse_hidden=s.reuse_hidden,
                                  **extra)
        self.updates = 0  # parameter updates so far (the schedule's t and the TT clock)
        self.closed_form = s.closed_form and model.closed_form_grad
        self.sgd_in_products = True  # plain SGD applied by the gradient's GEMMs (tests switch it off to compare)

    def sweeps_now(self) -> int:
        """k of the next update: ``sweeps_at(updates)``.

        Returns
        -------
        int
            The block-Gibbs sweeps the next update takes.
        """
        return self.sweeps_at(self.updates)

    def sweeps_at(self, t: int) -> int:
        """k at update ``t``: fixed, rising linearly to ``k_final``, or stepping up by one every ``k_every`` updates.

        Fixed at ``k`` without ``k_final``; else rising linearly from ``k`` to ``k_final`` over ``k_ramp`` updates
        (Salakhutdinov & Murray 2008 raised CD's k gradually from 1 to 25); or with ``k_every`` one more every
        k_every updates up to ``k_final`` (k = ceil(epoch / 20) with k_every = 20 epochs).

        Parameters
        ----------
        t : int
            The update's number, counted from 0 (the learner's ``updates`` before it).

        Returns
        -------
        int
            The block-Gibbs sweeps of update ``t``.
        """
        if self.k_final is None:
            return self.k
        if self.k_every is not None:
            return min(self.k_final, self.k + t // self.k_every)
        frac = min(1.0, t / self.k_ramp)
        return self.k + int(frac * (self.k_final - self.k))

    # ---- the negative phase's state, read by tests and tools ------------------------------------------------
    @property
    def particles(self) -> State | None:
        """The persistent chains, a ``State`` of x and h; None before the first update and for cd / exact_ml.

        Under pt_sap: every replica, temperature-major. Settable (``load_rank_state`` restores them so).
        """
        return self.phase.chains

    @particles.setter
    def particles(self, chains: State | None) -> None:
        self.phase.chains = chains

    @property
    def gibbs_sweeps(self) -> int:
        """Block-Gibbs sweeps so far (a tempered-transitions run over S temperatures counts its 2 (S - 1))."""
        return self.phase.sweeps

    @property
    def pt(self):
        """pt_sap's parallel-tempering operator (``nvil.mcmc.ParallelTempering``); other modes have none."""
        return self.phase.pt

    @property
    def last_tt_accept(self) -> torch.Tensor | None:
        """trans_sap's acceptance rate of the last tempered-transitions run (None before the first)."""
        return self.phase.last_accept

    @torch.no_grad()
    def negatives(self, x: torch.Tensor) -> torch.Tensor | None:
        """Advance the chains by this update's k sweeps and return the negative-phase x (None for exact ML).

        ``phase.hidden_input`` is then their a(x) when the last sweep computed it. PT's swap rates are kept by the
        phase and reported by ``step`` at log steps.

        Parameters
        ----------
        x : torch.Tensor
            ``(batch, n_visible)``: the minibatch (the rows sap's chains start at on the first update, and CD's
            chains restart at on every update).

        Returns
        -------
        torch.Tensor or None
            ``(num_particles, n_visible)`` negatives (cd: ``(batch, n_visible)``), or None for exact ML.
        """
        self.phase.hidden_input = None
        return self.phase.sample(x, self.sweeps_now(), self.updates)

    def accelerate(self, mode: str, device=None, steps: int | None = None) -> "SAP":
        """Run the negative phase's sweeps on fused kernels (``trainer.accel``); ``none`` changes nothing.

        The block-Gibbs sweeps and tempered-transitions runs use the fused kernels of
        ``BoltzmannMachine.gibbs_kernel`` (binary RBMs without labels or lateral weights; others stay eager).

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
        SAP
            The learner itself.

        Raises
        ------
        nvil.core.errors.ConfigError
            If ``mode`` is unknown or impossible on ``device``.
        """
        if check_mode(mode, device, "trainer.accel") != "none":
            self.phase.accelerate(mode)
        return self

    # ---- data parallelism ------------------------------------------------------------------------------
    def distribute(self, d: distributed.Dist, device: torch.device) -> None:
        """Make the learner one rank of a data-parallel run; each rank keeps its share of the persistent particles.

        Each rank keeps its own share of the ``num_particles`` persistent particles (and of PT's replicas); the
        loss then runs through ``DistributedDataParallel`` (``DataParallel.distribute``), so each update takes the
        autograd path.

        Parameters
        ----------
        d : nvil.core.distributed.Dist
            This process's rank and the world size.
        device : torch.device
            This rank's device.

        Raises
        ------
        nvil.core.errors.ConfigError
            If ``num_particles`` is not divisible by the number of processes.
        """
        self.phase.num_particles = distributed.per_rank(self.phase.num_particles, d, "learner.num_particles")
        super().distribute(d, device)

    def rank_state(self) -> dict:
        """What differs between ranks and travels in the checkpoint once per rank: the generator and the particles.

        Returns
        -------
        dict
            ``generator`` (its state) and, once there are persistent chains, ``particles_x`` / ``particles_h``.
        """
        state = super().rank_state()
        if self.particles is not None:
            state.update(particles_x=self.particles.x, particles_h=self.particles.h)
        return state

    def load_rank_state(self, state: dict) -> None:
        """Restore this rank's generator and particles from ``rank_state``'s dictionary.

        Parameters
        ----------
        state : dict
            A ``rank_state()`` dictionary, mapped to the device (as ``load_learner_state``'s checkpoint).
        """
        super().load_rank_state(state)
        if state.get("particles_x") is not None:  # as load_learner_state: the checkpoint is mapped to the device
            self.particles = State(state["particles_x"], state["particles_h"])

    # ---- one update ----------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, neg: torch.Tensor | None) -> torch.Tensor:
        """The surrogate mean F(data) - mean F(negatives), or mean F(data) + log Z for exact ML.

        Its gradient is minus the log-likelihood gradient (one rank's share of it under data parallelism); the
        autograd path's loss, called through ``loss_module()``.

        Parameters
        ----------
        x : torch.Tensor
            ``(batch, n_visible)``: the minibatch.
        neg : torch.Tensor or None
            ``(M, n_visible)``: the negatives (``negatives``), or None for exact ML.

        Returns
        -------
        torch.Tensor
            The scalar surrogate, with its autograd graph; minus the mean log p(x) of the batch for exact ML.
        """
        f_data = self.model.free_energy(x).mean()
        if neg is None:
            return f_data + self.model.log_z_exact(grad=True)
        return f_data - self.model.free_energy(neg).mean()

    @torch.no_grad()
    def set_closed_form_grads(self, x: torch.Tensor, neg: torch.Tensor, diagnostics: bool,
                              lr: float | None = None) -> dict[str, torch.Tensor]:
        """Set each parameter's ``.grad`` to d/dtheta [mean F(data) - mean F(negatives)] in closed form.

        The gradient comes from the sufficient statistics (``nvil.models.rbm_grad``), the data's rows weighted 1/B
        and the negatives' -1/M, stacked so each statistic is one matrix product; p(h | negatives) comes from the
        phase's last sweep when it computed a(negatives) (``learner.reuse_hidden``), else afresh. With ``lr``
        (``sgd_rate``) plain SGD's step is applied by the products themselves instead.

        Parameters
        ----------
        x : torch.Tensor
            ``(B, n_visible)``: the minibatch.
        neg : torch.Tensor
            ``(M, n_visible)``: the negatives.
        diagnostics : bool
            A logging step: also return the free-energy gap.
        lr : float or None, default None
            If set, apply plain SGD at this rate inside the products (parameters updated in place, no ``.grad``).

        Returns
        -------
        dict of str to torch.Tensor
            ``{"train/free_energy_gap": mean F(negatives) - mean F(data)}`` at a logging step (the only step that
            reads it) when ``lr`` is None; else empty.
        """
        m, a_neg = self.model, self.phase.hidden_input
        rows = torch.cat([x, neg])
        a = m.hidden_input(rows) if a_neg is None else torch.cat([m.hidden_input(x), a_neg])
        w = torch.cat([x.new_full((x.shape[0],), 1.0 / x.shape[0]), x.new_full((neg.shape[0],), -1.0 / neg.shape[0])])
        if lr is not None:
            m.free_energy_grad(rows, w, torch.sigmoid(a), lr=lr)
            return {}
        grads = m.free_energy_grad(rows, w, torch.sigmoid(a))
        for name, p in m.named_parameters():
            p.grad = grads[name]
        if not diagnostics:
            return {}
        return {"train/free_energy_gap": -(w @ m.free_energy(rows, hidden_input=a))}

    def sgd_rate(self, diagnostics: bool) -> float | None:
        """The current rate when this update may apply plain SGD inside the gradient's products, else None.

        That is allowed with no momentum, no weight cost and on a step that reports no gradient norms; otherwise
        the optimiser takes the step.

        Parameters
        ----------
        diagnostics : bool
            A logging step (its gradient norms need ``.grad``: None).

        Returns
        -------
        float or None
            The optimiser's current learning rate, or None.
        """
        if diagnostics or not self.sgd_in_products or self.weight_cost or self.momentum_switch is not None:
            return None
        group = self.optimizer.param_groups[0]
        return None if group["momentum"] else group["lr"]

    def step(self, x: torch.Tensor, diagnostics: bool = False) -> dict[str, torch.Tensor]:
        """One update on the minibatch ``x``: the negatives, the gradient, the parameter step, the schedule's step.

        The closed-form gradient is taken where ``closed_form`` is set, the machine has one and the run is not
        data-parallel (never for exact ML); plain SGD is then applied inside its products where ``sgd_rate``
        allows, else the optimiser takes the step (``optimizer_step``).

        Parameters
        ----------
        x : torch.Tensor
            ``(batch, n_visible)`` training rows.
        diagnostics : bool, default False
            A logging step: add the metrics only a log reads.

        Returns
        -------
        dict of str to torch.Tensor
            The metrics on the device: empty on most steps; at a logging step the free-energy gap (or the exact
            log p of the batch), gradient norms, reconstruction error, rate, sweeps, k and the phase's ``mcmc/...``
            report. The autograd path always reports the gap (or log p).
        """
        neg = self.negatives(x)
        closed = neg is not None and self.closed_form and not self.data_parallel
        lr = self.sgd_rate(diagnostics) if closed else None
        if lr is not None:  # plain SGD inside the products: no .grad, no optimiser pass
            metrics = self.set_closed_form_grads(x, neg, diagnostics, lr)
        else:
            metrics = self.optimizer_step(x, neg, closed, diagnostics)
        with warnings.catch_warnings():  # torch warns once if the schedule moves before any optimizer.step()
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            self.scheduler.step()
        self.updates += 1
        return metrics

    def optimizer_step(self, x: torch.Tensor, neg: torch.Tensor | None, closed: bool,
                       diagnostics: bool) -> dict[str, torch.Tensor]:
        """The update through the optimiser: gradients, weight cost, this update's momentum, ``optimizer.step()``.

        The gradients are taken in closed form or by autograd, the weight cost is added on the weights only.

        Parameters
        ----------
        x : torch.Tensor
            ``(batch, n_visible)``: the minibatch.
        neg : torch.Tensor or None
            The negatives, or None for exact ML.
        closed : bool
            Take the gradient in closed form (``set_closed_form_grads``), else by autograd through ``forward``.
        diagnostics : bool
            A logging step: add gradient norms, reconstruction error, rate, sweeps, k and the phase's report.

        Returns
        -------
        dict of str to torch.Tensor
            The metrics: those of a logging step, and on the autograd path ``train/free_energy_gap`` (or
            ``train/log_p_exact_batch`` for exact ML).
        """
        metrics: dict = {}
        self.optimizer.zero_grad(set_to_none=True)
        if closed:
            metrics.update(self.set_closed_form_grads(x, neg, diagnostics))
        else:
            loss = self.loss_module()(x, neg)
            # -loss is log p of the batch for exact ML, and the free-energy gap F(negatives) - F(data) otherwise.
            metrics["train/log_p_exact_batch" if neg is None else "train/free_energy_gap"] = -loss.detach()
            loss.backward()
        if diagnostics:
            metrics.update(grad_norms(self.optimizer))
            with torch.no_grad():
                recon = self.model.sample_x_given_h(self.model.h_given_x(x), 1.0, self.generator, x=x)
                metrics["train/reconstruction_error"] = ((recon - x) ** 2).sum(-1).mean()
            metrics["train/lr"] = torch.tensor(self.scheduler.get_last_lr()[0])
            metrics["mcmc/gibbs_sweeps"] = torch.tensor(float(self.gibbs_sweeps))
            metrics["mcmc/k"] = torch.tensor(float(self.sweeps_now()))
            metrics.update(self.phase.report())
        if self.weight_cost:
            for p in self.weights:
                p.grad.add_(p, alpha=self.weight_cost)
        if self.momentum_switch is not None:
            momentum = self.momentum_initial if self.updates < self.momentum_switch else self.momentum
            for group in self.optimizer.param_groups:
                group["momentum"] = momentum
        self.optimizer.step()
        return metrics

    # ---- TensorBoard images --------------------------------------------------------------------------
    @torch.no_grad()
    def image_grids(self, seed: int, device) -> dict[str, torch.Tensor]:
        """Persistent particles, the last tempered-transitions run and the weight filters, for TensorBoard.

        The tempered-transitions run is shown before / after (the paper's Fig. 2).

        Parameters
        ----------
        seed : int
            Unused: the grids show the learner's states, not fresh draws.
        device : torch.device or str
            Unused.

        Returns
        -------
        dict of str to torch.Tensor
            ``{tag: (n, pixels) in [0, 1]}``: ``mcmc/particles`` (the first 64, where there are persistent
            chains), ``mcmc/tt_before`` / ``mcmc/tt_after`` (trans_sap, after a run) and ``model/filters``.
        """
        out = self.phase.image_grids(self.model.n_pixels)
        out["model/filters"] = filter_grid(self.model.filters())
        return out

    # ---- state for resume ----------------------------------------------------------------------------
    def learner_state(self) -> dict:
        """Everything a resumed run needs beyond the model: optimiser, schedule, generator, updates and the phase's.

        Returns
        -------
        dict
            ``optimizer``, ``scheduler``, ``generator``, ``updates`` and the negative phase's state (``gibbs_sweeps``,
            ``particles_x`` / ``particles_h``, trans_sap's run counters).
        """
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "generator": self.generator.get_state(), "updates": self.updates, **self.phase.state_dict()}

    def load_learner_state(self, state: dict) -> None:
        """Restore what ``learner_state`` returned, so the run resumes exactly.

        Parameters
        ----------
        state : dict
            A ``learner_state()`` dictionary, mapped to the learner's device.
        """
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"].cpu())
        self.updates = int(state["updates"])
        self.phase.load_state_dict(state)
