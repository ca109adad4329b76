"""Bag-of-words documents.

A user's sparse count matrix (``data=bow``) is kept as a sparse COO tensor and densified a minibatch at a time,
so a corpus the size of RCV1 fits in memory (splits small enough are kept dense, which is faster). The counts
drawn from a small known document model (``data=synthetic_bow``) are split the same way; see
``nvil.data.synthetic``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from nvil.core.config import positive_int
from nvil.core.errors import ConfigError, DataError
from nvil.data.checks import data_seed, fraction
from nvil.data.dataset import SPLITS, Dataset

BOW_FORMATS = ("csr", "coo")
DENSE_LIMIT = 50_000_000  # a split with at most this many counts is stored dense: faster minibatches


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


def _select_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    if not x.is_sparse:
        return x[idx]
    rows = x.index_select(0, idx).coalesce()
    return rows.to_dense() if rows.shape[0] * rows.shape[1] <= DENSE_LIMIT else rows


def split_documents(x: torch.Tensor, cfg, test: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """train / valid / test: a seeded random ``num_valid`` documents held out for validation (100 in the
    NVIL paper) and, without a separate test file, a ``test_fraction`` of the documents for testing."""
    n = x.shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(data_seed(cfg)))
    n_test = 0 if test is not None else int(round(fraction(cfg, "test_fraction", 0.1) * n))
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


def build_bow(cfg) -> Dataset:
    """``data=bow``: the count matrix at ``data.path`` (and ``data.test_path``, if given, as the test split)."""
    if not cfg.get("path"):
        raise ConfigError("data=bow needs data.path=FILE.npz (a scipy.sparse document-by-word count matrix)")
    for key in ("path", "test_path"):
        if cfg.get(key) is not None and not isinstance(cfg.get(key), str):
            raise ConfigError(f"data.{key} must be a file path (FILE.npz), got {cfg.get(key)!r}")
    x = load_count_matrix(cfg.path)
    test = load_count_matrix(cfg.test_path) if cfg.get("test_path") else None
    if test is not None and test.shape[1] != x.shape[1]:
        raise DataError(f"{cfg.test_path} has a vocabulary of {test.shape[1]} words, {cfg.path} of {x.shape[1]}")
    splits = split_documents(x, cfg, test)
    return Dataset("bow", splits, {s: None for s in SPLITS}, "counts", data_seed(cfg))
