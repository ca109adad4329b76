"""Estimator registry: ``estimator.name`` picks one; each returns an ``estimators.base.Result``."""

from __future__ import annotations

from estimators.ais_hmc import AISHMC
from estimators.base import Result
from estimators.reverse_ais import BDMC
from estimators.bounds import SampledBound
from estimators.chib import Chib, ChibMH
from estimators.classify import Classify
from estimators.dbn_bound import DBNBound
from estimators.exact import Exact
from estimators.harmonic import Harmonic
from estimators.partition import AIS, RAISE
from estimators.per_example import AISPosterior
from nvil.errors import ConfigError

ESTIMATORS = {"iwae": SampledBound, "elbo": SampledBound, "exact": Exact, "classify": Classify, "ais": AIS,
              "raise": RAISE, "ais_posterior": AISPosterior, "chib": Chib, "harmonic": Harmonic,
              "dbn_bound": DBNBound, "ais_hmc": AISHMC, "chib_mh": ChibMH,
              "bdmc": BDMC}


def build_estimator(cfg):
    name = cfg.get("name")
    if name not in ESTIMATORS:
        raise ConfigError(f"unknown estimator {name!r}; known estimators: {', '.join(sorted(ESTIMATORS))}")
    return ESTIMATORS[name](cfg)


__all__ = ["ESTIMATORS", "Result", "build_estimator"]
