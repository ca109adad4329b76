"""Checks of the values a dataset builder takes: every size, seed, fraction and binarisation is checked before it
is used, so a bad value is a one-line ``ConfigError`` naming the config key (``data.KEY``) rather than a silent
slice (``num_train=-1``) or coercion. The builders call these with their typed keywords, so a notebook's call is
checked exactly as a config's."""

from __future__ import annotations

import math
from collections.abc import Sequence

from nvil.core.config import positive_int
from nvil.core.errors import ConfigError
from nvil.data.dataset import BINARIZATIONS


def data_seed(value, key: str = "seed") -> int:
    """``data.seed`` (or ``data.model_seed``): a non-negative integer."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"data.{key} must be a non-negative integer, got {value!r}")
    return value


def split_sizes(num_train, num_valid, num_test) -> dict[str, int]:
    """num_train, num_valid and num_test of a simulated dataset: positive whole numbers, never truncated."""
    return {"train": positive_int(num_train, "data.num_train"), "valid": positive_int(num_valid, "data.num_valid"),
            "test": positive_int(num_test, "data.num_test")}


def fraction(value, key: str) -> float:
    """``data.KEY``: a fraction in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(f"data.{key} must be a fraction in [0, 1), got {value!r}")
    return float(value)


def binarization(value) -> str:
    """``data.binarize`` of an image dataset: one of ``BINARIZATIONS``."""
    if value not in BINARIZATIONS:
        raise ConfigError(f"data.binarize must be one of {list(BINARIZATIONS)}, got {value!r}")
    return value


def layer_sizes(value) -> list[int]:
    """``data.layers`` of a generating SBN: a non-empty list of positive integers."""
    if (isinstance(value, str) or not isinstance(value, Sequence) or not len(value)
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in value)):
        raise ConfigError(f"data.layers must be a non-empty list of positive integers such as [4, 3], got {value!r}")
    return list(value)


def non_negative(value, key: str) -> float:
    """``data.KEY``: a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0 and math.isfinite(value)):
        raise ConfigError(f"data.{key} must be a non-negative number, got {value!r}")
    return float(value)
