"""The mean-field variational lower bound on log p(v) of a deep Boltzmann machine (Salakhutdinov & Hinton 2009,
Eq. 6 and Sec. 3.1), the number the paper reports:

    log p(v) >= sum_h q(h) log p*(v, h) + H(q) - log Z = -E(v, mu) + H(mu) - log Z,

with q(h) = prod Bernoulli(mu) at the mean-field fixed point (``DBM.mean_field``; E is linear in each layer, so its
expectation under a factorial q is E at the means). log Z is the DBM's, the certified AIS estimate over its even
layers with the odd ones summed out, shared with ``chib`` and ``ais_posterior`` on the same checkpoint. The
per-example estimates of log p(v) itself (``chib``, ``ais_posterior``) come out above it, as theory says.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.estimators.base import NO_PROGRESS, BatchProgress
from nvil.estimators.per_example import LatentModel, PerExample
from nvil.estimators.settings import LOG_Z, LogZSettings
from nvil.models.protocol import TOP_MACHINE, VARIATIONAL_BOUND, capable


class DBMBound(PerExample):
    """``estimator=dbm_bound``: the mean-field bound per example (``mean_field_iters`` sweeps at most, stopping when
    no mean moves by more than ``mean_field_tol``) minus the shared log Z."""

    name = "dbm_bound"

    def __init__(self, *, mean_field_iters: int = 50, mean_field_tol: float = 1e-7, batch_size: int = 100,
                 log_z: LogZSettings | Mapping = LOG_Z) -> None:
        """Defaults: configs/estimator/dbm_bound.yaml. ``batch_size``: examples per batch; ``log_z``: the DBM's log Z
        (``LogZSettings`` or a mapping of its fields)."""
        super().__init__(batch_size=batch_size, log_z=log_z)
        self.iters = positive_int(mean_field_iters, "estimator.mean_field_iters")
        self.tol = positive_float(mean_field_tol, "estimator.mean_field_tol")

    def check(self, model, inference=None) -> None:
        if not (capable(model, VARIATIONAL_BOUND) and capable(model, TOP_MACHINE)):
            raise ConfigError("estimator=dbm_bound is the mean-field bound of a deep Boltzmann machine (model=dbm); "
                              "for a DBN use estimator=dbn_bound, for sbn or fdarn estimator=elbo")

    def settings(self) -> dict:
        return {"mean_field_iters": self.iters, "mean_field_tol": self.tol}

    def run_batch(self, lm: LatentModel, x: torch.Tensor, generator,
                  progress: BatchProgress = NO_PROGRESS) -> torch.Tensor:
        progress.plan(1)
        dbm = lm.model
        bound = dbm.variational_bound(x, dbm.mean_field(x, self.iters, self.tol)).double()
        progress.advance()
        return bound
