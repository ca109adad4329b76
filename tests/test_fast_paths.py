"""The fast-path registry (nvil/backend/registry.py): every entry names a function and a definition that exist and a
test file that exists, and every module of nvil/backend/native is registered; a module added without an entry, or
an entry naming a missing function or test, is caught."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from nvil.backend import registry
from nvil.backend.registry import FAST_PATHS, FastPath

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "nvil" / "backend" / "native"


def resolve(dotted: str):
    """The object a dotted name names: its longest importable prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def module_of(dotted: str) -> str:
    """The module that defines the function a dotted name names."""
    return resolve(dotted).__module__


def native_modules(folder: Path = NATIVE) -> set[str]:
    """nvil.backend.native and each module of its folder."""
    names = {p.stem for p in folder.glob("*.py")}
    return {"nvil.backend.native" + ("" if n == "__init__" else f".{n}") for n in names}


def problems(paths: dict[str, FastPath], folder: Path = NATIVE) -> list[str]:
    out = []
    for key, p in paths.items():
        for field in ("function", "definition"):
            try:
                if not callable(resolve(getattr(p, field))):
                    out.append(f"{key}: {field} {getattr(p, field)} is not callable")
            except (ImportError, AttributeError):
                out.append(f"{key}: {field} {getattr(p, field)} does not exist")
        if not (ROOT / p.test).is_file():
            out.append(f"{key}: test {p.test} does not exist")
        if not p.gain or not p.workload:
            out.append(f"{key}: no measured gain or workload")
    registered = set()
    for p in paths.values():
        try:
            registered.add(module_of(p.function))
        except (ImportError, AttributeError):
            pass
    out += [f"{m} is not in the registry" for m in sorted(native_modules(folder) - registered)]
    return out


def test_every_entry_exists_and_every_native_module_is_registered():
    assert not problems(FAST_PATHS)


def test_the_entries_are_frozen_and_documented():
    entry = next(iter(FAST_PATHS.values()))
    with pytest.raises(AttributeError):
        entry.gain = "10x"  # type: ignore[misc]
    assert "1.5x" in registry.__doc__


def test_a_native_module_without_an_entry_is_caught(tmp_path):
    for p in NATIVE.glob("*.py"):
        (tmp_path / p.name).write_text("")
    (tmp_path / "fake_kernel.py").write_text("")
    assert problems(FAST_PATHS, tmp_path) == ["nvil.backend.native.fake_kernel is not in the registry"]


@pytest.mark.parametrize("field, value", [("function", "nvil.backend.native.no_such_kernel"),
                                          ("definition", "nvil.core.ops.no_such_definition"),
                                          ("test", "tests/test_no_such_file.py")])
def test_an_entry_naming_something_missing_is_caught(field, value):
    key, entry = next(iter(FAST_PATHS.items()))
    broken = dict(FAST_PATHS, **{key: FastPath(**{**entry.__dict__, field: value})})
    found = problems(broken)
    assert len(found) == 1 and value in found[0]
