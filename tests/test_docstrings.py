"""The API reference's contract with its docstrings (numpydoc style, rendered by mkdocstrings with
``docstring_style: numpy``): every object ``docs/api/*.md`` renders, and every public method of a rendered class,
has a one-line summary; a ``Parameters`` section naming exactly the signature's parameters; ``Returns`` (or
``Yields``) where it returns a value; ``Raises`` where its own body raises; and each rendered class and function an
``Examples`` section whose ``>>>`` lines run here as doctests, so the reference cannot drift from the code.

Broken variants: ``test_checker_refuses_broken_docstrings`` hands the checker a docstring with a stale parameter,
a missing ``Returns``, a missing ``Raises`` and a wrong example output, and each must be reported.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
import re
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("Parameters", "Returns", "Yields", "Raises", "Warns", "See Also", "Notes", "References", "Examples",
            "Attributes", "Methods", "Other Parameters")


def rendered_paths() -> list[str]:
    """The dotted paths of the ``::: path`` directives of the API pages."""
    paths = []
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        paths += re.findall(r"^::: (\S+)", page.read_text(), re.M)
    return paths


def resolve(path: str):
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def members(obj, path: str):
    """(path, object, top_level) for ``obj`` and the public members mkdocstrings renders under it."""
    if inspect.ismodule(obj):
        for name, value in vars(obj).items():
            if name.startswith("_") or getattr(value, "__module__", None) != obj.__name__:
                continue
            if inspect.isfunction(value) or inspect.isclass(value):
                yield from members(value, f"{path}.{name}")
        return
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return                                   # a registry or constant: documented by its page's prose
    yield path, obj, True
    if inspect.isclass(obj):
        for name, value in vars(obj).items():
            if name.startswith("_") or (name != "forward" and hasattr(torch.nn.Module, name)):
                continue                          # nn.Module's own hooks (extra_repr, ...) are torch's to document
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if inspect.isfunction(value) or isinstance(value, property):
                yield f"{path}.{name}", value, False


def documented() -> list[tuple[str, object, bool]]:
    seen, out = set(), []
    for path in rendered_paths():
        for p, obj, top in members(resolve(path), path):
            key = id(obj.fget if isinstance(obj, property) else obj)
            if key not in seen:
                seen.add(key)
                out.append((p, obj, top))
    return out


def sections(doc: str) -> dict[str, str]:
    """The numpydoc sections of a docstring (heading underlined by dashes), "" for the text before them."""
    lines = inspect.cleandoc(doc).splitlines()
    out, name, body = {}, "", []
    i = 0
    while i < len(lines):
        if (i + 1 < len(lines) and lines[i].strip() in SECTIONS and re.fullmatch(r"-{3,}", lines[i + 1].strip())):
            out[name] = "\n".join(body)
            name, body = lines[i].strip(), []
            i += 2
            continue
        body.append(lines[i])
        i += 1
    out[name] = "\n".join(body)
    return out


def entry_names(text: str) -> list[str]:
    """The names of a Parameters section's entries: unindented lines ``name : type`` (or ``a, b : type``)."""
    names = []
    for line in text.splitlines():
        if line and not line[0].isspace():
            head = line.split(" : ")[0].strip().rstrip(":")
            names += [n.strip() for n in head.split(",")]
    return names


def signature_names(obj) -> list[str]:
    target = obj.__init__ if inspect.isclass(obj) else obj
    if inspect.isclass(obj):
        owner = next(c for c in obj.__mro__ if "__init__" in vars(c))
        if not owner.__module__.startswith("nvil"):
            return []                             # object's or nn.Module's constructor: nothing of ours to document
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    names = []
    for p in sig.parameters.values():
        if p.name in ("self", "cls"):
            continue
        names.append({p.VAR_POSITIONAL: f"*{p.name}", p.VAR_KEYWORD: f"**{p.name}"}.get(p.kind, p.name))
    return names


def own_body(func) -> list[ast.AST]:
    """The function's own statements (nested functions and classes left out)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return []
    fn = tree.body[0]
    out, todo = [], list(getattr(fn, "body", []))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def returns_value(func) -> bool:
    ann = inspect.signature(func).return_annotation
    if ann in (None, "None"):
        return False
    body = own_body(func)
    if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in body):
        return True
    return any(isinstance(n, ast.Return) and n.value is not None
               and not (isinstance(n.value, ast.Constant) and n.value.value is None) for n in body)


def raises(func) -> bool:
    return any(isinstance(n, ast.Raise) and n.exc is not None for n in own_body(func))


def problems(obj, top: bool) -> list[str]:
    """What the object's docstring lacks under the contract above (empty when it holds)."""
    func = obj.fget if isinstance(obj, property) else obj
    doc = raw_doc(func)
    if not doc or not doc.strip():
        return ["no docstring"]
    found = sections(doc)
    out = []
    summary = found[""].strip().split("\n\n")[0]
    if "\n" in summary or len(summary) > 120:
        out.append("the summary is not one line of at most 120 characters")
    if isinstance(obj, property):
        return out
    want = signature_names(obj)
    have = entry_names(found.get("Parameters", ""))
    attributes = entry_names(found.get("Attributes", ""))   # a dataclass's inherited fields may stand there
    if want and "Parameters" not in found:
        out.append(f"no Parameters section (signature: {', '.join(want)})")
    elif want or have:
        if missing := [n for n in want if n not in have and n not in attributes]:
            out.append(f"Parameters lacks {', '.join(missing)}")
        if stale := [n for n in have if n not in want]:
            out.append(f"Parameters names {', '.join(stale)}, not in the signature")
    body_of = [obj.__init__] if inspect.isclass(obj) and "__init__" in vars(obj) else [] if inspect.isclass(obj) \
        else [obj]
    if inspect.isclass(obj) and "__post_init__" in vars(obj):
        body_of.append(obj.__post_init__)
    if not inspect.isclass(obj) and returns_value(obj) and not ({"Returns", "Yields"} & found.keys()):
        out.append("no Returns section")
    if any(raises(f) for f in body_of) and "Raises" not in found:
        out.append("no Raises section (its body raises)")
    if top and ">>>" not in found.get("Examples", ""):
        out.append("no Examples section with >>> lines")
    return out


DOCUMENTED = documented()


@pytest.mark.parametrize("path,obj,top", DOCUMENTED, ids=[p for p, _, _ in DOCUMENTED])
def test_docstring_follows_the_contract(path, obj, top):
    assert not problems(obj, top), f"{path}: " + "; ".join(problems(obj, top))


def raw_doc(obj) -> str:
    return (obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__) or ""


EXAMPLES = [(p, o) for p, o, top in DOCUMENTED if top and ">>>" in raw_doc(o)]


def run_examples(obj, name: str, out=lambda text: None) -> doctest.TestResults:
    test = doctest.DocTestParser().get_doctest(inspect.cleandoc(raw_doc(obj)), {}, name, None, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test, out=out)
    return runner.summarize(verbose=False)


@pytest.mark.parametrize("path,obj", EXAMPLES, ids=[p for p, _ in EXAMPLES])
def test_examples_run(path, obj):
    torch.manual_seed(0)
    result = run_examples(obj, path)
    assert result.failed == 0, f"{path}: {result.failed} of {result.attempted} example lines failed " \
                               f"(python -m doctest-style run: see tests/test_docstrings.py)"


def test_the_reference_renders_enough():
    """The walk itself finds the API: the public face and the families are all there."""
    paths = {p for p, _, _ in DOCUMENTED}
    for p in ("nvil.app.objects.load", "nvil.estimators.ais.AIS", "nvil.models.rbm.BoltzmannMachine",
              "nvil.models.vae.VAE", "nvil.learners.sap.SAP", "nvil.data.dataset.Dataset"):
        assert p in paths, p


def broken(x: int, y: int = 2) -> int:
    """Add two numbers.

    Parameters
    ----------
    x : int
        The first.
    z : int
        A parameter that is not there.

    Examples
    --------
    >>> broken(1)
    4
    """
    if x < 0:
        raise ValueError("x")
    return x + y


def test_checker_refuses_broken_docstrings():
    found = problems(broken, True)
    assert any("lacks y" in p for p in found), found
    assert any("names z" in p for p in found), found
    assert any("Returns" in p for p in found), found
    assert any("Raises" in p for p in found), found
    assert run_examples(broken, "broken").failed == 1


def source_file(obj) -> str:
    func = obj.fget if isinstance(obj, property) else obj
    return str(Path(inspect.getsourcefile(inspect.unwrap(func))).resolve().relative_to(ROOT))


if __name__ == "__main__":   # python tests/test_docstrings.py models/rbm.py ...: the contract for those files
    import sys

    wanted = set(sys.argv[1:])
    failing = 0
    for path, obj, top in DOCUMENTED:
        if wanted and source_file(obj) not in wanted:
            continue
        found = problems(obj, top)
        if top and ">>>" in raw_doc(obj):
            torch.manual_seed(0)
            result = run_examples(obj, path, out=sys.stdout.write)
            if result.failed:
                found.append(f"{result.failed} of {result.attempted} example lines fail")
        failing += bool(found)
        print(("FAIL " if found else "ok   ") + path + (": " + "; ".join(found) if found else ""))
    print(f"{failing} failing")
