"""The variational lower bound on log P(v) of a DBN (Murray & Salakhutdinov 2009, Eq. 17-18):

    log P(v) >= sum_h Q(h | v) log P*(v, h) - log Z + H(Q(h | v)),

with the expectation estimated from ``num_samples`` samples of the greedy up-pass Q (Eq. 18), H(Q) exact for
a single factorial latent layer (a 2-layer DBN), and -E_Q[log Q] from the same samples for deeper ones.
log Z is the top RBM's, the AIS estimate shared with the other DBN estimators.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from nvil.core.config import positive_int
from nvil.core.errors import ConfigError
from nvil.estimators.base import NO_PROGRESS, BatchProgress
from nvil.estimators.per_example import LatentModel, PerExample
from nvil.estimators.settings import LOG_Z, LogZSettings
from nvil.models.protocol import LAYER_STACK, TOP_MACHINE, capable


class DBNBound(PerExample):
    """``estimator=dbn_bound``: a DBN's variational lower bound on log P(v) per example.

    The bound of Murray & Salakhutdinov 2009, Eq. 17: the expectation by ``num_samples`` samples of the greedy
    up-pass Q (Eq. 18), H(Q) exact for a 2-layer DBN (the module docstring), less the top RBM's log Z, the AIS
    estimate shared with the other DBN estimators.
    ``estimate`` and the log Z are ``PerExample``'s (``nvil.estimators.per_example``), with ``train=`` (the
    training rows, for the base rate) required. The defaults are configs/estimator/dbn_bound.yaml's.

    Parameters
    ----------
    num_samples : int, default 100
        Samples of Q per example.
    batch_size : int, default 100
        Examples per batch.
    log_z : LogZSettings or Mapping, default LOG_Z
        The top RBM's log Z (``nvil.estimators.settings.LogZSettings``, or a mapping of its fields;
        configs/log_z/ais.yaml).

    Raises
    ------
    ConfigError
        (``nvil.core.errors``) If a setting is not a positive integer, in one line naming ``estimator.KEY``.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import DBN
    >>> from nvil.estimators import DBNBound, Exact
    >>> dbn = DBN(6, [4, 3])
    >>> x = (torch.rand(5, 6) < 0.5).float()
    >>> fast_log_z = {"num_chains": 16, "num_betas": 50, "num_climb": 8, "num_data_probes": 8}
    >>> result = DBNBound(num_samples=10, log_z=fast_log_z).estimate(dbn, x, train=x)
    >>> result.log_p.shape, result.extras["num_samples"], result.certified
    (torch.Size([5]), 10, True)

    The bound lies below the exact log P(v) but for the noise of the AIS log Z:

    >>> exact = Exact().estimate(dbn, x)
    >>> bool((result.log_p <= exact.log_p + 3 * result.shared_stderr + 0.05).all())
    True
    """

    name = "dbn_bound"

    def __init__(self, *, num_samples: int = 100, batch_size: int = 100,
                 log_z: LogZSettings | Mapping = LOG_Z) -> None:
        super().__init__(batch_size=batch_size, log_z=log_z)
        self.num_samples = positive_int(num_samples, "estimator.num_samples")

    def check(self, model, inference=None) -> None:
        """Refuse, in one line, a model that is not a deep belief net.

        Parameters
        ----------
        model : nn.Module
            The model to be scored; it must be a stack of RBMs with a top machine (``model=dbn``).
        inference : nn.Module or None, default None
            Not used (a DBN's Q is its greedy up-pass).

        Raises
        ------
        ConfigError
            (``nvil.core.errors``) If ``model`` lacks ``LAYER_STACK`` or ``TOP_MACHINE`` (``nvil.models.protocol``),
            naming the estimator that fits it.
        """
        if not (capable(model, LAYER_STACK) and capable(model, TOP_MACHINE)):
            raise ConfigError("estimator=dbn_bound is the bound of a deep belief net (model=dbn); for sbn or fdarn "
                              "use estimator=elbo, for rbm estimator=ais")

    def settings(self) -> dict:
        """The settings the result's JSON line records.

        Returns
        -------
        dict
            ``{"num_samples": ...}``.
        """
        return {"num_samples": self.num_samples}

    def run_batch(self, lm: LatentModel, x: torch.Tensor, generator,
                  progress: BatchProgress = NO_PROGRESS) -> torch.Tensor:
        """The bound E_Q[log P*(v, h)] + H(Q) on log P*(v) of each row (Eq. 17-18), before log Z is subtracted.

        One vectorised draw of all the samples (chunking them would change the random stream of a deeper Q),
        so progress is coarse: the draw, then log P*; the long phase is log Z, which names itself.

        Parameters
        ----------
        lm : LatentModel
            (``nvil.estimators.latent_model``) the model's latent units and its approximate posterior Q; ``lm.model``
            is the DBN.
        x : torch.Tensor
            ``(chains, n_visible)`` rows, each example repeated once per run (example-major).
        generator : torch.Generator
            The batch's generator, seeded by (seed, first row), for the draws of Q.
        progress : BatchProgress, default NO_PROGRESS
            (``nvil.estimators.base``) the batch's share of the progress bar: two units, the draw and log P*.

        Returns
        -------
        torch.Tensor
            ``(chains,)`` float64 bounds on log P*(v): the mean of log P*(v, h) over the ``num_samples`` draws plus
            H(Q) (exact for one latent layer, -E_Q[log Q] from the same draws for deeper ones).
        """
        progress.plan(2)
        q = lm.q
        xs = x.unsqueeze(0).expand(self.num_samples, *x.shape)
        hs, log_qs = q.sample(xs, generator=generator)
        progress.advance()
        expected_log_joint = lm.model.log_joint(xs, hs).double().mean(0)
        progress.advance()
        if len(hs) == 1:  # H(Q) of a factorial Bernoulli: sum_j softplus(a_j) - p_j a_j
            a = q.logits(1, x)
            entropy = (F.softplus(a) - torch.sigmoid(a) * a).sum(-1).double()
        else:
            entropy = -torch.stack(log_qs).sum(0).double().mean(0)
        return expected_log_joint + entropy
