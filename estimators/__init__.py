"""Estimator registry: ``estimator.name`` picks one; each returns an ``nvil.estimators.base.Result``.

Each class takes its settings as typed keywords, the defaults those of configs/estimator/<name>.yaml:
``AIS(num_chains=1000, num_betas=10_000).estimate(rbm, x_test, train=x_train)``. ``build_estimator(cfg)`` builds
one from a config: ``ESTIMATORS[cfg.name](**settings)``, the settings being the config's keys but those the
evaluation driver reads for itself.

A model of the user's own (``nvil.models.protocol``: ``latent``, ``log_prior``, ``log_likelihood``, optionally the
samplers and a proposal) is scored by ``evaluate_model(model, x, estimator="ais")`` with the estimators of
``MODEL_ESTIMATORS`` (``nvil.estimators.model_estimators``)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping

from nvil.core.errors import ConfigError
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
    ModelBDMC,
    ModelExact,
    ModelIWAE,
    evaluate_model,
)
from nvil.estimators.partition import AIS, RAISE
from nvil.estimators.per_example import AISPosterior
from nvil.estimators.reverse_ais import BDMC
from nvil.estimators.settings import AISSettings, CertifySettings, LogZSettings

ESTIMATORS = {"iwae": IWAE, "elbo": ELBO, "exact": Exact, "classify": Classify, "ais": AIS,
              "raise": RAISE, "ais_posterior": AISPosterior, "chib": Chib, "harmonic": Harmonic,
              "dbn_bound": DBNBound, "dbm_bound": DBMBound, "ais_hmc": AISHMC, "chib_mh": ChibMH,
              "bdmc": BDMC}

# Keys of an estimator config that are not the estimator's: its name, Hydra's defaults list (a file loaded without
# Hydra), and estimator.strict (nvil.app.main: a failed certificate exits with code 3).
DRIVER_KEYS = ("name", "defaults", "strict")
# Keys the evaluation driver also reads (nvil.app.evaluation: accel for the samplers' draws, batch_size for the
# shards' edges): dropped for a class that does not take them.
SHARED_KEYS = ("accel", "batch_size")


def parameters(cls) -> list[str]:
    """The keyword settings ``cls``'s constructor takes."""
    return [p.name for p in inspect.signature(cls).parameters.values()
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


def estimator_settings(cfg) -> dict:
    """The keywords ``build_estimator`` passes: the config's keys but ``DRIVER_KEYS``, the class's ``config_only``
    and the ``SHARED_KEYS`` it does not take; any other key it does not take is refused in one line."""
    name = cfg.get("name")
    cls = ESTIMATORS[name]
    known = parameters(cls)
    out = {}
    for key, value in cfg.items():
        if key in DRIVER_KEYS or key in cls.config_only or (key in SHARED_KEYS and key not in known):
            continue
        if key not in known:
            raise ConfigError(f"estimator.{key} is not a setting of estimator={name}; its settings are "
                              f"{', '.join(known)}")
        out[key] = dict(value.items()) if isinstance(value, Mapping) else value
    return out


def build_estimator(cfg):
    """The estimator ``cfg`` (``estimator.*``: a Hydra config or any mapping with ``name``) describes."""
    name = cfg.get("name")
    if name not in ESTIMATORS:
        raise ConfigError(f"unknown estimator {name!r}; known estimators: {', '.join(sorted(ESTIMATORS))}")
    return ESTIMATORS[name](**estimator_settings(cfg))


__all__ = ["AIS", "AISHMC", "AISPosterior", "AISSettings", "BDMC", "CertifySettings", "Chib", "ChibMH", "Classify",
           "DBMBound", "DBNBound", "ELBO", "ESTIMATORS", "Exact", "Harmonic", "IWAE", "LogZSettings", "MODEL_ESTIMATORS",
           "ModelAIS", "ModelBDMC", "ModelExact", "ModelIWAE", "RAISE", "Result", "SampledBound", "build_estimator",
           "estimator_settings", "evaluate_model"]
