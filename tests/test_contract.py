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


def model_yaml(name: str) -> dict:
    from omegaconf import OmegaConf

    from nvil.core.config import CONFIG_DIR
    cfg = OmegaConf.to_container(OmegaConf.load(Path(CONFIG_DIR) / "model" / f"{name}.yaml"))
    return {k: v for k, v in cfg.items() if k != "defaults"}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_builder_defaults_are_the_config_files(name):
    """Each family's builder takes its config file's keys as typed keywords with the file's values as defaults, so
    a model built in a notebook with no keywords is the one ``model=NAME`` trains."""
    import inspect

    from nvil.core.registry import plain
    params = inspect.signature(MODELS[name]).parameters
    settings = {k: v for k, v in model_yaml(name).items() if k != "name"}
    assert set(settings) == set(params) - {"n_visible"}
    for key, value in settings.items():
        assert plain(params[key].default) == value, f"{name}.yaml's {key}"


def test_a_key_a_family_does_not_take_is_one_line_naming_its_settings():
    from nvil.core.errors import ConfigError
    with pytest.raises(ConfigError, match=r"model.n_hiden is not a setting of model=rbm \(did you mean "
                                          r"model.n_hidden\?\); its settings are n_hidden, visible, labels"):
        build_model({"name": "rbm", "n_hiden": 5}, 6)
    with pytest.raises(ConfigError, match="model.inference.autoregresive is not a setting"):
        build_model({"name": "sbn", "inference": {"autoregresive": True}}, 6)
    with pytest.raises(ConfigError, match="unknown model 'rbn'"):
        build_model({"name": "rbn"}, 6)
