"""Divergence: a score far outside the range it has taken so far stops the run (with ``TrainingDiverged``).

The scores watched are ones where higher is better and a healthy run stays within a bounded range: a
training ELBO, log-joint or exact minibatch log-likelihood, and the validation bound. A run with a learning rate
far too large (``learner.lr=1e6``) drives the training ELBO of an SBN on MNIST from about -550 to about -2e9
while every number stays finite; that is caught here, before the run saves it as its best checkpoint.

The rule, for each score: with ``lo``, ``hi`` the lowest and highest values logged so far, the run has
diverged when a new value falls below ``lo - factor * spread``, where ``spread = max(hi - lo, 1 + 0.05 |lo|)``.
Learning moves a score up, and the minibatch noise of a healthy run stays within the range it has already
shown, so ``factor = 20`` flags only a collapse by orders of magnitude.
"""

from __future__ import annotations

import math

# Scores watched: higher is better and a healthy run stays in a bounded range.
WATCHED = ("train/elbo", "train/log_joint", "train/log_p_exact_batch", "val/elbo", "val/log_likelihood",
           "val/log_p_exact", "val/pseudo_log_likelihood")


class DivergenceMonitor:
    def __init__(self, factor: float | None = 20.0) -> None:
        self.factor = factor
        self.range: dict[str, tuple[float, float]] = {}

    def check(self, metrics: dict[str, float]) -> str | None:
        """The first watched score in ``metrics`` that is outside its range (described in words), or None;
        scores within range widen it."""
        if self.factor is None:
            return None
        for key in WATCHED:
            value = metrics.get(key)
            if value is None or not math.isfinite(value):
                continue
            if key in self.range:
                lo, hi = self.range[key]
                floor = lo - self.factor * max(hi - lo, 1.0 + 0.05 * abs(lo))
                if value < floor:
                    return f"{key} fell to {value:.4g}, far below its range so far [{lo:.4g}, {hi:.4g}]"
                self.range[key] = (min(lo, value), max(hi, value))
            else:
                self.range[key] = (value, value)
        return None

    def state_dict(self) -> dict:
        return {k: list(v) for k, v in self.range.items()}

    def load_state_dict(self, state: dict) -> None:
        self.range = {k: (float(v[0]), float(v[1])) for k, v in state.items()}
