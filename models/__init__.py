"""Model registry: checkpoints name a model by a key of ``MODELS``, never by a class path."""

from __future__ import annotations

from typing import Callable

from torch import nn

from models.inference import FactorialInference
from models.sbn import SBN
from nvil.errors import ConfigError


def _build_sbn(cfg, n_visible: int) -> tuple[nn.Module, nn.Module]:
    layers = list(cfg.get("layers") or [])
    if not layers or any(not isinstance(n, int) or n < 1 for n in layers):
        raise ConfigError(f"model.layers must be a non-empty list of positive integers, got {layers}")
    return SBN(n_visible, layers), FactorialInference(n_visible, layers)


MODELS: dict[str, Callable] = {"sbn": _build_sbn}


def build_model(cfg, n_visible: int) -> tuple[nn.Module, nn.Module]:
    """(model, inference network) for the ``model`` config group entry ``cfg``."""
    name = cfg.get("name")
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))}")
    return MODELS[name](cfg, n_visible)
