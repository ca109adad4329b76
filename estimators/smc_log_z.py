"""``estimator=smc``: a Boltzmann machine's log Z by adaptive tempered SMC (``nvil.estimators.smc``) with the
certificate of ``estimator=ais``, and the per-example log p(v) = -F(v) - log Z (an RBM or semi-RBM; a DBM's
mean-field bound less the log Z of its top machine).

``num_runs`` independent SMC runs of ``num_particles`` particles each, batched, walk the ladder a pilot run of
``pilot_runs`` x ``num_particles`` particles of its own chose (each next beta at the conditional ESS share ``cess``),
resampling a run whose ESS falls below ``resample_ess`` of its particles and moving every particle by
``num_moves`` block-Gibbs sweeps per beta. Each run's Z_r is unbiased for Z; the estimate is their mean, its
standard error from their spread (the delta method on Z_hat = mean_r Z_r), its ESS over the runs. The certificate
(``nvil.estimators.certify``): the hard lower bound from probe states, reverse AIS from each reverse source on the
SMC ladder at ``reverse_fraction`` of the forward cost (``SMCSampler.reverse``), the ESS over runs, and the
forward-reverse gap.
"""

from __future__ import annotations

from nvil.core.config import positive_float
from nvil.estimators.ais import AIS
from nvil.estimators.ais_rbm import base_rate
from nvil.estimators.certify import certified_log_z
from nvil.estimators.smc import SMCSampler


class SMC(AIS):
    """``estimator=smc`` (the module docstring). From Python:
    ``SMC(num_particles=100, num_runs=10).estimate(rbm, x_test, train=x_train)``. The keywords (defaults:
    configs/estimator/smc.yaml): ``num_particles``, ``num_runs``, ``cess``, ``resample_ess``, ``num_moves``,
    ``max_betas`` (more temperatures than this is refused), ``pilot_runs``; the certificate's and the free
    energies' as ``AIS`` (``base_smoothing``, ``certify``, ``reverse_fraction``, ``reverse_sources``,
    ``reverse_burn_in``, ``max_gap``, ``min_ess_fraction`` (of the runs), ``num_climb``, ``num_data_probes``,
    ``batch_size``, ``accel``, ``cache``)."""

    name = "smc"

    def __init__(self, *, num_particles: int = 100, num_runs: int = 10, cess: float = 0.9,
                 resample_ess: float = 0.5, num_moves: int = 1, max_betas: int = 100_000, pilot_runs: int = 2,
                 base_smoothing: float = 0.05, certify: bool = True, reverse_fraction: float = 0.5,
                 reverse_sources: list[str] = ["forward", "particles"],  # noqa: B006  (the yaml's list)
                 reverse_burn_in: int | None = None, max_gap: float = 1.0, min_ess_fraction: float = 0.1,
                 num_climb: int = 256, num_data_probes: int = 1000, batch_size: int = 1000, accel: str = "auto",
                 cache: bool = True) -> None:
        self.sampler = SMCSampler(num_particles, num_runs, cess, resample_ess, num_moves, max_betas, pilot_runs)
        super().__init__(num_chains=self.sampler.num_particles * self.sampler.num_runs, schedule="adaptive",
                         num_betas=max_betas, base_smoothing=base_smoothing, certify=certify,
                         reverse_fraction=positive_float(reverse_fraction, "estimator.reverse_fraction"),
                         reverse_sources=reverse_sources, reverse_burn_in=reverse_burn_in, max_gap=max_gap,
                         min_ess_fraction=min_ess_fraction, num_climb=num_climb, num_data_probes=num_data_probes,
                         batch_size=batch_size, accel=accel, cache=cache)

    def certified_log_z(self, model, train, rows, generator, progress, particles=None, phase=None):
        base = base_rate(model, train, self.settings.base_smoothing)
        return certified_log_z(model, base, self.settings, self.cert, generator, data_rows=rows, particles=particles,
                               progress=progress, accel=self.accel, phase=phase, sources=self.reverse_sources,
                               sampler=self.sampler)

    def cache_extra(self) -> dict:
        return {"sampler": "smc", **self.sampler.settings()}

    def schedule_label(self) -> str:
        return "smc"

