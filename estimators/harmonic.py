"""The harmonic mean estimator (Newton & Raftery 1994), kept to show how it over-estimates.

1 / P(v) = E_{P(h | v)}[1 / P(v | h)] ~= (1/S) sum_s 1 / P(v | h^(s)), h^(s) from a Markov chain on P(h | v)
(Murray & Salakhutdinov 2009, Eq. 2): sequential Gibbs started from a sample of Q(h | v), ``burn_in``
sweeps discarded, then one sample per sweep. By Jensen, E[log P_hat(v)] >= log P(v); samples rarely reach
the tails that carry the large weights, so the over-estimate is usually silent and can be large.
"""

from __future__ import annotations

import torch

from nvil.core.config import positive_int
from nvil.core.errors import ConfigError
from nvil.core.ops import log_mean_exp
from nvil.estimators.base import NO_PROGRESS, BatchProgress
from nvil.estimators.per_example import LatentModel, PerExample
from nvil.mcmc.flip_gibbs import site_gibbs
from nvil.models.protocol import CLOSED_FORM_LIKELIHOOD, capable, protocol_only


class Harmonic(PerExample):
    """``estimator=harmonic``: the harmonic mean of P(v | h) over sequential-Gibbs samples of P(h | v), kept for
    comparison (Murray & Salakhutdinov 2009, Sec. 2.2); needs no log Z, even for a DBN."""

    name = "harmonic"
    uses_log_z = False  # P(v | h) is normalised even in a DBN, and sampling P(h | v) needs no Z
    serves_protocol = True  # a user's binary-latent model too (``LatentModel``)

    def __init__(self, *, num_samples: int = 100, burn_in: int = 10, num_runs: int = 10, batch_size: int = 50,
                 accel: str = "auto") -> None:
        """Defaults: configs/estimator/harmonic.yaml. ``num_samples``: Gibbs samples per run after ``burn_in``
        discarded sweeps; ``num_runs``: runs per example (their samples pooled); ``batch_size``: examples per
        batch; ``accel``: auto (the sweep in C on a CPU, one Triton kernel on CUDA) | none | native | compile."""
        super().__init__(num_runs=num_runs, batch_size=batch_size, accel=accel)
        self.num_samples = positive_int(num_samples, "estimator.num_samples")
        if isinstance(burn_in, bool) or not isinstance(burn_in, int) or burn_in < 0:
            raise ConfigError(f"estimator.burn_in must be a non-negative integer, got {burn_in!r}")
        self.burn_in = burn_in

    def check(self, model, inference=None) -> None:
        if not (protocol_only(model) or capable(model, CLOSED_FORM_LIKELIHOOD)):
            raise ConfigError("estimator=harmonic needs p(v | h) in closed form, which a DBM's latent layers do not give "
                              "(h_1 couples v and h_2); use estimator=chib or ais_posterior")
        super().check(model, inference)

    def settings(self) -> dict:
        out = {"num_samples": self.num_samples, "burn_in": self.burn_in}
        if self.num_runs > 1:  # replaces the JSON line's note for estimators whose runs estimate p(v) unbiasedly
            out["mean_log_p_per_run_is"] = (
                "the mean over runs of each run's own log p(v) estimate, kept for run_spread; it is never below "
                "mean_log_p, which pools each example's runs (their 1 / p(v) estimates averaged) and so over-estimates "
                "less (Jensen's inequality): report mean_log_p")
        return out

    def combine(self, per_run: torch.Tensor) -> torch.Tensor:
        """Runs pool their samples: 1 / P_hat is the mean of the runs' 1 / P_hat."""
        return -log_mean_exp(-per_run, 1)

    def run_batch(self, lm: LatentModel, x: torch.Tensor, generator,
                  progress: BatchProgress = NO_PROGRESS) -> torch.Tensor:
        """Progress: one unit per sweep, burn-in included."""
        progress.plan(self.burn_in + self.num_samples)
        gibbs = site_gibbs([(1.0, lm.joint(x))], self.accel)
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
