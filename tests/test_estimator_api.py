"""The estimators as a Python API: typed keyword constructors whose defaults are configs/estimator/*.yaml's (a drift
fails here), ``build_estimator(cfg)`` building the same object as the keywords, one-line errors naming the key, and
``estimate(model, data)`` needing nothing else for an RBM: AIS called from Python agrees with enumeration."""

from __future__ import annotations

import inspect
from dataclasses import asdict

import pytest
import torch
from omegaconf import OmegaConf

from conftest import CONFIG_DIR, tiny_model
from nvil.core.config import estimator_config
from nvil.core.errors import ConfigError
from nvil.estimators import (AIS, DRIVER_KEYS, ESTIMATORS, IWAE, Exact, LogZSettings, SampledBound, build_estimator,
                             parameters)
from nvil.models.dbn import DBN
from nvil.models.rbm import BoltzmannMachine

NAMES = sorted(ESTIMATORS)


def yaml_settings(name: str) -> dict:
    """The estimator's keys in its config file (its defaults list resolved), without the driver's."""
    cfg = OmegaConf.to_container(estimator_config(name))
    return {k: v for k, v in cfg.items() if k not in DRIVER_KEYS and k not in ESTIMATORS[name].config_only}


def same(a, b) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("name", NAMES)
def test_signature_defaults_are_the_config_files(name):
    cls = ESTIMATORS[name]
    params = inspect.signature(cls).parameters
    assert all(p.kind != p.VAR_KEYWORD and p.annotation is not p.empty for p in params.values()), params
    for key, value in yaml_settings(name).items():
        assert key in params, f"{name}.yaml's {key} is not a keyword of {cls.__name__}"
        default = params[key].default
        if key == "log_z":
            assert asdict(default) == value, (name, asdict(default), value)
        else:
            assert default == value and type(default) is type(value), (name, key, default, value)


def test_the_log_z_block_defaults_are_configs_log_z():
    assert asdict(LogZSettings()) == OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "log_z" / "ais.yaml"))


@pytest.mark.parametrize("name", NAMES)
def test_build_estimator_and_the_keywords_give_the_same_estimator(name):
    built, typed = build_estimator(estimator_config(name)), ESTIMATORS[name]()
    a, b = vars(built), vars(typed)
    assert a.keys() == b.keys() and all(same(a[k], b[k]) for k in a), name
    # and with overrides, through a Hydra-style config and as keywords
    overrides = {"batch_size": 7}
    built = build_estimator(OmegaConf.merge(estimator_config(name), overrides))
    assert built.batch_size == ESTIMATORS[name](**overrides).batch_size == 7


def test_typed_constructors():
    ais = AIS(num_chains=1000, num_betas=10_000, schedule="linear", reverse_burn_in=5)
    assert (ais.settings.num_chains, ais.settings.num_betas, ais.cert.reverse_burn_in) == (1000, 10_000, 5)
    assert ais.settings == build_estimator(OmegaConf.create({"name": "ais", "num_chains": 1000, "num_betas": 10_000,
                                                             "schedule": "linear"})).settings
    iwae = SampledBound("iwae", num_samples=50, log_z={"num_betas": 200})
    assert iwae.name == "iwae" and iwae.num_samples == 50 and iwae.log_z_settings.num_betas == 200
    assert IWAE(num_samples=50).num_samples == 50 and ESTIMATORS["elbo"]().num_samples == 10
    assert Exact(max_latent=12).max_latent == 12


@pytest.mark.parametrize("make, message", [
    (lambda: AIS(num_chains=0), "estimator.num_chains must be a positive integer, got 0"),
    (lambda: AIS(max_gap=-1.0), "estimator.max_gap must be a positive number, got -1.0"),
    (lambda: AIS(schedule="cubic"), "estimator.schedule must be one of"),
    (lambda: IWAE(num_samples=0), "estimator.num_samples must be a positive integer, got 0"),
    (lambda: IWAE(log_z={"num_chains": 0}), "estimator.log_z.num_chains must be a positive integer"),
    (lambda: IWAE(log_z={"schedule": "cubic"}), "estimator.log_z.schedule must be one of"),
    (lambda: Exact(max_latent=-3), "estimator.max_latent must be a positive integer"),
    (lambda: build_estimator(OmegaConf.create({"name": "exact", "num_chains": 5})),
     "estimator.num_chains is not a setting of estimator=exact"),
    (lambda: build_estimator(OmegaConf.merge(estimator_config("raise"), {"init_split": "dev"})),
     "estimator.init_split must be train, valid or test"),
])
def test_bad_values_are_one_line_errors_naming_the_key(make, message):
    with pytest.raises(ConfigError, match=message) as err:
        make()
    assert "\n" not in str(err.value)


def small_rbm() -> BoltzmannMachine:
    torch.manual_seed(0)
    rbm = BoltzmannMachine(6, 3)
    with torch.no_grad():
        rbm.W.normal_(0, 0.5)
        rbm.b.normal_(0, 0.5)
        rbm.c.normal_(0, 0.5)
    return rbm


def test_ais_from_python_agrees_with_exact():
    rbm = small_rbm()
    x = (torch.rand(40, 6, generator=torch.Generator().manual_seed(1)) < 0.4).float()
    exact = Exact().estimate(rbm, x)
    result = AIS(num_chains=200, num_betas=400, num_climb=16).estimate(rbm, x)  # no train=, seed or generator
    assert result.extras["base_rate_rows"] == "data"
    se = result.shared_stderr
    assert abs(result.extras["log_z"] - exact.extras["log_z"]) < 3 * se + 1e-3, (result.extras["log_z"], exact.extras)
    assert abs(result.mean_log_p - exact.mean_log_p) < 3 * se + 1e-3
    assert result.certified is True and result.warnings == [], result.warnings
    again = AIS(num_chains=200, num_betas=400, num_climb=16).estimate(rbm, x, seed=0)
    assert torch.equal(again.log_p, result.log_p)  # seed=0 by default: the same stream
    with_train = AIS(num_chains=200, num_betas=400, num_climb=16).estimate(rbm, x, train=x)
    assert "base_rate_rows" not in with_train.extras


def test_estimate_refuses_what_it_cannot_use_in_one_line():
    rbm = small_rbm()
    cases = [
        (lambda: AIS().estimate(rbm, torch.zeros(5, 7)), ValueError, "data has 7 columns but the model has 6"),
        (lambda: AIS().estimate(rbm, torch.zeros(6)), ValueError, "data must be a 2-D tensor"),
        (lambda: AIS().estimate(rbm, torch.zeros(5, 6), train=torch.zeros(5, 4)), ValueError,
         "train has 4 columns but the model has 6"),
        (lambda: AIS().estimate(rbm, torch.zeros(5, 6), seed=0.5), ValueError, "seed must be an integer"),
        (lambda: AIS().estimate(tiny_model()[0], torch.zeros(5, 6)), ConfigError, "estimator=ais estimates the "
         "partition function of a Boltzmann machine"),
        (lambda: IWAE(num_samples=2).estimate(DBN(6, [4, 3]), torch.zeros(5, 6)), ConfigError,
         "estimator=iwae on a DBN needs train="),
        (lambda: IWAE(num_samples=2).estimate(tiny_model()[0], torch.zeros(5, 6)), ConfigError,
         "needs a model with an inference network"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message) as err:
            call()
        assert "\n" not in str(err.value)


def test_every_registered_class_takes_its_yaml_keys():
    for name in NAMES:
        assert set(yaml_settings(name)) <= set(parameters(ESTIMATORS[name])), name
