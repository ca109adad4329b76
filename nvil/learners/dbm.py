"""``learner=dbm_sap``: a deep Boltzmann machine trained as Salakhutdinov & Hinton 2009 do (Sec. 3).

First the stack is pretrained greedily with modified RBMs (``nvil.learners.dbm_pretrain``), for ``pretrain_steps``
updates per RBM. Then the whole machine follows the gradient of the variational bound on mean log p(v):

    dL/dW_l = E_data,q[h_{l-1} h_l'] - E_model[h_{l-1} h_l'],

- the data term by mean-field inference (``DBM.mean_field``: q factorises, so its expectation is mu_{l-1} mu_l'),
- the model term by SAP: ``num_particles`` persistent fantasy particles, each moved by ``k`` block-Gibbs sweeps per
  update (odd layers given even, even given odd: the sweep of the DBM's bipartite form ``DBM.top``), the odd layers
  Rao-Blackwellised (p(h_odd | x) in place of their states). With ``tempered`` the particles also take a
  tempered-transitions run every ``tt.every`` updates (Salakhutdinov 2009, Algorithm 2), as ``learner=trans_sap``
  does for an RBM.

The update is that of the author's ``dbm_mf.m``: inc <- m inc + lr_t (grad - weightcost W), the rate
lr_t = max(lr / decay^t, lr_min) (t the joint updates so far), momentum ``momentum_initial`` for the first
``momentum_switch`` joint updates, then ``momentum``, the weight cost on the weights only. The biases of the
composed machine (``Pretraining.compose``) are the starting point of the joint phase.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.estimators.exact import exact_log_marginal
from nvil.estimators.ais import AIS
from nvil.learners.base import Learner
from nvil.learners.dbm_pretrain import Pretraining
from nvil.learners.negative_phase import PHASES
from nvil.learners.sap import filter_grid
from nvil.learners.settings import TTSettings
from nvil.models.dbm import binary_entropy
from nvil.models.protocol import TOP_MACHINE, VARIATIONAL_BOUND, capable
from nvil.models.visible import bernoulli_sample


def sap_gradient(dbm, x_pos: torch.Tensor, y_pos: torch.Tensor, x_neg: torch.Tensor,
                 y_neg: torch.Tensor, data_term: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The ascent direction of the variational objective in the bipartite form: x = even layers, y = odd layers (means
    or Rao-Blackwellised probabilities), data rows first, model rows second. {W: <x y'>_data - <x y'>_model (zero
    outside the neighbours' blocks), b: <x>_data - <x>_model, c: <y>_data - <y>_model}. ``data_term``: <x y'>_data
    when the caller has it (``mean_bound`` shares it)."""
    pos = x_pos.T @ y_pos / x_pos.shape[0] if data_term is None else data_term
    w = (pos - x_neg.T @ y_neg / x_neg.shape[0]) * dbm.mask
    return {"W": w, "b": x_pos.mean(0) - x_neg.mean(0), "c": y_pos.mean(0) - y_neg.mean(0)}


def mean_bound(dbm, x_pos: torch.Tensor, y_pos: torch.Tensor, data_term: torch.Tensor,
               mus: list[torch.Tensor]) -> torch.Tensor:
    """The minibatch mean of the unnormalised bound -E(v, mu) + H(q) (``DBM.variational_bound``) from the data term
    <x y'>_data the gradient needs: the mean of x'Wy is sum(W * <x y'>), so no further product with W."""
    top = dbm.top
    neg_energy = (x_pos @ top.b).mean() + (y_pos @ top.c).mean() + (top.W * data_term).sum()
    return neg_energy + sum(binary_entropy(mu) for mu in mus[1:]).mean()


class DBMSAP(Learner):
    """A deep Boltzmann machine trained as Salakhutdinov & Hinton 2009 do: greedy pretraining, then SAP on the whole.

    The first ``sum(pretrain_steps)`` updates pretrain the stack with modified RBMs (``nvil.learners.dbm_pretrain``);
    the later ones are joint updates dW_l = E_data,q[h_{l-1} h_l'] - E_model[h_{l-1} h_l'] with a mean-field data
    term and a persistent-chain model term (the module's docstring). Keywords (defaults:
    configs/learner/dbm_sap.yaml): ``pretrain_steps`` (one integer or one per RBM), ``pretrain_lr``,
    ``pretrain_weight_decay``; ``lr``, ``lr_decay``, ``lr_min``, ``weight_decay``, ``momentum``,
    ``momentum_initial``, ``momentum_switch`` (counted per RBM in pretraining and from the start of the joint phase);
    ``num_particles``, ``k``; ``mean_field_iters``, ``mean_field_tol`` and ``mean_field_omega``
    (``DBM.mean_field``); ``tempered`` and its ``tt`` block;
    ``validation_betas`` and ``validation_chains``: the forward AIS whose log Z puts the validation bound in nats.

    Parameters
    ----------
    model : torch.nn.Module
        The deep Boltzmann machine (a model with the ``variational_bound`` and ``top_machine`` capabilities:
        model=dbm); trained in place.
    inference : None, default None
        Unused (mean field is the DBM's own inference); taken so every learner is called alike.
    device : torch.device or str, default "cpu"
        Device of the learner's generator (the model's).
    seed : int, default 0
        Seed of the learner's generator (pretraining's CD-1 draws, the particles and their sweeps).
    pretrain_steps : int or sequence of int, default 60000
        Pretraining updates of each RBM of the stack: one non-negative integer for all, or one per RBM
        (``len(model.sizes)``); 0 skips pretraining.
    pretrain_lr : float, default 0.05
        The modified RBMs' CD-1 learning rate (``rbm.m``); positive.
    pretrain_weight_decay : float, default 0.001
        Pretraining's weight cost on W; in [0, 1).
    lr : float, default 0.001
        The joint phase's starting rate, lr in lr_t = max(lr / lr_decay^t, lr_min); positive.
    lr_decay : float, default 1.000015
        The factor the rate is divided by at every joint update (``dbm_mf.m``); >= 1.
    lr_min : float, default 0.0001
        The floor of the decaying rate; positive.
    weight_decay : float, default 0.0002
        The joint phase's weight cost, inc <- m inc + lr_t (grad - weight_decay W), on the weights only; in [0, 1).
    momentum : float, default 0.9
        m after the first ``momentum_switch`` updates of each RBM and of the joint phase; in [0, 1).
    momentum_initial : float, default 0.5
        m for the first ``momentum_switch`` updates of each RBM and of the joint phase; in [0, 1).
    momentum_switch : int, default 3000
        Updates that use ``momentum_initial`` (counted per RBM, and from the start of the joint phase);
        non-negative.
    num_particles : int, default 100
        Persistent fantasy particles of the model term.
    k : int, default 5
        Block-Gibbs sweeps per joint update (odd layers given even, even given odd); positive.
    mean_field_iters : int, default 50
        Most mean-field sweeps of the data term (``DBM.mean_field``'s ``max_iter``); positive.
    mean_field_tol : float, default 1e-3
        Mean field stops once no mean moves by more than this; positive.
    mean_field_omega : float or str, default "auto"
        Over-relaxation of the mean-field updates, in (0, 2), or ``"auto"`` (Young's rule, ``DBM.mean_field``).
    tempered : bool, default False
        Give the particles a tempered-transitions run every ``tt.every`` joint updates (Trans-SAP).
    tt : TTSettings or Mapping or None, default TTSettings()
        The tempered transitions' settings (``TTSettings``), read only with ``tempered``.
    validation_betas : int, default 1000
        Inverse temperatures of the forward AIS run whose log Z puts the validation bound in nats; positive.
    validation_chains : int, default 100
        Chains of that AIS run; positive.

    Raises
    ------
    nvil.core.errors.ConfigError
        If ``model`` is not a DBM; if ``pretrain_steps`` is not one non-negative integer or one per RBM; if a
        rate, ``lr_min``, ``mean_field_tol`` or a count (``k``, ``mean_field_iters``, ``validation_*``) is not
        positive; if ``lr_decay`` < 1; if a momentum or weight cost is not in [0, 1); if ``momentum_switch`` is
        not a non-negative integer; if ``mean_field_omega`` is neither in (0, 2) nor auto; or if ``tt`` is refused.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import DBM
    >>> from nvil.learners import DBMSAP
    >>> dbm = DBM(6, [4, 3])
    >>> x = (torch.rand(8, 6) < 0.5).float()
    >>> learner = DBMSAP(dbm, None, pretrain_steps=1, num_particles=5, k=1, validation_betas=10,
    ...                  validation_chains=4)
    >>> sorted(learner.step(x))                              # pretraining RBM 1 (of 2)
    ['pretrain/layer', 'pretrain/reconstruction_error']
    >>> _ = learner.step(x)                                  # RBM 2
    >>> learner.joint_updates
    0
    >>> sorted(learner.step(x))                              # the first joint update
    ['dbm/lr', 'dbm/mean_field_sweeps', 'dbm/variational_bound_unnormalised']
    >>> sorted(learner.validate(x, x))                       # small enough to enumerate: exact scores too
    ['val/log_p_exact', 'val/variational_bound', 'val/variational_bound_ais', 'val/variational_bound_unnormalised']
    """

    has_own_validation = True  # a DBM's score needs log Z: training reports the bound without it

    def __init__(self, model: nn.Module, inference: nn.Module | None = None, *, device: torch.device | str = "cpu",
                 seed: int = 0, pretrain_steps: int | Sequence[int] = 60000, pretrain_lr: float = 0.05,
                 pretrain_weight_decay: float = 0.001, lr: float = 0.001, lr_decay: float = 1.000015,
                 lr_min: float = 0.0001, weight_decay: float = 0.0002, momentum: float = 0.9,
                 momentum_initial: float = 0.5, momentum_switch: int = 3000, num_particles: int = 100, k: int = 5,
                 mean_field_iters: int = 50, mean_field_tol: float = 1e-3, mean_field_omega: float | str = "auto",
                 tempered: bool = False,
                 tt: TTSettings | Mapping | None = TTSettings(), validation_betas: int = 1000,
                 validation_chains: int = 100) -> None:
        super().__init__()
        if not (capable(model, VARIATIONAL_BOUND) and capable(model, TOP_MACHINE)):
            raise ConfigError("learner=dbm_sap trains deep Boltzmann machines (model=dbm)")
        n_rbms = len(model.sizes)
        steps = [pretrain_steps] * n_rbms if isinstance(pretrain_steps, int) else list(pretrain_steps or [])
        if len(steps) != n_rbms or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in steps):
            raise ConfigError(f"learner.pretrain_steps must be one non-negative integer or a list of {n_rbms} (one per "
                              f"RBM of the stack), got {pretrain_steps!r}")
        for value, key in ((pretrain_lr, "pretrain_lr"), (lr, "lr"), (lr_min, "lr_min"), (lr_decay, "lr_decay")):
            positive_float(value, f"learner.{key}")
        if lr_decay < 1:
            raise ConfigError(f"learner.lr_decay divides the rate at every update and must be >= 1, got {lr_decay}")
        for value, key in ((momentum, "momentum"), (momentum_initial, "momentum_initial"),
                           (weight_decay, "weight_decay"), (pretrain_weight_decay, "pretrain_weight_decay")):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ConfigError(f"learner.{key} must be a number in [0, 1), got {value!r}")
        if isinstance(momentum_switch, bool) or not isinstance(momentum_switch, int) or momentum_switch < 0:
            raise ConfigError(f"learner.momentum_switch must be a non-negative integer, got {momentum_switch!r}")
        self.model, self.device = model, torch.device(device)
        self.k = positive_int(k, "learner.k")
        self.mf_iters = positive_int(mean_field_iters, "learner.mean_field_iters")
        self.mf_tol = positive_float(mean_field_tol, "learner.mean_field_tol")
        if mean_field_omega != "auto" and (isinstance(mean_field_omega, bool) or not isinstance(
                mean_field_omega, (int, float)) or not 0 < mean_field_omega < 2):
            raise ConfigError(f"learner.mean_field_omega (over-relaxation of the mean-field updates) must be a "
                              f"number in (0, 2) or auto, got {mean_field_omega!r}")
        self.mf_omega = mean_field_omega if mean_field_omega == "auto" else float(mean_field_omega)
        self.validation_log_z = AIS(num_chains=positive_int(validation_chains, "learner.validation_chains"),
                                    num_betas=positive_int(validation_betas, "learner.validation_betas"),
                                    certify=False, cache=False)
        self.lr, self.lr_decay, self.lr_min, self.weight_cost = lr, lr_decay, lr_min, weight_decay
        self.momentum, self.momentum_initial, self.momentum_switch = momentum, momentum_initial, momentum_switch
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.pretraining = Pretraining(model, steps, pretrain_lr, pretrain_weight_decay, momentum, momentum_initial,
                                       momentum_switch)
        self.tempered = bool(tempered)
        extra = {"tt": TTSettings.of(tt)} if self.tempered else {}
        self.phase = PHASES["trans_sap" if self.tempered else "sap"](model.top, self.generator,
                                                                       num_particles=num_particles, **extra)
        top = model.top
        self.inc = {"W": torch.zeros_like(top.W), "b": torch.zeros_like(top.b), "c": torch.zeros_like(top.c)}
        self.updates = 0

    @property
    def joint_updates(self) -> int:
        """Joint (whole-machine) updates so far: ``updates`` less the pretraining's; negative during pretraining."""
        return self.updates - self.pretraining.total

    def rate(self) -> float:
        """The joint phase's rate lr_t = max(lr / decay^t, lr_min), t the joint updates so far (``dbm_mf.m``).

        During pretraining t counts as 0.

        Returns
        -------
        float
            lr_t.
        """
        return max(self.lr / self.lr_decay ** max(self.joint_updates, 0), self.lr_min)

    def step(self, x: torch.Tensor, diagnostics: bool = False) -> dict[str, torch.Tensor]:
        """One update on the minibatch ``x``: a pretraining CD-1 step of the current RBM, or a joint step.

        The first joint update first composes the DBM's biases from the pretrained RBMs (``Pretraining.compose``).

        Parameters
        ----------
        x : torch.Tensor
            ``(batch, n_visible)`` binary training rows.
        diagnostics : bool, default False
            A logging step; every step reports the same metrics here.

        Returns
        -------
        dict of str to torch.Tensor
            In pretraining ``pretrain/layer`` (1-based) and ``pretrain/reconstruction_error``; then those of
            ``joint_step``.
        """
        if self.updates < self.pretraining.total:
            metrics = self.pretraining.step(x, self.updates, self.generator)
        else:
            if self.updates == self.pretraining.total:
                self.pretraining.compose()
            metrics = self.joint_step(x)
        self.updates += 1
        return metrics

    @torch.no_grad()
    def joint_step(self, v: torch.Tensor) -> dict[str, torch.Tensor]:
        """One joint update of the whole machine, as ``dbm_mf.m``: inc <- m inc + lr_t (grad - weightcost W).

        The data term is the mean-field fixed point's <x y'> (x the even layers, y the odd), the model term that of
        the persistent particles after ``k`` sweeps (the odd layers Rao-Blackwellised); the parameters of
        ``model.top`` move by the momentum increment, then ``DBM.constrain_`` holds the blocks of W between layers
        that are not neighbours at zero.

        Parameters
        ----------
        v : torch.Tensor
            ``(batch, n_visible)`` binary training rows.

        Returns
        -------
        dict of str to torch.Tensor
            ``dbm/variational_bound_unnormalised`` (the minibatch's mean bound without log Z, at the parameters
            before the update), ``dbm/mean_field_sweeps``, ``dbm/lr`` (lr_t) and the phase's ``mcmc/...`` report
            (tempered transitions' acceptance).
        """
        dbm, top = self.model, self.model.top
        mus, sweeps = dbm.mean_field(v, self.mf_iters, self.mf_tol, omega=self.mf_omega, return_sweeps=True)
        x_pos, y_pos = dbm.join(v, torch.cat(mus[2::2], -1)), torch.cat(mus[1::2], -1)
        start = dbm.join(v, bernoulli_sample(torch.cat(mus[2::2], -1), self.generator))
        x_neg = self.phase.sample(start, self.k, self.joint_updates)
        data_term = x_pos.T @ y_pos / x_pos.shape[0]
        bound = mean_bound(dbm, x_pos, y_pos, data_term, mus)  # at the parameters the means were computed for
        grad = sap_gradient(dbm, x_pos, y_pos, x_neg, top.h_given_x(x_neg), data_term)
        grad["W"] = grad["W"] - self.weight_cost * top.W
        momentum = self.momentum_initial if self.joint_updates < self.momentum_switch else self.momentum
        lr = self.rate()
        for name in ("W", "b", "c"):
            self.inc[name].mul_(momentum).add_(grad[name], alpha=lr)
            getattr(top, name).add_(self.inc[name])
        dbm.constrain_()
        return {"dbm/variational_bound_unnormalised": bound, "dbm/mean_field_sweeps": torch.tensor(float(sweeps)), "dbm/lr": torch.tensor(lr),
                **self.phase.report()}

    @torch.no_grad()
    def validate(self, valid: torch.Tensor, train_subset: torch.Tensor) -> dict[str, float]:
        """In pretraining, the current RBM's reconstruction error; then the mean-field bound on mean log p(v) in nats.

        The bound's log Z comes from a forward AIS run (``validation_betas`` x ``validation_chains``, no
        certificate, base rate from ``train_subset``, a fixed seed), reported beside the bound without log Z; and
        exact log p(v) and the bound with the exact log Z where both can be enumerated (at most 20 units in the
        odd layers and 12 in the even hidden layers).

        Parameters
        ----------
        valid : torch.Tensor
            ``(n, n_visible)`` binary validation rows.
        train_subset : torch.Tensor
            ``(m, n_visible)`` training rows, the AIS base rate's data.

        Returns
        -------
        dict of str to float
            In pretraining ``val/pretrain_layer<l>/reconstruction_error``; then
            ``val/variational_bound_unnormalised``, ``val/variational_bound_ais`` and, where enumerable,
            ``val/log_p_exact`` and ``val/variational_bound``.
        """
        dbm = self.model
        if self.updates < self.pretraining.total:
            layer = self.pretraining.layer_at(self.updates)
            rbm = self.pretraining.current(self.updates)
            x = self.pretraining.up(valid, layer, torch.Generator(device=valid.device).manual_seed(1))
            recon = rbm.x_given_h(rbm.h_given_x(x))
            return {f"val/pretrain_layer{layer}/reconstruction_error": ((recon - x) ** 2).sum(-1).mean().item()}
        bound = dbm.variational_bound(valid, dbm.mean_field(valid, self.mf_iters, self.mf_tol, omega=self.mf_omega))
        out = {"val/variational_bound_unnormalised": bound.mean().item()}
        ais = self.validation_log_z.estimate(dbm, valid, train=train_subset, seed=0)
        out["val/variational_bound_ais"] = ais.mean
        if dbm.top.n_hidden <= 20 and dbm.n_latent <= 12:
            log_z = dbm.log_z_exact().item()
            out["val/log_p_exact"] = (exact_log_marginal(dbm, valid) - log_z).mean().item()
            out["val/variational_bound"] = out["val/variational_bound_unnormalised"] - log_z
        return out

    def image_grids(self, seed: int, device) -> dict[str, torch.Tensor]:
        """The fantasy particles' pixels and the first layer's filters, for TensorBoard.

        Parameters
        ----------
        seed : int
            Unused: the grids show the learner's states, not fresh draws.
        device : torch.device or str
            Unused.

        Returns
        -------
        dict of str to torch.Tensor
            ``{tag: (n, pixels) in [0, 1]}``: ``mcmc/particles`` (the first 64, once there are particles),
            ``mcmc/tt_before`` / ``mcmc/tt_after`` (with ``tempered``, after a run) and ``model/filters``.
        """
        out = self.phase.image_grids(self.model.n_visible)
        out["model/filters"] = filter_grid(self.model.filters())
        return out

    def learner_state(self) -> dict:
        """Everything a resumed run needs beyond the model: updates, generator, increments, pretraining, particles.

        Returns
        -------
        dict
            ``updates``, ``generator``, ``inc`` (the joint phase's momentum increments of W, b, c),
            ``pretraining`` (the trained RBMs' biases and the current RBM's state) and the negative phase's
            (``gibbs_sweeps``, ``particles_x`` / ``particles_h``, ...).
        """
        return {"updates": self.updates, "generator": self.generator.get_state(), "inc": dict(self.inc),
                "pretraining": self.pretraining.state(), **self.phase.state_dict()}

    def load_learner_state(self, state: dict) -> None:
        """Restore what ``learner_state`` returned, so the run resumes exactly (in pretraining or the joint phase).

        Parameters
        ----------
        state : dict
            A ``learner_state()`` dictionary, mapped to the learner's device.
        """
        self.updates = int(state["updates"])
        self.generator.set_state(state["generator"].cpu())
        for name, t in state["inc"].items():
            self.inc[name].copy_(t)
        self.pretraining.load(state["pretraining"], self.updates)
        self.phase.load_state_dict(state)
