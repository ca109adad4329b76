"""The one contract: estimators and learners ask a model for capabilities (``nvil.models.protocol``), never for a
family's name. The source is read with ``ast``: a ``.family`` attribute, a ``getattr(model, "family")`` or a
``family`` class attribute anywhere in the library fails the test, and a switch written on purpose must trip it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from nvil.models import MODELS, build_model
from nvil.models.protocol import CAPABILITIES, capable, protocol_only

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("nvil", "models", "estimators")


def family_switches(source: str) -> list[int]:
    """Lines of ``source`` that read or declare a model's family name."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "family":
            lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value == "family"):
            lines.append(node.lineno)
        elif isinstance(node, ast.ClassDef):
            lines += [s.lineno for s in node.body if isinstance(s, ast.Assign)
                      and any(isinstance(t, ast.Name) and t.id == "family" for t in s.targets)]
    return lines


def test_no_family_switch_in_the_library():
    found = {str(p.relative_to(ROOT)): family_switches(p.read_text())
             for folder in LIBRARY for p in (ROOT / folder).rglob("*.py")}
    assert {k: v for k, v in found.items() if v} == {}


@pytest.mark.parametrize("switch", [
    'if model.family == "dbm":\n    pass',
    'x = getattr(model, "family", None) in ("dbn", "dbm")',
    'class Net:\n    family = "boltzmann"',
])
def test_a_family_switch_written_back_is_caught(switch):
    assert family_switches(switch)


@pytest.mark.parametrize("name, spec, expected", [
    ("rbm", {"n_hidden": 3}, {"free_energy"}),
    ("srbm", {"n_hidden": 3}, {"free_energy"}),
    ("sbn", {"layers": [3, 2]}, {"binary_latents", "ancestral", "closed_form_likelihood"}),
    ("dbn", {"layers": [3, 2]}, {"top_machine", "layer_stack", "binary_latents", "closed_form_likelihood"}),
    ("dbm", {"layers": [3, 2]}, {"top_machine", "variational_bound", "binary_latents"}),
    ("gbn", {"layers": [3]}, {"continuous_latents", "ancestral", "closed_form_likelihood", "closed_form_gradient"}),
    ("vae", {"latent": [2], "hidden": [[4]]}, set()),
])
def test_each_family_declares_its_capabilities(name, spec, expected):
    model, _ = build_model({"name": name, **spec}, 6)
    assert set(model.capabilities) == expected and set(model.capabilities) <= set(CAPABILITIES)
    assert all(capable(model, c) == (c in expected) for c in CAPABILITIES)
    assert protocol_only(model) == (not expected)


def test_every_registered_family_is_covered():
    assert set(MODELS) == {"rbm", "srbm", "sbn", "fdarn", "dbn", "dbm", "gbn", "dbn_dynamic", "vae"}


def test_asking_for_a_capability_that_does_not_exist_is_an_error_not_a_false():
    with pytest.raises(ValueError, match="unknown capability 'boltzmann'"):
        capable(object(), "boltzmann")
