"""Divergence: a score far outside the range it has taken so far stops the run (with ``TrainingDiverged``).

The scores watched are ones where higher is better and a healthy run stays within a bounded range: a
training ELBO, log-joint or exact minibatch log-likelihood, and the validation bound. A run with a learning rate
far too large (``learner.lr=1e6``) drives the training ELBO of an SBN on MNIST from about -550 to about -2e9
while every number stays finite; that is caught here, before the run saves it as its best checkpoint.

The rule, for each score: with ``lo``, ``hi`` the lowest and highest values logged so far, the run has
diverged when a new value falls below ``lo - factor * spread``, where ``spread = max(hi - lo, 1 + 0.05 |lo|)``.
Learning moves a score up, and the minibatch noise of a healthy run stays within the range it has already
shown, so ``factor = 20`` flags only a collapse by orders of magnitude.

Regression (a warning, not a stop): the validation score kept for best.pt falling far below its best, as RELAX's
protocol run did at updates 1,365,000 and 1,811,000 (its control variate's temperature ran away in a few Adam steps;
validation -ELBO(10) 113.5 -> 147.4 and 113.3 -> 159.8, each recovering over ~50-100k updates) while staying inside
the collapse rule's range. The scale is the run's own: ``step`` = the median absolute change between consecutive
validations so far (the last 100; at least 5 needed). A validation more than ``regression * step`` below the best
starts a regression episode, said once in the log (the run goes on: it may recover, and best.pt keeps the best); the
episode ends when a validation is back within that distance. With ``regression = 10`` a healthy run's validations,
whose changes are of one size, do not start one.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import torch

from nvil.core.errors import TrainingDiverged

# Scores watched: higher is better and a healthy run stays in a bounded range.
WATCHED = ("train/elbo", "train/log_joint", "train/log_p_exact_batch", "val/elbo", "val/log_likelihood",
           "val/log_p_exact", "val/pseudo_log_likelihood")


MIN_CHANGES, MAX_CHANGES = 5, 100  # validations' changes needed before the regression rule applies; window kept


class DivergenceMonitor:
    def __init__(self, factor: float | None = 20.0, regression: float | None = 10.0) -> None:
        self.factor = factor
        self.range: dict[str, tuple[float, float]] = {}
        self.regression_factor = regression
        self.changes: list[float] = []          # |change| between consecutive validations, the last MAX_CHANGES
        self.last_validation: float | None = None
        self.regressing = False

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

    def regression(self, tag: str, score: float, best: float, best_step: int) -> str | None:
        """A validation ``score`` of ``tag`` (higher is better; ``best`` so far at ``best_step``, before this one):
        the warning that starts a regression episode (described in words), or None. See the module's docstring."""
        if self.last_validation is not None and math.isfinite(score) and math.isfinite(self.last_validation):
            self.changes = (self.changes + [abs(score - self.last_validation)])[-MAX_CHANGES:]
        self.last_validation = score
        if self.regression_factor is None or len(self.changes) < MIN_CHANGES or not math.isfinite(best):
            return None
        step = statistics.median(self.changes)
        below = best - score > self.regression_factor * step
        started, self.regressing = below and not self.regressing, below
        if not started:
            return None
        return (f"{tag} fell to {score:.4g}, {best - score:.3g} below its best {best:.4g} (step {best_step}), "
                f"{(best - score) / max(step, 1e-12):.0f}x the median change between validations ({step:.2g}); the run "
                "goes on, best.pt keeps the best (trainer.regression sets this warning's factor)")

    def state_dict(self) -> dict:
        return {**{k: list(v) for k, v in self.range.items()},
                "_regression": {"changes": list(self.changes), "last": self.last_validation,
                                "regressing": self.regressing}}

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        regression = state.pop("_regression", {})  # absent from checkpoints written before the regression rule
        self.range = {k: (float(v[0]), float(v[1])) for k, v in state.items()}
        self.changes = [float(c) for c in regression.get("changes", [])]
        self.last_validation = regression.get("last")
        self.regressing = bool(regression.get("regressing", False))


def kept(last_path: Path) -> str:
    """What a stopped run leaves behind, for its one-line message."""
    if last_path.exists():
        return f"the last good checkpoint is kept at {last_path}"
    return "no checkpoint was written before that (none is kept)"


def check_finite(run, step: int, last_path: Path) -> None:
    """``TrainingDiverged`` when a parameter of the run's model or inference network is NaN or infinite."""
    params = list(run.model.parameters()) + (list(run.inference.parameters()) if run.inference is not None else [])
    if not bool(torch.stack([torch.isfinite(p).all() for p in params]).all()):
        raise TrainingDiverged(f"parameters became NaN or infinite by step {step}; {kept(last_path)} "
                               "(try a smaller learner.lr)")
