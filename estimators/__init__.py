"""Estimator registry: ``estimator.name`` picks one; each returns an ``estimators.base.Result``."""

from __future__ import annotations

from estimators.base import Result
from estimators.bounds import SampledBound
from estimators.classify import Classify
from estimators.exact import Exact
from nvil.errors import ConfigError

ESTIMATORS = {"iwae": SampledBound, "elbo": SampledBound, "exact": Exact, "classify": Classify}


def build_estimator(cfg):
    name = cfg.get("name")
    if name not in ESTIMATORS:
        raise ConfigError(f"unknown estimator {name!r}; known estimators: {', '.join(sorted(ESTIMATORS))}")
    return ESTIMATORS[name](cfg)


__all__ = ["ESTIMATORS", "Result", "build_estimator"]
