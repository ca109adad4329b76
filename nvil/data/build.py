"""The ``DATASETS`` registry (``data.name`` -> builder) and the one place a data config is read.

Each builder (``mnist_data``, ``synthetic_data``, ``bow_data``, ``synthetic_bow_data``, ``synthetic_dynamic_data``)
takes typed keywords whose defaults are configs/data/NAME.yaml's, so a notebook calls it directly:

    data = mnist_data(binarize="fixed", num_train=10000)

``build_dataset(cfg)`` turns a ``data`` config (a Hydra config or any mapping with ``name``) into the same call,
``DATASETS[cfg.name](**dataset_settings(cfg))``; a key the builder does not take is a one-line ``ConfigError``
naming its settings."""

from __future__ import annotations

from typing import Callable

import torch

from nvil.core.errors import ConfigError
from nvil.core.registry import keywords, read_settings
from nvil.data.bow import bow_data
from nvil.data.checks import binarization as check_binarization
from nvil.data.dataset import Dataset
from nvil.data.mnist import mnist_data
from nvil.data.synthetic import synthetic_bow_data, synthetic_data, synthetic_dynamic_data

# In the order the unknown-name error lists them.
DATASETS: dict[str, Callable[..., Dataset]] = {"mnist": mnist_data, "synthetic": synthetic_data, "bow": bow_data,
                                               "synthetic_bow": synthetic_bow_data,
                                               "synthetic_dynamic": synthetic_dynamic_data}


def parameters(builder: Callable) -> list[str]:
    """The keywords a dataset builder takes, in its signature's order."""
    return keywords(builder)


def dataset_name(cfg) -> str:
    """``cfg.name``, a key of ``DATASETS``; an unknown one is refused in one line (a bad ``data.binarize`` is named
    first, as it always was)."""
    name = cfg.get("name")
    if not isinstance(name, str) or name not in DATASETS:
        check_binarization(cfg.get("binarize", "fixed"))
        raise ConfigError(f"unknown dataset data.name={name!r}; known: {', '.join(DATASETS)}")
    return name


def dataset_settings(cfg) -> dict:
    """The keywords ``build_dataset`` passes ``DATASETS[cfg.name]``: every key of ``cfg`` but ``name``, as given (a
    null stays None); a key the builder does not take is refused in one line."""
    name = dataset_name(cfg)
    return read_settings("data", name, cfg, parameters(DATASETS[name]), skip=("name",))


def build_dataset(cfg, device: torch.device | str = "cpu") -> Dataset:
    """The dataset the ``data`` config ``cfg`` names, on ``device``: ``DATASETS[cfg.name](**settings)``.

    Every size, seed and fraction is checked by its builder, so a bad value is a one-line ``ConfigError`` rather
    than a silent slice (``num_train=-1``) or coercion.

    Parameters
    ----------
    cfg : DictConfig or Mapping
        The ``data`` config: ``name`` (a key of ``DATASETS``) and the builder's keywords (a null stays None).
    device : torch.device or str, default "cpu"
        Where every split goes.

    Returns
    -------
    Dataset
        The dataset, its splits on ``device``.

    Raises
    ------
    ConfigError
        If ``name`` is unknown, a key is not a setting of its builder, or the builder refuses a value (``DataError``
        for the data itself).

    Examples
    --------
    >>> from nvil.data import build_dataset
    >>> data = build_dataset({"name": "synthetic", "num_train": 100, "num_valid": 10, "num_test": 10})
    >>> data.name, data.dim, data.split("train").shape
    ('synthetic', 12, torch.Size([100, 12]))
    >>> build_dataset({"name": "synthetic", "num_trian": 5})
    Traceback (most recent call last):
    ...
    nvil.core.errors.ConfigError: data.num_trian is not a setting of data=synthetic (did you mean data.num_train?); ...
    """
    return DATASETS[dataset_name(cfg)](**dataset_settings(cfg)).to(torch.device(device))


def build_model_data(data_cfg, device: torch.device | str = "cpu", *, labels: bool = False) -> Dataset:
    """The dataset a model trains or is evaluated on: one-hot labels appended to every split when ``labels`` (the
    model's ``model.labels``, which the caller reads)."""
    data = build_dataset(data_cfg, device)
    if labels:
        data.with_one_hot_labels()
    return data
