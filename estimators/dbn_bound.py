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
    """``estimator=dbn_bound``: the DBN's variational bound (Eq. 17), the expectation by ``num_samples`` samples
    of the greedy up-pass Q."""

    name = "dbn_bound"

    def __init__(self, *, num_samples: int = 100, batch_size: int = 100,
                 log_z: LogZSettings | Mapping = LOG_Z) -> None:
        """Defaults: configs/estimator/dbn_bound.yaml. ``num_samples``: samples of Q per example; ``batch_size``:
        examples per batch; ``log_z``: the top RBM's log Z (``LogZSettings`` or a mapping of its fields)."""
        super().__init__(batch_size=batch_size, log_z=log_z)
        self.num_samples = positive_int(num_samples, "estimator.num_samples")

    def check(self, model, inference=None) -> None:
        if not (capable(model, LAYER_STACK) and capable(model, TOP_MACHINE)):
            raise ConfigError("estimator=dbn_bound is the bound of a deep belief net (model=dbn); for sbn or fdarn "
                              "use estimator=elbo, for rbm estimator=ais")

    def settings(self) -> dict:
        return {"num_samples": self.num_samples}

    def run_batch(self, lm: LatentModel, x: torch.Tensor, generator,
                  progress: BatchProgress = NO_PROGRESS) -> torch.Tensor:
        """One vectorised draw of all the samples (chunking them would change the random stream of a deeper Q),
        so progress is coarse: the draw, then log P*; the long phase is log Z, which names itself."""
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
