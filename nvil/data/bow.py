"""Bag-of-words documents.

A user's sparse count matrix (``data=bow``, ``bow_data``) is kept as a sparse COO tensor and densified a minibatch at a time,
so a corpus the size of RCV1 fits in memory (splits small enough are kept dense, which is faster). The counts
drawn from a small known document model (``data=synthetic_bow``) are split the same way; see
``nvil.data.synthetic``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from nvil.core.config import positive_int
from nvil.core.errors import ConfigError, DataError
from nvil.data.checks import data_seed, fraction
from nvil.data.dataset import SPLITS, Dataset
from nvil.data.values import first_bad, refusal, rule

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
    values = _counts(path, arrays["data"])
    if fmt == "csr":
        lengths = np.diff(arrays["indptr"])
        rows = torch.from_numpy(np.repeat(np.arange(n_docs), lengths))
        cols = torch.from_numpy(arrays["indices"].astype(np.int64))
    else:
        rows = torch.from_numpy(arrays["row"].astype(np.int64))
        cols = torch.from_numpy(arrays["col"].astype(np.int64))
    check_counts(path, values, rows, cols)
    values = values.float()  # exact: every count is an integer of at most 2**24
    try:  # a user's file: check the indices against the shape rather than trust them
        return torch.sparse_coo_tensor(torch.stack([rows.long(), cols]), values, (n_docs, vocab),
                                       check_invariants=True).coalesce()
    except RuntimeError as e:
        raise DataError(f"{path} is not a valid sparse matrix ({str(e).splitlines()[0][:120]})") from None


def _counts(path: Path, data: np.ndarray) -> torch.Tensor:
    """A file's stored counts, in float64 (exact for every integer a count may be); numbers only."""
    if not (data.dtype == bool or np.issubdtype(data.dtype, np.integer) or np.issubdtype(data.dtype, np.floating)):
        raise DataError(f"{path} must hold non-negative integer word counts, not values of type {data.dtype}")
    return torch.from_numpy(data.astype(np.float64))


def check_counts(path: Path, values: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> None:
    """``DataError`` naming the file and the first stored count that is not a non-negative integer of at most 2**24
    (``nvil.data.values``): NaN, infinity, 1e30 and 2.5 are refused here, before anything is rounded to float32."""
    i = first_bad(values, rule("counts")[0])
    if i is not None:
        position = f"row {int(rows[i])}, column {int(cols[i])}" if i < min(len(rows), len(cols)) else f"entry {i}"
        raise refusal(str(path), float(values[i]), position, "counts")


def _select_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    if not x.is_sparse:
        return x[idx]
    rows = x.index_select(0, idx).coalesce()
    return rows.to_dense() if rows.shape[0] * rows.shape[1] <= DENSE_LIMIT else rows


def split_documents(x: torch.Tensor, test: torch.Tensor | None, *, num_valid: int, test_fraction: float,
                    seed: int) -> dict[str, torch.Tensor]:
    """train / valid / test: a ``seed``-ed random ``num_valid`` documents held out for validation (100 in the
    NVIL paper) and, without a separate ``test`` matrix, a ``test_fraction`` of the documents for testing."""
    n = x.shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(data_seed(seed)))
    n_test = 0 if test is not None else int(round(fraction(test_fraction, "test_fraction") * n))
    n_valid = positive_int(num_valid, "data.num_valid")
    if n - n_test - n_valid < 1:
        raise ConfigError(f"{n} documents cannot be split into {n_valid} for validation, {n_test} for testing "
                          "and some for training")
    splits = {"valid": _select_rows(x, perm[:n_valid]), "train": _select_rows(x, perm[n_valid + n_test:])}
    if test is not None:
        splits["test"] = _select_rows(test, torch.arange(test.shape[0]))
    else:
        splits["test"] = _select_rows(x, perm[n_valid:n_valid + n_test])
    return splits


def bow_data(*, path: str | os.PathLike | None = None, test_path: str | os.PathLike | None = None,
             test_fraction: float = 0.1, num_valid: int = 100, seed: int = 0) -> Dataset:
    """``data=bow`` (configs/data/bow.yaml): a scipy.sparse document-by-word count matrix (``save_npz``, CSR or COO).

    For models with ``model.visible=multinomial`` (evaluate.py then reports perplexity per word). A split small
    enough is kept dense, a larger one as a sparse COO tensor densified a minibatch at a time.

    Parameters
    ----------
    path : str or os.PathLike or None, default None
        The FILE.npz, required.
    test_path : str or os.PathLike or None, default None
        An optional separate test matrix (the same vocabulary); without it ``test_fraction`` of ``path``'s documents
        are held out for testing.
    test_fraction : float, default 0.1
        The fraction of the documents held out for testing when there is no ``test_path``, in [0, 1).
    num_valid : int, default 100
        Documents held out for validation (the NVIL paper's protocol).
    seed : int, default 0
        Seeds the random split.

    Returns
    -------
    Dataset
        ``bow`` with ``binarize="counts"``: ``[n, vocabulary]`` word counts per split, no labels.

    Raises
    ------
    ConfigError
        If ``path`` is not given, ``path`` or ``test_path`` is not a file path, or the split is impossible (too few
        documents, a bad fraction or seed).
    DataError
        If a file is missing or not a valid count matrix, holds a count that is not a non-negative integer of at most
        2**24, or the test matrix's vocabulary differs from ``path``'s.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> from nvil.data import bow_data
    >>> counts = np.arange(60).reshape(30, 2) % 4                    # 30 documents over 2 words
    >>> indptr = np.concatenate([[0], np.cumsum((counts > 0).sum(1))])
    >>> indices = np.nonzero(counts)[1]
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = os.path.join(d, "docs.npz")                       # as scipy.sparse.save_npz writes a CSR matrix
    ...     np.savez(path, format="csr", shape=np.array(counts.shape), data=counts[counts > 0], indices=indices,
    ...              indptr=indptr)
    ...     data = bow_data(path=path, num_valid=5, test_fraction=0.2)
    >>> data.binarize, {name: tuple(x.shape) for name, x in data.splits.items()}
    ('counts', {'valid': (5, 2), 'train': (19, 2), 'test': (6, 2)})
    >>> int(sum(x.sum() for x in data.splits.values())) == int(counts.sum())
    True
    """
    if not path:
        raise ConfigError("data=bow needs data.path=FILE.npz (a scipy.sparse document-by-word count matrix)")
    for key, value in (("path", path), ("test_path", test_path)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise ConfigError(f"data.{key} must be a file path (FILE.npz), got {value!r}")
    x = load_count_matrix(path)
    test = load_count_matrix(test_path) if test_path else None
    if test is not None and test.shape[1] != x.shape[1]:
        raise DataError(f"{test_path} has a vocabulary of {test.shape[1]} words, {path} of {x.shape[1]}")
    splits = split_documents(x, test, num_valid=num_valid, test_fraction=test_fraction, seed=seed)
    return Dataset("bow", splits, {s: None for s in SPLITS}, "counts", data_seed(seed))
