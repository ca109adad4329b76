"""Greedy layer-wise training of a deep belief net (Hinton, Osindero & Teh 2006).

RBM 1 is trained on the data; RBM l + 1 on the hidden activities of RBM l given the data below it,
the lower RBMs frozen. Each RBM is trained by one of the Boltzmann-machine learners of
``nvil.learners.sap`` (``learner.layer_learner=cd`` or ``sap``), with the same lr, k, particles and
schedule; ``learner.per_layer`` (a list with one mapping per RBM) overrides any of these for one RBM,
e.g. ``[{layer_learner: cd, k_final: 25}, {layer_learner: sap}]``. Every RBM below the top trains for
``layer_steps`` updates; the top RBM trains for the rest of
``trainer.max_steps``. What the next layer sees is p(h = 1 | x) (``propagate=mean``, as in Hinton's
code) or a sample h ~ p(h | x) (``propagate=sample``).

A greedy run has no single validation score across layers, so it writes no ``best.pt``: its checkpoint
is ``last.pt``. Validation reports the current layer's reconstruction error (and, for layer 1, its
pseudo-log-likelihood).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from nvil.core.config import positive_int
from nvil.core.errors import ConfigError
from nvil.estimators.validation import stochastic_pseudo_log_likelihood
from nvil.learners.base import Learner
from nvil.learners.sap import SAP, filter_grid
from nvil.learners.settings import SAPSettings, ScheduleSettings
from nvil.models.protocol import LAYER_STACK, capable

LAYER_LEARNERS = ("cd", "sap")
PROPAGATE = ("mean", "sample")


class Greedy(Learner):
    """Greedy layer-wise training of ``model`` (a ``DBN``): each RBM in turn by CD-k or SAP, the RBMs below it frozen.

    ``layer_learner``: cd | sap, each RBM's learner (``SAP``'s mode), with the keywords of ``SAPSettings``
    (defaults configs/learner/greedy.yaml, those of learner=sap but k = 1); ``layer_steps``: updates of each RBM
    below the top (one integer, or one per RBM below the top; the top RBM trains for the rest of the run);
    ``propagate``: what the next RBM trains on, p(h = 1 | x) (mean) or h ~ p(h | x) (sample); ``per_layer``: None,
    or one mapping per RBM overriding any of the settings above for it (``layer_learner`` and the ``SAPSettings``
    keys), e.g. ``[{"layer_learner": "cd"}, {"k": 5}]``. Each RBM's learner is a fresh ``SAP`` built when its
    layer starts (seed ``seed + layer``).

    Parameters
    ----------
    model : torch.nn.Module
        The deep belief net (a model with the ``layer_stack`` capability: model=dbn); its RBMs (``model.rbms``)
        are trained in place.
    inference : None, default None
        Unused (the DBN's recognition pass is its own up-pass); taken so every learner is called alike.
    device : torch.device or str, default "cpu"
        Device of the learners' generators (the model's).
    seed : int, default 0
        Seed of the generators: RBM l's learner draws from ``seed + l`` (0-based), the sampled up-pass from
        ``seed + 7919``.
    layer_learner : str, default "cd"
        Each RBM's learner, ``SAP``'s mode: ``cd`` (CD-k) or ``sap`` (persistent chains).
    layer_steps : int or sequence of int, default 25000
        Updates of each RBM below the top: one positive integer for all, or one per RBM below the top. The top
        RBM trains for the rest of ``trainer.max_steps``.
    propagate : str, default "mean"
        What the next RBM trains on: ``mean``, p(h = 1 | x) (as in Hinton's code), or ``sample``, h ~ p(h | x).
    per_layer : sequence of Mapping or None, default None
        One mapping per RBM overriding ``layer_learner`` and any ``SAPSettings`` key for that RBM.
    lr : float, default 0.01
        Each RBM's SGD learning rate (``SAP``'s ``lr``).
    momentum : float, default 0.0
        SGD's momentum.
    weight_decay : float, default 0.0
        The weight cost on W, never the biases; >= 0.
    num_particles : int, default 100
        Persistent chains of a ``sap`` layer (a ``cd`` layer keeps none).
    k : int, default 1
        Block-Gibbs sweeps per update (CD-k's k).
    closed_form : bool, default True
        The gradient from sufficient statistics where the RBM has them (False: autograd).
    reuse_hidden : bool, default False
        Sweep x | h, then h | x, and reuse p(h | negatives) (``SAP``'s ``reuse_hidden``).
    k_final : int or None, default None
        If set, k rises from ``k`` to ``k_final`` over ``k_ramp`` updates, or by one every ``k_every`` updates;
        counted from the start of each RBM's training.
    k_ramp : int, default 1
        Updates over which k rises linearly to ``k_final``.
    k_every : int or None, default None
        With ``k_final``: k one more every ``k_every`` updates (S&M 2008: ceil(epoch / 20)).
    lr_over_k : bool, default False
        Divide the rate by the current k (S&M 2008's CD recipe: 0.05 / k).
    momentum_initial : float or None, default None
        With ``momentum_switch``: the momentum of each RBM's first ``momentum_switch`` updates (rbm.m: 0.5).
    momentum_switch : int or None, default None
        Updates of each RBM that use ``momentum_initial`` before ``momentum`` takes over.
    schedule : ScheduleSettings or Mapping or None, default ScheduleSettings()
        Each RBM's learning-rate schedule, ``lr`` for ``t0`` updates, then a / (b + t - t0) (``ScheduleSettings``).

    Raises
    ------
    nvil.core.errors.ConfigError
        If ``model`` is not a DBN; if ``per_layer`` does not have one mapping per RBM, or names a key that is not
        a setting; if a ``layer_learner`` is not cd or sap; if ``propagate`` is not mean or sample; if
        ``layer_steps`` is not one positive integer or one per RBM below the top; or if a setting is refused
        (``SAPSettings``).

    Examples
    --------
    >>> import torch
    >>> from nvil.models import DBN
    >>> from nvil.learners import Greedy
    >>> dbn = DBN(6, [4, 3])
    >>> x = (torch.rand(8, 6) < 0.5).float()
    >>> learner = Greedy(dbn, None, layer_steps=2, num_particles=5)
    >>> for _ in range(3):
    ...     metrics = learner.step(x, diagnostics=True)
    >>> learner.layer, metrics["greedy/layer"].item()       # the third update trains RBM 2
    (1, 2.0)
    >>> list(learner.validate(x, x))
    ['val/layer2/reconstruction_error']
    >>> Greedy(dbn, None, per_layer=[{"layer_learner": "cd"}, {"layer_learner": "sap", "k": 5}]).layer_learners
    ['cd', 'sap']
    """

    has_own_validation = True  # one RBM at a time: no single score across layers

    def __init__(self, model: nn.Module, inference: nn.Module | None = None, *, device: torch.device | str = "cpu",
                 seed: int = 0, layer_learner: str = "cd", layer_steps: int | Sequence[int] = 25000,
                 propagate: str = "mean", per_layer: Sequence[Mapping] | None = None, lr: float = 0.01,
                 momentum: float = 0.0, weight_decay: float = 0.0, num_particles: int = 100, k: int = 1,
                 closed_form: bool = True, reuse_hidden: bool = False, k_final: int | None = None, k_ramp: int = 1,
                 k_every: int | None = None, lr_over_k: bool = False, momentum_initial: float | None = None,
                 momentum_switch: int | None = None,
                 schedule: ScheduleSettings | Mapping | None = ScheduleSettings()) -> None:
        super().__init__()
        if not capable(model, LAYER_STACK):
            raise ConfigError("learner=greedy trains deep belief nets (model=dbn)")
        if per_layer is not None and len(per_layer) != len(model.rbms):
            raise ConfigError(f"learner.per_layer must have one entry per RBM ({len(model.rbms)}), "
                              f"got {len(per_layer)}")
        shared = SAPSettings(lr, momentum, weight_decay, num_particles, k, closed_form, reuse_hidden, k_final, k_ramp,
                             k_every, lr_over_k, momentum_initial, momentum_switch, schedule)
        self.layer_learners, self.layer_settings = [], []  # each RBM's: SAP's mode, SAPSettings
        for i in range(len(model.rbms)):
            overrides = per_layer[i] if per_layer is not None else {}
            if not isinstance(overrides, Mapping):
                raise ConfigError(f"learner.per_layer[{i}] must be a mapping of settings, got {overrides!r}")
            overrides = dict(overrides)
            mode = overrides.pop("layer_learner", layer_learner)
            if mode not in LAYER_LEARNERS:
                raise ConfigError(f"learner.layer_learner must be one of {list(LAYER_LEARNERS)}, got {mode!r}")
            self.layer_learners.append(mode)
            self.layer_settings.append(SAPSettings.with_overrides(shared, overrides, f"learner.per_layer[{i}]"))
        if propagate not in PROPAGATE:
            raise ConfigError(f"learner.propagate must be one of {list(PROPAGATE)}, got {propagate!r}")
        n_lower = len(model.rbms) - 1
        steps = layer_steps
        steps = [steps] * n_lower if isinstance(steps, int) and not isinstance(steps, bool) else list(steps or [])
        if len(steps) != n_lower:
            raise ConfigError(f"learner.layer_steps must be one integer or a list of {n_lower} (one per RBM below "
                              f"the top), got {layer_steps!r}")
        for s in steps:
            positive_int(s, "learner.layer_steps")
        self.model, self.device, self.seed = model, torch.device(device), seed
        self.propagate = propagate
        self.boundaries = torch.tensor(steps).cumsum(0).tolist()  # update at which layer l + 1 starts
        self.generator = torch.Generator(device=device).manual_seed(seed + 7919)
        self.updates = 0
        self.layer = 0
        self.inner = self._layer_learner(0)

    def _layer_learner(self, layer: int) -> SAP:
        return SAP(self.model.rbms[layer], None, device=self.device, seed=self.seed + layer,
                   mode=self.layer_learners[layer], **self.layer_settings[layer].keywords())

    def _layer_at(self, updates: int) -> int:
        return sum(updates >= b for b in self.boundaries)

    @torch.no_grad()
    def up(self, x: torch.Tensor, layer: int, generator=None) -> torch.Tensor:
        """The data RBM ``layer`` (0-based) trains on: x passed up through the frozen RBMs below it.

        Each RBM below passes p(h = 1 | x) up (``propagate=mean``) or a sample h ~ p(h | x) (``sample``).

        Parameters
        ----------
        x : torch.Tensor
            ``(batch, n_visible)``: data rows.
        layer : int
            The RBM (0-based) whose input is wanted; 0 returns ``x`` itself.
        generator : torch.Generator or None, default None
            Source of the up-pass's samples under ``propagate=sample``; None uses torch's global generator.

        Returns
        -------
        torch.Tensor
            ``(batch, n_in)``: the input of RBM ``layer``, its visible width.
        """
        for rbm in self.model.rbms[:layer]:
            x = rbm.h_given_x(x) if self.propagate == "mean" else rbm.sample_h(x, 1.0, generator)
        return x

    def step(self, x: torch.Tensor, diagnostics: bool = False) -> dict[str, torch.Tensor]:
        """One update of the current RBM on the minibatch ``x`` passed up to it; a fresh learner as a layer starts.

        Parameters
        ----------
        x : torch.Tensor
            ``(batch, n_visible)`` training rows.
        diagnostics : bool, default False
            A logging step: add the metrics only a log reads.

        Returns
        -------
        dict of str to torch.Tensor
            The RBM learner's metrics (``SAP.step``); at a logging step also ``greedy/layer``, the RBM (1-based).
        """
        layer = self._layer_at(self.updates)
        if layer != self.layer:
            self.layer, self.inner = layer, self._layer_learner(layer)
        metrics = self.inner.step(self.up(x, layer, self.generator), diagnostics)
        self.updates += 1
        if diagnostics:
            metrics["greedy/layer"] = torch.tensor(float(layer + 1))
        return metrics

    @torch.no_grad()
    def validate(self, valid: torch.Tensor, train_subset: torch.Tensor) -> dict[str, float]:
        """The current layer's mean-field reconstruction error on the validation data below it.

        For layer 1 also the (stochastic) pseudo-log-likelihood, drawn with a fixed seed.

        Parameters
        ----------
        valid : torch.Tensor
            ``(n, n_visible)`` validation rows.
        train_subset : torch.Tensor
            Unused (the scores need nothing from the training data).

        Returns
        -------
        dict of str to float
            ``val/layer<l>/reconstruction_error`` (l 1-based) and, for layer 1,
            ``val/layer1/pseudo_log_likelihood``.
        """
        rbm, layer = self.model.rbms[self.layer], self.layer
        x = self.up(valid, layer)
        recon = torch.sigmoid(rbm.b + rbm.h_given_x(x) @ rbm.W.T)
        out = {f"val/layer{layer + 1}/reconstruction_error": ((recon - x) ** 2).sum(-1).mean().item()}
        if layer == 0:
            g = torch.Generator(device=valid.device).manual_seed(self.seed + 1_000_003)
            out["val/layer1/pseudo_log_likelihood"] = stochastic_pseudo_log_likelihood(rbm, x, g).mean().item()
        return out

    @torch.no_grad()
    def image_grids(self, seed: int, device) -> dict[str, torch.Tensor]:
        """Layer 1's filters, and while layer 1 trains its learner's grids (``SAP.image_grids``), for TensorBoard.

        Parameters
        ----------
        seed : int
            Passed on to the layer learner's ``image_grids`` (which shows states, not fresh draws).
        device : torch.device or str
            Passed on likewise.

        Returns
        -------
        dict of str to torch.Tensor
            ``{tag: (n, pixels) in [0, 1]}``: ``model/filters`` (layer 1's, the image-shaped ones) and, during
            layer 1, its persistent particles where it has them.
        """
        grids = self.inner.image_grids(seed, device) if self.layer == 0 else {}
        grids["model/filters"] = filter_grid(self.model.filters())  # layer 1's, the image-shaped ones
        return grids

    def learner_state(self) -> dict:
        """Everything a resumed run needs beyond the model: the update count, the up-pass's generator, the RBM's.

        Returns
        -------
        dict
            ``updates``, ``generator`` and ``inner``, the current RBM learner's ``learner_state()``.
        """
        return {"updates": self.updates, "generator": self.generator.get_state(), "inner": self.inner.learner_state()}

    def load_learner_state(self, state: dict) -> None:
        """Restore what ``learner_state`` returned: the layer follows from the update count, its learner is rebuilt.

        Parameters
        ----------
        state : dict
            A ``learner_state()`` dictionary, mapped to the learner's device.
        """
        self.updates = int(state["updates"])
        self.generator.set_state(state["generator"].cpu())
        self.layer = self._layer_at(self.updates)
        self.inner = self._layer_learner(self.layer)
        self.inner.load_learner_state(state["inner"])
