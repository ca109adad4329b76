"""Estimator registry: ``estimator.name`` picks one; each returns an ``nvil.estimators.base.Result``.

Each class takes its settings as typed keywords, the defaults those of configs/estimator/<name>.yaml:
``AIS(num_chains=1000, num_betas=10_000).estimate(rbm, x_test, train=x_train)``. ``build_estimator(cfg)`` builds
one from a config: ``ESTIMATORS[cfg.name](**settings)``, the settings being the config's keys but those the
evaluation driver reads for itself.

A model of the user's own (``nvil.models.protocol``: ``latent``, ``log_prior``, ``log_likelihood``, optionally the
samplers and a proposal) is scored by ``evaluate_model(model, x, estimator="ais")`` with the estimators of
``MODEL_ESTIMATORS`` (``nvil.estimators.model_estimators``)."""

from __future__ import annotations

from nvil.core.errors import ConfigError
from nvil.core.registry import keywords, lookup, read_settings
from nvil.estimators.ais_hmc import AISHMC
from nvil.estimators.base import Result
from nvil.estimators.bounds import ELBO, IWAE, SampledBound
from nvil.estimators.chib import Chib, ChibMH
from nvil.estimators.classify import Classify
from nvil.estimators.dbm_bound import DBMBound
from nvil.estimators.dbn_bound import DBNBound
from nvil.estimators.exact import Exact
from nvil.estimators.harmonic import Harmonic
from nvil.estimators.model_estimators import (
    MODEL_ESTIMATORS,
    ModelAIS,
    evaluate_model,
)
from nvil.estimators.ais import AIS, RAISE
from nvil.estimators.ais_posterior import AISPosterior
from nvil.estimators.bdmc import BDMC
from nvil.estimators.settings import AISSettings, CertifySettings, LogZSettings
from nvil.models.protocol import protocol_only

ESTIMATORS = {"iwae": IWAE, "elbo": ELBO, "exact": Exact, "classify": Classify, "ais": AIS,
              "raise": RAISE, "ais_posterior": AISPosterior, "chib": Chib, "harmonic": Harmonic,
              "dbn_bound": DBNBound, "dbm_bound": DBMBound, "ais_hmc": AISHMC, "chib_mh": ChibMH,
              "bdmc": BDMC}

# Keys of an estimator config that are not the estimator's: its name, Hydra's defaults list (a file loaded without
# Hydra), estimator.strict (nvil.app.main: a failed certificate exits with code 3) and estimator.budget
# (nvil.app.evaluation: the estimator grown within it, nvil.estimators.budget).
DRIVER_KEYS = ("name", "defaults", "strict", "budget")
# Keys the evaluation driver also reads (nvil.app.evaluation: accel for the samplers' draws, batch_size for the
# shards' edges): dropped for a class that does not take them.
SHARED_KEYS = ("accel", "batch_size")


def parameters(cls) -> list[str]:
    """The keyword settings ``cls``'s constructor takes."""
    return keywords(cls)


def estimator_settings(cfg) -> dict:
    """The keywords ``build_estimator`` passes: the config's keys but ``DRIVER_KEYS``, the class's ``config_only``
    and the ``SHARED_KEYS`` it does not take; any other key it does not take is refused in one line
    (``nvil.core.registry``)."""
    name = cfg.get("name")
    cls = lookup("estimator", name, ESTIMATORS)
    known = parameters(cls)
    skip = {*DRIVER_KEYS, *cls.config_only, *(k for k in SHARED_KEYS if k not in known)}
    return read_settings("estimator", name, cfg, known, skip)


# A model seen through the protocol alone (a user's model, the VAE: no capability of a built-in family) is scored by
# the estimator of ``MODEL_ESTIMATORS`` that does the same job: its name and the settings both take (the config's
# own names, left, as the protocol estimator's, right; the other keys of the config file are the built-in's own).
PROTOCOL_ROUTES = {
    "ais_hmc": ("ais", {"num_betas": "num_betas", "schedule": "schedule", "num_runs": "num_chains",
                        "num_leapfrog": "num_leapfrog", "step_size": "step_size", "target_accept": "target_accept",
                        "adapt": "adapt", "pilot_chains": "pilot_chains", "batch_size": "batch_size",
                        "min_example_ess": "min_example_ess"}),
}


def build_estimator(cfg, model=None):
    """The estimator ``cfg`` (``estimator.*``: a Hydra config or any mapping with ``name``) describes; for a
    ``model`` seen through the protocol alone, the protocol estimator of ``PROTOCOL_ROUTES``."""
    name = cfg.get("name")
    cls = lookup("estimator", name, ESTIMATORS)
    given = estimator_settings(cfg)
    if model is None or not protocol_only(model) or getattr(cls, "serves_protocol", False):
        return cls(**given)
    if name not in PROTOCOL_ROUTES:
        served = set(PROTOCOL_ROUTES) | {n for n, c in ESTIMATORS.items() if getattr(c, "serves_protocol", False)}
        raise ConfigError(f"estimator={name} needs a capability a {type(model).__name__} does not declare (it follows "
                          f"the model protocol alone); use estimator={', '.join(sorted(served))}")
    target, keys = PROTOCOL_ROUTES[name]
    return MODEL_ESTIMATORS[target](**{keys[k]: v for k, v in given.items() if k in keys})


__all__ = ["AIS", "AISHMC", "AISPosterior", "AISSettings", "BDMC", "CertifySettings", "Chib", "ChibMH", "Classify",
           "DBMBound", "DBNBound", "ELBO", "ESTIMATORS", "Exact", "Harmonic", "IWAE", "LogZSettings", "MODEL_ESTIMATORS",
           "ModelAIS", "RAISE", "Result", "SampledBound", "build_estimator",
           "estimator_settings", "evaluate_model"]
