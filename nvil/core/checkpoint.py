"""Checkpoints: versioned, written atomically, loaded with ``weights_only=True``.

A checkpoint is a plain dict of tensors and primitives (no pickled objects):
format, format_version, config (the resolved run config), model_name, n_visible, model, inference,
learner (baselines, running moments, optimiser, generator), step, best_score, loop state and RNG state.
The model is rebuilt from ``models.MODELS[model_name]``, never from a class path stored in the file.
"""

from __future__ import annotations

import codecs
import os
import pickle
import re
import warnings
import zipfile
from pathlib import Path

import torch

from nvil.core.errors import CheckpointError

FORMAT = "nvil-checkpoint"
FORMAT_VERSION = 1
REQUIRED_KEYS = ("format", "format_version", "config", "model_name", "n_visible", "model")

ZIP_MAGIC = b"PK\x03\x04"  # torch.save's default (zip) format
PICKLE_MAGIC = b"\x80"  # torch.save's legacy format: a protocol-2 pickle
HEAD_BYTES = 4096  # how much of a file is read to tell what it is
# What the weights_only unpickler says when a file asks for code beyond tensors and plain data.
_REFUSALS = ("Unsupported global", "is blocked", "Trying to call reduce for unrecognized function",
             "Can only create new object", "must be imported to load")
_PASS_A_PT = "pass a .pt file such as checkpoints/best.pt"
# Text files this project writes next to checkpoints: (name suffix, what it is).
_SIDECARS = ((".eval.jsonl", "the evaluation log that evaluate.py appends to beside a checkpoint"),
             (".log_z.json", "the log Z cache that the DBN estimators keep beside a checkpoint"))


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
    """Load and validate a checkpoint of this package (``load_weights_only``, then its fields type-checked here, so
    a damaged file never fails later inside a model build); every failure is a one-line ``CheckpointError``."""
    payload = load_weights_only(path, map_location)
    _check_payload(payload, path)
    return payload


def load_weights_only(path: str | Path, map_location="cpu"):
    """What ``torch.save`` wrote at ``path``, read with ``torch.load(weights_only=True)`` (tensors and plain data;
    a file that asks to build any other object is refused); every failure is a one-line ``CheckpointError``.

    The first bytes are checked before torch reads the file: ``torch.save`` writes a zip archive
    (``PK\\x03\\x04``) or, in its legacy format, a pickle (``\\x80``), so anything else (a config, an evaluation
    log, an empty file) is named for what it is. Whatever ``torch.load`` raises on a damaged file also becomes a
    ``CheckpointError``.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path}")
    if not path.is_file():
        raise CheckpointError(f"checkpoint path is not a file: {path}")
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e.strerror or type(e).__name__}") from None
    if not head.startswith((ZIP_MAGIC, PICKLE_MAGIC)):
        raise CheckpointError(_not_a_checkpoint(path, head))
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 78": the error below says it better
            warnings.simplefilter("ignore")
            payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        message = str(e)
        if any(s in message for s in _REFUSALS):
            named = re.search(r"GLOBAL (\S+)", message)  # the class or function the file asks to import
            what = f" ({_printable(named.group(1))[:80]})" if named else ""
            raise CheckpointError(
                f"checkpoint {path} contains pickled Python objects beyond tensors and plain data{what}; "
                "refusing to load it (only weights_only checkpoints are accepted)"
            ) from None
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({_unpickler_detail(message)})") from None
    except MemoryError:
        raise CheckpointError(f"checkpoint {path} is corrupt or too large: out of memory while loading it") from None
    except Exception as e:  # noqa: BLE001 - a damaged file makes the unpickler raise nearly any type
        if isinstance(e, torch.OutOfMemoryError):
            raise CheckpointError(f"not enough memory on {map_location} to load checkpoint {path}") from None
        if head.startswith(ZIP_MAGIC) and _foreign_zip(path):
            raise CheckpointError(f"{path} is a zip archive that torch.save did not write (a NumPy .npz, say), "
                                  f"not a checkpoint; {_PASS_A_PT}") from None
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({_first_line(e)})") from None
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


# ---- what a file is, when it is not a checkpoint --------------------------------------------------------


def _not_a_checkpoint(path: Path, head: bytes) -> str:
    if not head:
        return f"{path} is an empty file, not a checkpoint; {_PASS_A_PT}"
    text = _as_text(head)
    if text is None:
        return (f"{path} is not a checkpoint: torch.save writes a zip archive (starting PK) or a pickle, and this "
                f"file starts with the bytes {head[:4].hex(' ')}; {_PASS_A_PT}")
    if text.startswith("version https://git-lfs"):
        return f"{path} is a Git LFS pointer, not the checkpoint it stands for; fetch it with `git lfs pull`"
    for suffix, what in _SIDECARS:
        if path.name.endswith(suffix):
            owner = path.with_name(path.name[: -len(suffix)])
            hint = f"pass the checkpoint itself, {owner}" if owner.is_file() else _PASS_A_PT
            return f"{path} is {what}, not a checkpoint; {hint}"
    if path.suffix in (".yaml", ".yml") and _looks_like_run_config(text):
        run_dir = path.parent.parent if path.parent.name == ".hydra" else path.parent
        return (f"{path} is the config of a training run, not a checkpoint; pass one of the run's checkpoints, "
                f"such as {run_dir / 'checkpoints' / 'best.pt'}")
    return f"{path} is a text file (it looks like {_text_kind(path, text)}), not a checkpoint; {_PASS_A_PT}"


def _as_text(head: bytes) -> str | None:
    """The file's head as text when it decodes as UTF-8 (a character cut at the end is allowed) and holds no
    control characters beyond whitespace; otherwise None."""
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return None
    text = text.lstrip("\ufeff")
    if any(not (c.isprintable() or c in "\t\n\r\f\v") for c in text):
        return None
    return text


def _looks_like_run_config(text: str) -> bool:
    keys = {m.group(1) for m in re.finditer(r"^([A-Za-z_][\w-]*):", text, re.MULTILINE)}
    return len(keys & {"model", "data", "learner", "trainer", "estimator"}) >= 2


def _text_kind(path: Path, text: str) -> str:
    start = text.lstrip()
    if path.suffix in (".json", ".jsonl") or start.startswith(("{", "[")):
        return "JSON"
    if path.suffix in (".yaml", ".yml") or start.startswith("---") or re.match(r"[\w.-]+:(\s|$)", start):
        return "YAML"
    return "plain text"


def _foreign_zip(path: Path) -> bool:
    """A readable zip archive without the ``data.pkl`` that every torch.save archive holds."""
    try:
        with zipfile.ZipFile(path) as z:
            return not any(name.endswith("data.pkl") for name in z.namelist())
    except Exception:  # noqa: BLE001 - not even a readable zip: a damaged checkpoint, reported as such
        return False


# ---- the payload's fields ----------------------------------------------------------------------------------


def _check_payload(payload, path: Path) -> None:
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an nvil checkpoint (no '{FORMAT}' header)")
    missing = [k for k in REQUIRED_KEYS if k not in payload]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {', '.join(missing)}")

    def damaged(key: str, expected: str):
        return CheckpointError(f"checkpoint {path} is damaged: its {key} is {_show(_get(payload, key))}, "
                               f"expected {expected}")

    version = payload["format_version"]
    if not _is_int(version) or version < 1:
        raise damaged("format_version", "a positive integer")
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {version}, newer than this "
            f"code's {FORMAT_VERSION}; upgrade nvil to read it"
        )
    if not isinstance(payload["config"], dict) or not _is_plain(payload["config"]):
        raise damaged("config", "a dict of plain values (the run's resolved config)")
    for section in ("model", "data"):
        if not isinstance(payload["config"].get(section), dict):
            raise damaged(f"config.{section}", f"a dict (the run's {section} config)")
    if not isinstance(payload["model_name"], str):
        raise damaged("model_name", "a model name such as 'sbn'")
    if not _is_int(payload["n_visible"]) or payload["n_visible"] < 1:
        raise damaged("n_visible", "a positive integer")
    if not _is_state_dict(payload["model"]):
        raise damaged("model", "a state dict (names mapped to tensors)")
    if payload.get("inference") is not None and not _is_state_dict(payload["inference"]):
        raise damaged("inference", "a state dict (names mapped to tensors) or None")
    for key in ("step", "world_size"):
        if key in payload and (not _is_int(payload[key]) or payload[key] < (1 if key == "world_size" else 0)):
            raise damaged(key, "a non-negative integer" if key == "step" else "a positive integer")
    if payload.get("best_score") is not None and (isinstance(payload["best_score"], bool)
                                                   or not isinstance(payload["best_score"], (int, float))):
        raise damaged("best_score", "a number or None")
    for key in ("loop", "learner"):
        if payload.get(key) is not None and not isinstance(payload[key], dict):
            raise damaged(key, "a dict")
    if "loop" in payload and not all(isinstance(k, str) for k in payload["loop"]):
        raise damaged("loop", "a dict of the loop's counters")
    if "rng" in payload:
        rng = payload["rng"].get("torch") if isinstance(payload["rng"], dict) else None
        if not (isinstance(rng, torch.Tensor) and rng.dtype == torch.uint8):
            raise damaged("rng", "a dict holding the torch RNG state (a uint8 tensor)")
    if "ranks" in payload and not (isinstance(payload["ranks"], list)
                                   and all(isinstance(r, dict) for r in payload["ranks"])):
        raise damaged("ranks", "a list of per-rank dicts")


def _get(payload: dict, dotted: str):
    value = payload
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_state_dict(value) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                           for k, v in value.items())


def _is_plain(value, depth: int = 0) -> bool:
    """A config as ``OmegaConf.to_container`` gives it: str-keyed dicts, lists and primitives."""
    if depth > 50:
        return False
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v, depth + 1) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v, depth + 1) for v in value)
    return value is None or isinstance(value, (str, int, float, bool))


def _show(value) -> str:
    if value is None:
        return "missing (or null)"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    text = " ".join(repr(value).split())
    return f"{text if len(text) <= 60 else text[:57] + '...'} (type {type(value).__name__})"


def _unpickler_detail(message: str) -> str:
    """The unpickler's own reason, without torch's advice about weights_only (which does not apply here)."""
    reason = re.search(r"WeightsUnpickler error: (.*)", message, re.DOTALL)
    return _first_line(reason.group(1) if reason else message)


def _first_line(e) -> str:
    """The first line of an error (or message), printable, at most 200 characters; named by its type where the
    text alone would not say what went wrong (``KeyError: 101``)."""
    text = str(e).strip().splitlines()
    line = _printable(text[0][:200]) if text else ""
    if isinstance(e, BaseException) and not isinstance(e, (RuntimeError, OSError, pickle.UnpicklingError)):
        return f"{type(e).__name__}: {line}" if line else type(e).__name__
    return line or type(e).__name__


def _printable(text: str) -> str:
    """Text from a damaged file, safe to print on one line of a terminal."""
    return "".join(c if c.isprintable() else "?" for c in text)
