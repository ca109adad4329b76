"""The floor plan (DESIGN.md, "Layers"), checked by reading the source with ``ast``: no import cycle, no
project import hidden inside a function, each layer importing only the layers below it, no oversized file
and a flat training loop. Each rule has a broken input that must trip it, so the checks have power."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("nvil", "models", "estimators")
MAX_LINES = 300
MAX_FIT_LINES = 70

# Inside nvil/: the kernel imports neither models nor estimators (nor anything above it); the machinery
# (Markov chains, datasets) sits on the kernel and the models; the application is everything else.
KERNEL = {"nvil", "nvil.errors", "nvil.ops", "nvil.config", "nvil.accel", "nvil.distributed", "nvil.native",
          "nvil.native.triton_sweep", "nvil.native.sparse_rows", "nvil.native.softplus_difference",
          "nvil.native.bernoulli_log_prob", "nvil.native.skinny_gemm", "nvil.cpu_kernels", "nvil.gemm"}
MACHINERY = ("nvil.mcmc", "nvil.data")


def layer(module: str) -> str:
    if module in KERNEL:
        return "kernel"
    if any(module == m or module.startswith(m + ".") for m in MACHINERY):
        return "machinery"
    top = module.split(".")[0]
    return {"models": "models", "estimators": "estimators"}.get(top, "application")


ALLOWED = {  # layer -> the layers it may import (itself included)
    "kernel": {"kernel"},
    "models": {"kernel", "models"},
    "machinery": {"kernel", "models", "machinery"},
    "estimators": {"kernel", "models", "machinery", "estimators"},
    "application": {"kernel", "models", "machinery", "estimators", "application"},
}


def module_files(root: Path = ROOT) -> dict[str, Path]:
    files = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
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


def import_graph(files: dict[str, Path]) -> tuple[dict[str, set[str]], list[str]]:
    graph, hidden = {}, []
    for name, path in files.items():
        graph[name], late = imports(path.read_text(), name, files)
        hidden += [f"{path.relative_to(path.parents[len(name.split('.')) - 1])}:{line} imports {m} inside a function"
                   for line, m in late]
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
    return [f"{a} ({layer(a)}) imports {b} ({layer(b)})" for a, targets in sorted(graph.items())
            for b in sorted(targets) if layer(b) not in ALLOWED[layer(a)]]


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
    """A cycle, a function-level import and a model importing an estimator are each caught."""
    for package, body in {"nvil": "", "models": "from estimators.b import f\n",
                          "estimators": "", }.items():
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "models" / "a.py").write_text("from estimators.b import f\n")
    (tmp_path / "estimators" / "b.py").write_text("from models.a import g\n\ndef f():\n    import nvil.ops\n")
    (tmp_path / "nvil" / "ops.py").write_text("")
    graph, hidden = import_graph(module_files(tmp_path))
    assert cycles(graph) == [["estimators.b", "models.a"]]
    assert hidden == ["estimators/b.py:4 imports nvil.ops inside a function"]
    assert layer_violations(graph) == ["models.a (models) imports estimators.b (estimators)"]


def test_no_oversized_file():
    long = {str(p.relative_to(ROOT)): n for p in module_files().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


def function_lines(path: Path, name: str) -> int:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node.end_lineno - node.lineno + 1
    raise AssertionError(f"no function {name} in {path}")


def test_fit_is_a_flat_loop():
    assert function_lines(ROOT / "nvil" / "loop.py", "fit") <= MAX_FIT_LINES


@pytest.mark.parametrize("layer_name,module", [("kernel", "nvil.ops"), ("machinery", "nvil.mcmc.hmc"),
                                               ("machinery", "nvil.data.mnist"), ("application", "nvil.loop"),
                                               ("models", "models.rbm"), ("estimators", "estimators.chib")])
def test_layer_names(layer_name, module):
    assert layer(module) == layer_name


def code_folders(root: Path) -> set[str]:
    """Every folder of nvil/ that holds Python code, as a dotted package name."""
    return {".".join(p.parent.relative_to(root).parts) for p in (root / "nvil").rglob("*.py")
            if "__pycache__" not in p.parts}


def installed_packages(root: Path) -> set[str]:
    """The packages ``pip install .`` puts in the wheel: setuptools' discovery with pyproject.toml's ``include``."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from setuptools import find_packages

    find = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    return set(find_packages(where=str(root), include=find["include"]))


def test_the_wheel_holds_every_package_of_the_engine(tmp_path):
    """A folder of nvil/ with code but no place in the wheel fails (``pip install .`` could not import it: the explicit
    list once left out nvil.learners.discrete); so does a new folder without an __init__.py, shown on a copy."""
    assert installed_packages(ROOT) == code_folders(ROOT)
    (tmp_path / "nvil" / "newpart").mkdir(parents=True)
    (tmp_path / "nvil" / "__init__.py").write_text("")
    (tmp_path / "nvil" / "newpart" / "kernels.py").write_text("")
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    assert installed_packages(tmp_path) != code_folders(tmp_path)
