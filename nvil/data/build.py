"""The ``DATASETS`` registry (``data.name`` -> builder) and the builders the loop and the evaluation call."""

from __future__ import annotations

from typing import Callable

import torch

from nvil.core.errors import ConfigError
from nvil.data.bow import build_bow
from nvil.data.checks import binarization as check_binarization
from nvil.data.dataset import Dataset
from nvil.data.mnist import build_mnist
from nvil.data.synthetic import build_synthetic, build_synthetic_bow, build_synthetic_dynamic

# In the order the unknown-name error lists them.
DATASETS: dict[str, Callable[..., Dataset]] = {"mnist": build_mnist, "synthetic": build_synthetic, "bow": build_bow,
                                               "synthetic_bow": build_synthetic_bow,
                                               "synthetic_dynamic": build_synthetic_dynamic}


def build_dataset(cfg, device: torch.device | str = "cpu") -> Dataset:
    """The dataset named by ``cfg.name`` (a ``data`` config group entry). Every size, seed and fraction is checked
    here, so a bad value is a one-line ``ConfigError`` rather than a silent slice (``num_train=-1``) or coercion."""
    name = cfg.get("name")
    builder = DATASETS.get(name) if isinstance(name, str) else None
    if builder is None:
        check_binarization(cfg)  # a bad data.binarize is named before an unknown data.name, as it always was
        raise ConfigError(f"unknown dataset data.name={name!r}; known: {', '.join(DATASETS)}")
    return builder(cfg).to(torch.device(device))


def build_model_data(data_cfg, model_cfg, device) -> Dataset:
    """The dataset a model trains or is evaluated on: one-hot labels appended when ``model.labels``."""
    data = build_dataset(data_cfg, device)
    if model_cfg.get("labels", False):
        data.with_one_hot_labels()
    return data
