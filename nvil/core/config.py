"""Config checks that turn bad values into one-line errors, and device resolution."""

from __future__ import annotations

import importlib.resources
import math
from pathlib import Path

import torch

from nvil.core.errors import ConfigError

CONFIG_DIR = Path(str(importlib.resources.files("nvil.configs")))  # configs/ in the checkout, or the installed copy
GROUPS = ("model", "learner", "data", "estimator", "experiment", "trainer", "final_eval", "debug")


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu; ``cuda`` without CUDA is a config error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not str(name).startswith("cuda:"):
        raise ConfigError(f"device must be cpu, cuda or auto, got {name!r}")
    if str(name).startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name} was asked for but CUDA is not available on this machine")
    return torch.device(name)


def positive_int(value, key: str, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    return value


def positive_float(value, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{key} must be a positive number, got {value!r}")
    return float(value)


def check_group_choices(argv: list[str], config_dir: Path = CONFIG_DIR) -> None:
    """Reject ``model=foo`` and the like before Hydra does, with one line naming the known choices."""
    for arg in argv:
        if "=" not in arg or arg.startswith("-"):
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if key not in GROUPS or value in ("", "null"):
            continue
        known = sorted(p.stem for p in (config_dir / key).glob("*.yaml") if not p.stem.startswith("_"))
        for choice in value.split(","):
            if choice not in known:
                raise ConfigError(f"unknown {key} {choice!r}; known: {', '.join(known)}")


def estimator_config(value):
    """An estimator config, or a bare name (``final_eval.estimator=exact``) loaded from configs/estimator/,
    with its defaults list (``- ais``, ``- /log_z@log_z: ais``) resolved as Hydra would."""
    if not isinstance(value, str):
        return value
    path = CONFIG_DIR / "estimator" / f"{value}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (CONFIG_DIR / "estimator").glob("*.yaml"))
        raise ConfigError(f"unknown estimator {value!r}; known: {', '.join(known)}")
    return _load_with_defaults(path)


def _load_with_defaults(path: Path):
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(path)
    merged = OmegaConf.create()
    for entry in cfg.pop("defaults", []):
        if entry == "_self_":
            continue
        if isinstance(entry, str):  # same group
            merged = OmegaConf.merge(merged, _load_with_defaults(path.parent / f"{entry}.yaml"))
        else:  # {"/group@package": option}
            (key, option), = entry.items()
            group, _, package = key.lstrip("/").partition("@")
            merged = OmegaConf.merge(merged, {package or group: _load_with_defaults(CONFIG_DIR / group / f"{option}.yaml")})
    return OmegaConf.merge(merged, cfg)
