"""Checks of the numbers in a data config: every size, seed, fraction and binarisation is checked before it is
used, so a bad value is a one-line ``ConfigError`` rather than a silent slice (``num_train=-1``) or coercion."""

from __future__ import annotations

from nvil.core.config import positive_int
from nvil.core.errors import ConfigError
from nvil.data.dataset import BINARIZATIONS, SPLITS


def data_seed(cfg, key: str = "seed") -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"data.{key} must be a non-negative integer, got {value!r}")
    return value


def split_sizes(cfg) -> dict[str, int]:
    """num_train, num_valid and num_test of a simulated dataset: positive whole numbers, never truncated."""
    return {s: positive_int(cfg.get(f"num_{s}"), f"data.num_{s}") for s in SPLITS}


def fraction(cfg, key: str, default: float) -> float:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(f"data.{key} must be a fraction in [0, 1), got {value!r}")
    return float(value)


def binarization(cfg) -> str:
    """``data.binarize`` of an image dataset: one of ``BINARIZATIONS`` (``fixed`` when not given)."""
    value = cfg.get("binarize", "fixed")
    if value not in BINARIZATIONS:
        raise ConfigError(f"data.binarize must be one of {list(BINARIZATIONS)}, got {value!r}")
    return value
