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
    """``estimator=dbm_bound``: a DBM's mean-field lower bound on log p(v) per example, less the shared log Z.

    The mean-field bound per example (Salakhutdinov & Hinton 2009, Eq. 6; the module docstring), at the fixed point
    of ``DBM.mean_field`` (``mean_field_iters`` sweeps at most, stopping when no mean moves by more than
    ``mean_field_tol``), minus the shared log Z of the DBM's top machine, the certified AIS estimate over its even
    layers. ``estimate`` and the log Z are ``PerExample``'s (``nvil.estimators.per_example``), with
    ``train=`` (the training rows, for the base rate) required. The defaults are configs/estimator/dbm_bound.yaml's.

    Parameters
    ----------
    mean_field_iters : int, default 50
        The most mean-field sweeps per batch.
    mean_field_tol : float, default 1e-7
        The sweeps stop when no mean moves by more than this.
    batch_size : int, default 100
        Examples per batch.
    log_z : LogZSettings or Mapping, default LOG_Z
        The DBM's log Z (``nvil.estimators.settings.LogZSettings``, or a mapping of its fields;
        configs/log_z/ais.yaml).

    Raises
    ------
    ConfigError
        (``nvil.core.errors``) If a setting is not a positive number, in one line naming ``estimator.KEY``.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import DBM
    >>> from nvil.estimators import DBMBound, Exact
    >>> dbm = DBM(6, [4, 3])
    >>> x = (torch.rand(5, 6) < 0.5).float()
    >>> fast_log_z = {"num_chains": 16, "num_betas": 50, "num_climb": 8, "num_data_probes": 8}
    >>> result = DBMBound(log_z=fast_log_z).estimate(dbm, x, train=x)
    >>> result.log_p.shape, result.extras["mean_field_iters"], result.certified
    (torch.Size([5]), 50, True)

    The bound lies below the exact log p(v) but for the noise of the AIS log Z:

    >>> exact = Exact().estimate(dbm, x)
    >>> bool((result.log_p <= exact.log_p + 3 * result.shared_stderr + 0.05).all())
    True
    """

    name = "dbm_bound"

    def __init__(self, *, mean_field_iters: int = 50, mean_field_tol: float = 1e-7, batch_size: int = 100,
                 log_z: LogZSettings | Mapping = LOG_Z) -> None:
        super().__init__(batch_size=batch_size, log_z=log_z)
        self.iters = positive_int(mean_field_iters, "estimator.mean_field_iters")
        self.tol = positive_float(mean_field_tol, "estimator.mean_field_tol")

    def check(self, model, inference=None) -> None:
        """Refuse, in one line, a model that is not a deep Boltzmann machine.

        Parameters
        ----------
        model : nn.Module
            The model to be scored; it must offer the variational bound and a top machine (``model=dbm``).
        inference : nn.Module or None, default None
            Not used (every estimator is handed it).

        Raises
        ------
        ConfigError
            (``nvil.core.errors``) If ``model`` lacks ``VARIATIONAL_BOUND`` or ``TOP_MACHINE``
            (``nvil.models.protocol``), naming the estimator that fits it.
        """
        if not (capable(model, VARIATIONAL_BOUND) and capable(model, TOP_MACHINE)):
            raise ConfigError("estimator=dbm_bound is the mean-field bound of a deep Boltzmann machine (model=dbm); "
                              "for a DBN use estimator=dbn_bound, for sbn or fdarn estimator=elbo")

    def settings(self) -> dict:
        """The settings the result's JSON line records.

        Returns
        -------
        dict
            ``{"mean_field_iters": ..., "mean_field_tol": ...}``.
        """
        return {"mean_field_iters": self.iters, "mean_field_tol": self.tol}

    def run_batch(self, lm: LatentModel, x: torch.Tensor, generator,
                  progress: BatchProgress = NO_PROGRESS) -> torch.Tensor:
        """The mean-field bound on log p*(v) of each row: -E(v, mu) + H(mu) at the mean-field fixed point mu.

        One unit of progress for the whole batch.

        Parameters
        ----------
        lm : LatentModel
            (``nvil.estimators.latent_model``) the model's latent units and its approximate posterior Q; ``lm.model``
            is the DBM.
        x : torch.Tensor
            ``(chains, n_visible)`` rows, each example repeated once per run (example-major).
        generator : torch.Generator
            The batch's generator, seeded by (seed, first row) (not used: mean field is deterministic).
        progress : BatchProgress, default NO_PROGRESS
            (``nvil.estimators.base``) the batch's share of the progress bar.

        Returns
        -------
        torch.Tensor
            ``(chains,)`` float64 bounds on log p*(v), before the shared log Z is subtracted.
        """
        progress.plan(1)
        dbm = lm.model
        bound = dbm.variational_bound(x, dbm.mean_field(x, self.iters, self.tol)).double()
        progress.advance()
        return bound
