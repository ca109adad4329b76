"""The learners as a Python API: typed keyword constructors whose defaults are configs/learner/*.yaml's (a drift fails
here), ``build_learner(cfg)`` building the same learner as the keywords, one-line errors naming the key, and a step
taken by a learner built from keywords equal, bit for bit, to the one built from the config with the same seed."""

from __future__ import annotations

import inspect
from dataclasses import asdict, is_dataclass

import pytest
import torch
from omegaconf import OmegaConf

from conftest import CONFIG_DIR, tiny_model
from nvil.core.config import _load_with_defaults
from nvil.core.errors import ConfigError
from nvil.learners import (DRIVER_KEYS, LEARNERS, MCEM, NVIL, SAP, VIMCO, Greedy, TTSettings, build_learner,
                           learner_settings, parameters)
from nvil.models.dbm import DBM
from nvil.models.vae import VAE
from nvil.models.dbn import DBN
from nvil.models.gaussian import GaussianBeliefNet
from nvil.models.rbm import BoltzmannMachine

NAMES = sorted(LEARNERS)
CPU = torch.device("cpu")
# Keywords a class takes beyond its config files': the Adam decay every directed learner reads (nvil.yaml's value).
EXTRAS = {"beta2": 0.999}


def learner_yaml(name: str):
    return _load_with_defaults(CONFIG_DIR / "learner" / f"{name}.yaml")


def yaml_settings(name: str) -> dict:
    """The learner's keys in its config file (its defaults list resolved), without its name."""
    return {k: v for k, v in OmegaConf.to_container(learner_yaml(name)).items() if k not in DRIVER_KEYS}


def models(name: str):
    """(model, inference network) the learner trains, small."""
    torch.manual_seed(0)
    if LEARNERS[name] is SAP:
        return BoltzmannMachine(6, 3), None
    if name == "greedy":
        return DBN(6, [5, 4]), None
    if name == "dbm_sap":
        return DBM(6, [5, 4]), None
    if name in ("mcem_hmc", "map_latents"):
        return GaussianBeliefNet(6, [3, 2]), None
    if name == "iwae":
        return VAE(6, [2], [[4]]), None
    return tiny_model(layers=(4, 3), seed=5)


@pytest.mark.parametrize("name", NAMES)
def test_signature_defaults_are_the_config_files(name):
    cls = LEARNERS[name]
    params = inspect.signature(cls).parameters
    assert all(p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.annotation is not p.empty
               for p in params.values()), params
    settings = yaml_settings(name)
    for key, value in settings.items():
        assert key in params, f"{name}.yaml's {key} is not a keyword of {cls.__name__}"
        default = params[key].default
        if is_dataclass(default):
            assert asdict(default) == value, (name, key, asdict(default), value)
        else:
            assert default == value and type(default) is type(value), (name, key, default, value)
    # every other keyword is a setting of another file of the same class (SAP's tt and pt) or a documented extra
    family = {k for n, c in LEARNERS.items() if c is cls for k in yaml_settings(n)}
    for key in set(parameters(cls)) - family:
        assert params[key].default == EXTRAS[key], (name, key)
    if cls is SAP:
        assert learner_settings(learner_yaml(name))["mode"] == name


def summary(learner) -> dict:
    """What a learner's settings made of it: its plain attributes and the optimiser's hyperparameters."""
    out = {k: asdict(v) if is_dataclass(v) else v for k, v in vars(learner).items()
           if k not in ("training",) and (is_dataclass(v) or isinstance(v, (bool, int, float, str, tuple, type(None))))}
    if hasattr(learner, "optimizer"):
        out["optimizer"] = [{k: v for k, v in g.items() if k != "params"} for g in learner.optimizer.param_groups]
    if hasattr(learner, "inner"):
        out["inner"] = summary(learner.inner)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_build_learner_and_the_keywords_give_the_same_settings(name):
    model, inference = models(name)
    built = build_learner(learner_yaml(name), model, inference, CPU, 0)
    typed = LEARNERS[name](model, inference, **({"mode": name} if LEARNERS[name] is SAP else {}))
    assert summary(built) == summary(typed), name
    # with overrides, through a Hydra-style config and as keywords
    lr = {"lr": 0.0125}
    built = build_learner(OmegaConf.merge(learner_yaml(name), lr), model, inference, CPU, 0)
    assert summary(built) == summary(LEARNERS[name](model, inference, **{**learner_settings(learner_yaml(name)), **lr}))
    if name == "dbm_sap":  # the author's update, inc <- m inc + lr_t grad, applied by the learner itself
        assert built.lr == built.rate() == 0.0125
        return
    optimizer = built.inner.optimizer if name == "greedy" else built.optimizer
    assert optimizer.param_groups[0]["lr"] == 0.0125


def test_typed_constructors():
    rbm, _ = models("sap")
    x = (torch.rand(10, 6, generator=torch.Generator().manual_seed(1)) < 0.5).float()
    sap = SAP(rbm, None, lr=0.01, num_particles=100, k=1)
    sap.step(x)
    assert sap.mode == "sap" and sap.particles.x.shape == (100, 6) and sap.gibbs_sweeps == 1
    tt = SAP(rbm, None, mode="trans_sap", tt={"every": 2}, schedule={"t0": 5, "a": 1.0, "b": 100.0})
    assert tt.settings.tt == TTSettings(every=2) and tt.phase.every == 2 and tt.settings.schedule.t0 == 5
    greedy = Greedy(DBN(6, [5, 4]), None, layer_steps=3, per_layer=[{"layer_learner": "sap"}, {"k": 2}])
    assert greedy.layer_learners == ["sap", "cd"] and greedy.layer_settings[1].k == 2
    sbn, q = models("nvil")
    assert NVIL(sbn, q, optimizer="sgd", lr=0.006).optimizer.param_groups[1]["lr"] == pytest.approx(0.0012)
    assert VIMCO(sbn, q, num_samples=3).k == 3 and MCEM(*models("mcem_hmc"), prior_std=None).prior_std is None


@pytest.mark.parametrize("make, message", [
    (lambda: SAP(models("sap")[0], None, k=0), "learner.k must be a positive integer, got 0"),
    (lambda: SAP(models("sap")[0], None, weight_decay=-1.0), "learner.weight_decay must be >= 0, got -1.0"),
    (lambda: SAP(models("sap")[0], None, mode="trans_sap", tt={"every": 0}), "learner.tt.every must be a positive "
     "integer, got 0"),
    (lambda: SAP(models("sap")[0], None, tt={"evry": 3}), "learner.tt.evry is not a setting; the settings are "
     "num_betas, beta_min, every, start_step"),
    (lambda: SAP(models("sap")[0], None, schedule={"t0": 10}), "learner.schedule needs a > 0 and b > 0"),
    (lambda: SAP(models("sap")[0], None, mode="pcd"), "SAP's mode must be one of"),
    (lambda: NVIL(*models("nvil"), lr=-1.0), "learner.lr must be a positive number, got -1.0"),
    (lambda: NVIL(*models("nvil"), optimizer="rmsprop"), "learner.optimizer must be 'adam' or 'sgd', got 'rmsprop'"),
    (lambda: NVIL(*models("nvil"), beta2=1.5), "learner.beta2 must be in"),
    (lambda: VIMCO(*models("vimco"), num_samples=1), "learner.num_samples must be at least 2 for learner=vimco"),
    (lambda: MCEM(*models("mcem_hmc"), adapt="nuts"), "learner.adapt must be one of"),
    (lambda: Greedy(models("greedy")[0], None, per_layer=[{"kk": 2}, {}]), "learner.per_layer[0].kk is not a "
     "setting"),
    (lambda: Greedy(models("greedy")[0], None, propagate="max"), "learner.propagate must be one of"),
    (lambda: build_learner(OmegaConf.merge(learner_yaml("nvil"), {"num_particles": 5}), *models("nvil"), CPU, 0),
     "learner.num_particles is not a setting of learner=nvil; its settings are optimizer, lr"),
    (lambda: build_learner(OmegaConf.merge(learner_yaml("cd"), {"mode": "sap"}), models("cd")[0], None, CPU, 0),
     "learner.mode is not a setting of learner=cd"),
    (lambda: build_learner(OmegaConf.create({"name": "pcd"}), models("sap")[0], None, CPU, 0), "unknown learner"),
])
def test_bad_values_are_one_line_errors_naming_the_key(make, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")) as err:
        make()
    assert "\n" not in str(err.value)


def same(a, b) -> bool:
    """Equal, tensors bit for bit, through nested dicts and lists."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(u, v) for u, v in zip(a, b))
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("name, typed", [
    ("nvil", {}),
    ("sap", {}),
    ("trans_sap", {"mode": "trans_sap", "tt": {"every": 2, "num_betas": 5}}),
])
def test_a_step_from_keywords_equals_the_step_from_the_config(name, typed):
    """Same model, same seed: the learner from keywords and the one from the yaml take the same two updates and hold the
    same resumable state, bit for bit."""
    x = (torch.rand(12, 6, generator=torch.Generator().manual_seed(2)) < 0.5).float()
    cfg = OmegaConf.merge(learner_yaml(name), {k: v for k, v in typed.items() if k != "mode"})
    learners = []
    for build in (lambda m, q: build_learner(cfg, m, q, CPU, 3), lambda m, q: LEARNERS[name](m, q, seed=3, **typed)):
        model, inference = models(name)
        torch.manual_seed(7)  # NVIL's baselines draw their initial weights
        learner = build(model, inference)
        for i in range(2):
            learner.step(x, diagnostics=i == 1)
        learners.append(learner)
    a, b = learners
    assert same(dict(a.model.named_parameters()), dict(b.model.named_parameters()))
    assert same(a.state_dict(), b.state_dict()) and same(a.learner_state(), b.learner_state())
