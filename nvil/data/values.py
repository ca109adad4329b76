"""Checks of a dataset's values, at load time: a value no model can learn from is a one-line ``DataError`` naming the
dataset (or file), the split and the first bad row and column, rather than a run whose every score is NaN.

What each kind of data (``Dataset.binarize``) may hold (``VALID``):

- binary images (``fixed``, ``threshold``; grey levels for ``dynamic`` training data): values in [0, 1];
- word counts (``counts``): non-negative integers of at most 2**24, the largest float32 holds exactly (one count above
  it would be rounded silently, and one as large as 1e30 swamps every score);
- real-valued data (``continuous``): finite, with |x| at most 1e15 (squared, that is already 1e30 per dimension).

NaN and infinity fail every kind.
"""

from __future__ import annotations

from typing import Callable

import torch

from nvil.core.errors import DataError

MAX_COUNT = 2**24
MAX_ABS_REAL = 1e15


def _binary(x: torch.Tensor) -> torch.Tensor:
    return (x >= 0) & (x <= 1)


def _counts(x: torch.Tensor) -> torch.Tensor:
    return (x >= 0) & (x <= MAX_COUNT) & (x == x.round())


def _real(x: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(x) & (x.abs() <= MAX_ABS_REAL)


# kind -> (which values are valid, what they must be in words)
VALID: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], str]] = {
    "counts": (_counts, f"word counts must be non-negative integers of at most 2**24 = {MAX_COUNT:,}"),
    "continuous": (_real, f"real values must be finite, with |x| at most {MAX_ABS_REAL:g}"),
    "binary": (_binary, "binary data (or the grey levels it is drawn from) must lie in [0, 1]"),
}


def rule(kind: str) -> tuple[Callable[[torch.Tensor], torch.Tensor], str]:
    """The ``VALID`` entry of a ``Dataset.binarize`` value: ``counts``, ``continuous``, else binary."""
    return VALID.get(kind, VALID["binary"])


def first_bad(values: torch.Tensor, ok: Callable[[torch.Tensor], torch.Tensor]) -> int | None:
    """The flat index of the first entry of ``values`` that ``ok`` refuses (NaN never passes a comparison), or None."""
    bad = ~ok(values)
    if not bool(bad.any()):
        return None
    return int(bad.reshape(-1).nonzero()[0, 0])


def bad_entry(x: torch.Tensor, ok: Callable[[torch.Tensor], torch.Tensor]) -> tuple[int, int, float] | None:
    """(row, column, value) of the first entry of the dense or sparse COO matrix ``x`` that ``ok`` refuses, or None.
    A sparse matrix's implicit zeros are valid in every kind."""
    if x.is_sparse:
        x = x.coalesce()
        values = x.values()
        i = first_bad(values, ok)
        if i is None:
            return None
        row, col = (int(v) for v in x.indices()[:, i])
        return row, col, float(values[i])
    i = first_bad(x, ok)
    if i is None:
        return None
    row, col = divmod(i, x.shape[1])
    return row, col, float(x[row, col])


def refusal(where: str, value: float, position: str, kind: str) -> DataError:
    """The one-line error for a bad ``value`` at ``position`` (e.g. "row 3, column 7") of ``where``."""
    return DataError(f"{where} has the value {value:g} at {position} (counting from 0); {rule(kind)[1]}")


def check_values(where: str, x: torch.Tensor, kind: str) -> None:
    """``DataError`` naming ``where`` (the dataset and split, or the file) and the first bad row and column when the
    matrix ``x`` holds a value its ``kind`` of data may not (``VALID``)."""
    found = bad_entry(x if x.is_floating_point() else x.double(), rule(kind)[0])
    if found is not None:
        row, col, value = found
        raise refusal(where, value, f"row {row}, column {col}", kind)
