"""Checkpoints: versioned, written atomically, loaded with ``weights_only=True``.

A checkpoint is a plain dict of tensors and primitives (no pickled objects):
format, format_version, config (the resolved run config), model_name, n_visible, model, inference,
learner (baselines, running moments, optimiser, generator), step, best_score, loop state and RNG state.
The model is rebuilt from ``models.MODELS[model_name]``, never from a class path stored in the file.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

import torch

from nvil.errors import CheckpointError

FORMAT = "nvil-checkpoint"
FORMAT_VERSION = 1
REQUIRED_KEYS = ("format", "format_version", "config", "model_name", "n_visible", "model")


def save_checkpoint(path: str | Path, payload: dict) -> None:
    """Write to a temporary file in the same directory, flush it to disk, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    payload = {"format": FORMAT, "format_version": FORMAT_VERSION, **payload}
    try:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def load_checkpoint(path: str | Path, map_location="cpu") -> dict:
    """Load and validate a checkpoint; every failure is a one-line ``CheckpointError``."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path}")
    if not path.is_file():
        raise CheckpointError(f"checkpoint path is not a file: {path}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights_only" in str(e) or "Unsupported global" in str(e) or "Weights only load failed" in str(e):
            raise CheckpointError(
                f"checkpoint {path} contains pickled Python objects beyond tensors and plain data; "
                "refusing to load it (only weights_only checkpoints are accepted)"
            ) from None
        raise CheckpointError(f"checkpoint {path} is corrupt: {_first_line(e)}") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({_first_line(e)})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an nvil checkpoint (no '{FORMAT}' header)")
    missing = [k for k in REQUIRED_KEYS if k not in payload]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {', '.join(missing)}")
    if payload["format_version"] > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {payload['format_version']}, newer than this "
            f"code's {FORMAT_VERSION}; upgrade nvil to read it"
        )
    return payload


def load_module_state(module: torch.nn.Module, state: dict, what: str, path) -> None:
    """``load_state_dict`` with a one-line error when the checkpoint holds another architecture."""
    try:
        module.load_state_dict(state)
    except RuntimeError as e:
        detail = " ".join(str(e).split())
        raise CheckpointError(
            f"checkpoint {path} does not match this {what}: {detail[:300]}"
        ) from None


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__
