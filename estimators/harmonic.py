"""The harmonic mean estimator (Newton & Raftery 1994), kept to show how it over-estimates.

1 / P(v) = E_{P(h | v)}[1 / P(v | h)] ~= (1/S) sum_s 1 / P(v | h^(s)), h^(s) from a Markov chain on P(h | v)
(Murray & Salakhutdinov 2009, Eq. 2): sequential Gibbs started from a sample of Q(h | v), ``burn_in``
sweeps discarded, then one sample per sweep. By Jensen, E[log P_hat(v)] >= log P(v); samples rarely reach
the tails that carry the large weights, so the over-estimate is usually silent and can be large.
"""

from __future__ import annotations

import torch

from estimators.base import NO_PROGRESS, BatchProgress
from estimators.per_example import LatentModel, PerExample
from nvil.config import positive_int
from nvil.errors import ConfigError
from nvil.mcmc.sequential_gibbs import SequentialGibbs
from nvil.ops import log_mean_exp


class Harmonic(PerExample):
    name = "harmonic"
    uses_log_z = False  # P(v | h) is normalised even in a DBN, and sampling P(h | v) needs no Z

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.num_samples = positive_int(cfg.get("num_samples"), "estimator.num_samples")
        burn_in = cfg.get("burn_in", 0)
        if isinstance(burn_in, bool) or not isinstance(burn_in, int) or burn_in < 0:
            raise ConfigError(f"estimator.burn_in must be a non-negative integer, got {burn_in!r}")
        self.burn_in = burn_in

    def settings(self) -> dict:
        return {"num_samples": self.num_samples, "burn_in": self.burn_in}

    def combine(self, per_run: torch.Tensor) -> torch.Tensor:
        """Runs pool their samples: 1 / P_hat is the mean of the runs' 1 / P_hat."""
        return -log_mean_exp(-per_run, 1)

    def run_batch(self, lm: LatentModel, x: torch.Tensor, generator,
                  progress: BatchProgress = NO_PROGRESS) -> torch.Tensor:
        """Progress: one unit per sweep, burn-in included."""
        progress.plan(self.burn_in + self.num_samples)
        gibbs = SequentialGibbs([(1.0, lm.joint(x))], accel=self.accel)
        h = lm.sample_q(x, generator)
        for _ in range(self.burn_in):
            h, _ = gibbs.step(h, 1.0, generator)
            progress.advance()
        neg_log_lik = []
        for _ in range(self.num_samples):
            h, _ = gibbs.step(h, 1.0, generator)
            neg_log_lik.append(-lm.log_likelihood(x, h).double())
            progress.advance()
        return -log_mean_exp(torch.stack(neg_log_lik), 0)
