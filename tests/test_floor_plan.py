"""The floor plan (DESIGN.md, "Layers"), checked by reading the source with ``ast``: no import cycle, no
project import hidden inside a function, each folder importing only the folders below it, no oversized file and a
flat training loop; the installed package is every folder with code, and importing ``nvil`` changes nothing in the
process. Each rule has a broken input that must trip it, so the checks have power."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"nvil": "nvil", "models": "nvil.models", "estimators": "nvil.estimators"}  # checkout folder -> package
MAX_LINES = 300
MAX_FIT_LINES = 70

# The floors, from the ground up: each folder imports only its own floor and those below it. ``nvil`` itself
# (the package's face: ``nvil.train`` / ``nvil.evaluate``, loaded on first use) and the entry scripts stand on top.
FLOORS = [("nvil.core",), ("nvil.backend",), ("nvil.models",), ("nvil.mcmc", "nvil.data"), ("nvil.estimators",),
          ("nvil.learners",), ("nvil.app",), ("nvil",)]


def layer(module: str) -> str:
    """The folder (floor) a module belongs to: the longest of ``FLOORS``' names that prefixes it."""
    names = [name for floor in FLOORS for name in floor]
    return max((n for n in names if module == n or module.startswith(n + ".")), key=len)


def floor(module: str) -> int:
    name = layer(module)
    return next(i for i, names in enumerate(FLOORS) if name in names)


def module_files(root: Path = ROOT) -> dict[str, Path]:
    files = {}
    for folder, package in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            name = ".".join((package, *path.relative_to(root / folder).with_suffix("").parts))
            files[name.removesuffix(".__init__")] = path
    return files


def _resolve(target: str, modules) -> str | None:
    """The module that ``import target`` / ``from a import b`` (target a.b) loads from the project, if any."""
    while target:
        if target in modules:
            return target
        target = target.rpartition(".")[0]
    return None


def imports(source: str, name: str, modules) -> tuple[set[str], list[tuple[int, str]]]:
    """(project modules imported at module level, [(line, module)] imported inside a function or class)."""
    tree = ast.parse(source)
    top, hidden = set(), []

    def visit(node, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
            targets = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                targets = [f"{child.module}.{a.name}" for a in child.names]
            for t in targets:
                found = _resolve(t, modules)
                if found and found != name:
                    (hidden.append((child.lineno, found)) if nested else top.add(found))
            visit(child, inner)

    visit(tree, False)
    return top, hidden


def import_graph(files: dict[str, Path], root: Path = ROOT) -> tuple[dict[str, set[str]], list[str]]:
    graph, hidden = {}, []
    for name, path in files.items():
        graph[name], late = imports(path.read_text(), name, files)
        hidden += [f"{path.relative_to(root)}:{line} imports {m} inside a function" for line, m in late]
    return graph, hidden


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that climb: a module importing one on a higher floor, or a folder beside its own on the same floor."""
    return [f"{a} ({layer(a)}) imports {b} ({layer(b)})" for a, targets in sorted(graph.items())
            for b in sorted(targets)
            if floor(b) > floor(a) or (floor(b) == floor(a) and layer(b) != layer(a))]


def test_no_import_cycle_and_no_hidden_import():
    graph, hidden = import_graph(module_files())
    assert not cycles(graph), f"import cycles: {cycles(graph)}"
    assert not hidden, "\n".join(hidden)


def test_layers_import_only_downwards():
    graph, _ = import_graph(module_files())
    assert not layer_violations(graph), "\n".join(layer_violations(graph))
    scripts = {"train", "evaluate"}
    assert not any(t.split(".")[0] in scripts for targets in graph.values() for t in targets)


def test_the_checks_have_power(tmp_path):
    """A cycle, a function-level import, a model importing an estimator and the kernel importing the backend are
    each caught."""
    for folder in ("nvil", "nvil/core", "nvil/backend", "models", "estimators"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "models" / "a.py").write_text("from nvil.estimators.b import f\n")
    (tmp_path / "estimators" / "b.py").write_text("from nvil.models.a import g\n\ndef f():\n    import nvil.core.ops\n")
    (tmp_path / "nvil" / "core" / "ops.py").write_text("from nvil.backend import accel\n")
    (tmp_path / "nvil" / "backend" / "accel.py").write_text("")
    graph, hidden = import_graph(module_files(tmp_path), tmp_path)
    assert cycles(graph) == [["nvil.estimators.b", "nvil.models.a"]]
    assert hidden == ["estimators/b.py:4 imports nvil.core.ops inside a function"]
    assert layer_violations(graph) == ["nvil.core.ops (nvil.core) imports nvil.backend.accel (nvil.backend)",
                                       "nvil.models.a (nvil.models) imports nvil.estimators.b (nvil.estimators)"]


IMPORT_PROBE = """
import builtins, json, logging, os, sys, warnings
import torch
opened, forks = [], []
_open, _fork = builtins.open, os.register_at_fork
builtins.open = lambda f, *a, **k: (opened.append(str(f)), _open(f, *a, **k))[1]
os.register_at_fork = lambda **k: (forks.append(sorted(k)), _fork(**k))[1]
before = (dict(os.environ), torch.get_num_threads(), torch.get_default_dtype(), len(warnings.filters),
          len(logging.getLogger().handlers), torch.are_deterministic_algorithms_enabled())
import nvil, nvil.models, nvil.estimators
from nvil.backend import gemm
after = (dict(os.environ), torch.get_num_threads(), torch.get_default_dtype(), len(warnings.filters),
         len(logging.getLogger().handlers), torch.are_deterministic_algorithms_enabled())
builtins.open, os.register_at_fork = _open, _fork
changed = sorted(k for k in set(before[0]) | set(after[0]) if before[0].get(k) != after[0].get(k))
print(json.dumps({"environ": changed, "process": [str(a) for a, b in zip(before[1:], after[1:]) if a != b],
                  "proc_files": [f for f in opened if f.startswith("/proc")], "at_fork": forks,
                  "gemm_chosen": gemm._backend is not None, "loop": "nvil.app.loop" in sys.modules,
                  "hydra": "hydra" in sys.modules, "train": callable(nvil.train)}))
"""
NOTHING_CHANGED = {"environ": [], "process": [], "proc_files": [], "at_fork": [], "gemm_chosen": False,
                   "loop": False, "hydra": False, "train": True}


def import_probe(code: str = IMPORT_PROBE) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "TORCHINDUCTOR_CACHE_DIR")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_nvil_changes_nothing_in_the_process():
    """``import nvil`` (and its models and estimators) in a fresh process leaves ``os.environ``, torch's threads,
    default dtype and determinism, the warning filters and the root logger as they were; reads nothing under /proc
    (the CPU is read where a product first needs it); installs no at-fork hook; loads neither the training loop nor
    Hydra; ``nvil.train`` is there, loaded on first use."""
    assert import_probe() == NOTHING_CHANGED


def test_the_import_probe_sees_a_side_effect():
    """The broken variant: an import that registers an at-fork hook, reads /proc/cpuinfo and adds a warning filter
    must be seen."""
    code = IMPORT_PROBE.replace("import nvil, nvil.models, nvil.estimators",
                                "import nvil, nvil.models, nvil.estimators; os.register_at_fork(after_in_child=list); "
                                "open('/proc/cpuinfo').close(); warnings.simplefilter('ignore', UserWarning)")
    seen = import_probe(code)
    assert seen["at_fork"] == [["after_in_child"]] and seen["proc_files"] == ["/proc/cpuinfo"]
    assert len(seen["process"]) == 1  # the warning filters


def code_lines(source: str) -> int:
    """The file's lines less those of its docstrings (module, class and function): the reference's Parameters,
    Returns and Examples sections document a module without making it bigger."""
    docstring_lines = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                docstring_lines += first.end_lineno - first.lineno + 1
    return len(source.splitlines()) - docstring_lines


def test_no_oversized_file():
    long = {str(p.relative_to(ROOT)): n for p in module_files().values()
            if (n := code_lines(p.read_text())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines of code (docstrings left out): {long}"


def test_code_lines_leave_out_docstrings_only():
    """The broken variant: a docstring-free file of 301 lines is over the limit; the same code behind a long
    docstring counts the same."""
    code = "\n".join(f"x{i} = {i}" for i in range(301))
    assert code_lines(code) == 301
    assert code_lines('"""' + "doc\n" * 50 + '"""\n' + code) == 301
    assert code_lines("def f():\n    'a\\n b'\n    return 1\n") == 2


def function_lines(path: Path, name: str) -> int:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node.end_lineno - node.lineno + 1
    raise AssertionError(f"no function {name} in {path}")


def test_fit_is_a_flat_loop():
    assert function_lines(ROOT / "nvil" / "app" / "loop.py", "fit") <= MAX_FIT_LINES


@pytest.mark.parametrize("layer_name,module", [("nvil.core", "nvil.core.ops"), ("nvil.mcmc", "nvil.mcmc.hmc"),
                                               ("nvil.data", "nvil.data.mnist"), ("nvil.app", "nvil.app.loop"),
                                               ("nvil.models", "nvil.models.rbm"), ("nvil", "nvil"),
                                               ("nvil.estimators", "nvil.estimators.chib"),
                                               ("nvil.backend", "nvil.backend.native.triton_sweep")])
def test_layer_names(layer_name, module):
    assert layer(module) == layer_name


def code_folders(root: Path) -> set[str]:
    """Every folder with Python code that installs (nvil/, models/, estimators/, configs/), as a package name."""
    out = set()
    for folder, package in {**FOLDERS, "configs": "nvil.configs"}.items():
        out |= {".".join((package, *p.parent.relative_to(root / folder).parts)) for p in (root / folder).rglob("*.py")
                if "__pycache__" not in p.parts}
    return out


def installed_packages(root: Path) -> set[str]:
    """The packages ``pip install .`` puts in the wheel: pyproject.toml's explicit list."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def test_the_wheel_holds_every_package(tmp_path):
    """A folder with code but no place in the wheel fails (``pip install .`` could not import it); shown on a copy
    with a new folder of nvil/."""
    assert installed_packages(ROOT) == code_folders(ROOT)
    for folder in ("nvil/newpart", "models", "estimators", "configs"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "nvil" / "__init__.py").write_text("")
    (tmp_path / "nvil" / "newpart" / "kernels.py").write_text("")
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    assert "nvil.newpart" in code_folders(tmp_path) - installed_packages(tmp_path)
