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
    """Greedy layer-wise training of ``model`` (a ``DBN``). ``layer_learner``: cd | sap, each RBM's learner
    (``SAP``'s mode), with the keywords of ``SAPSettings`` (defaults configs/learner/greedy.yaml, those of
    learner=sap but k = 1); ``layer_steps``: updates of each RBM below the top (one integer, or one per RBM below
    the top; the top RBM trains for the rest of the run); ``propagate``: what the next RBM trains on, p(h = 1 | x)
    (mean) or h ~ p(h | x) (sample); ``per_layer``: None, or one mapping per RBM overriding any of the settings
    above for it (``layer_learner`` and the ``SAPSettings`` keys), e.g. ``[{"layer_learner": "cd"}, {"k": 5}]``."""

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
        """The data RBM ``layer`` (0-based) trains on: x passed up through the frozen RBMs below it."""
        for rbm in self.model.rbms[:layer]:
            x = rbm.h_given_x(x) if self.propagate == "mean" else rbm.sample_h(x, 1.0, generator)
        return x

    def step(self, x: torch.Tensor, diagnostics: bool = False) -> dict[str, torch.Tensor]:
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
        """The current layer's mean-field reconstruction error on the validation data below it."""
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
        grids = self.inner.image_grids(seed, device) if self.layer == 0 else {}
        grids["model/filters"] = filter_grid(self.model.filters())  # layer 1's, the image-shaped ones
        return grids

    def learner_state(self) -> dict:
        return {"updates": self.updates, "generator": self.generator.get_state(), "inner": self.inner.learner_state()}

    def load_learner_state(self, state: dict) -> None:
        self.updates = int(state["updates"])
        self.generator.set_state(state["generator"].cpu())
        self.layer = self._layer_at(self.updates)
        self.inner = self._layer_learner(self.layer)
        self.inner.load_learner_state(state["inner"])
