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

The floor (``trainer.divergence_floor``, the ``margin``): the range rule cannot see a run that is garbage from its
first logged value (``learner.lr=1e6`` on an RBM: a log-likelihood near -1e6 from the first validation on, and so its
range), so each score on the scale of log p(x) per example (``LOG_LIKELIHOODS``) also has an absolute floor, applied
from its first value: ``margin`` nats per dimension below a reference model's log-likelihood (``score_floor``):

- binary data: the uniform model, -D log 2;
- word counts (multinomial visibles): the uniform distribution over the vocabulary, -L log V for a document of L
  words, ``margin`` per word; L is the longest training document for training scores (a minibatch's mean length is at
  most that) and the largest mean length of a first-n prefix of the validation split for validation scores (the loop
  validates on the first ``trainer.val_num_examples`` documents);
- real-valued data: per dimension, the worse of an independent Gaussian fitted to the training data,
  -1/2 log(2 pi e var_d), and the standard normal, -1/2 log(2 pi) - mean(x_d^2) / 2, where a Gaussian visible layer
  starts (unit variance, means near 0 or at the data's): on data of large scale the fitted Gaussian is out of a
  starting model's reach (at sd 5, a unit-variance model at the data's mean is 10.4 nats per dimension below it), and
  a constant column would make it infinite.

A model at initialisation scores near the reference or above it (small weights give near-uniform conditionals; output
biases start at the data's marginals), so a healthy run starts far above the floor: at 10 nats per dimension the floor
of binary MNIST is -8,384 (-8,490 with 10 label units), where every preset's first 40 steps score between -128 and
-260; the dynamic Gaussian net's first validation on its sequences is -386, its floor -1,772.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import torch

from nvil.core.config import positive_float
from nvil.core.errors import TrainingDiverged

# Scores watched: higher is better and a healthy run stays in a bounded range.
WATCHED = ("train/elbo", "train/log_joint", "train/log_p_exact_batch", "val/elbo", "val/log_likelihood",
           "val/log_p_exact", "val/pseudo_log_likelihood")
# Scores on the scale of log p(x) per example, which the absolute floor applies to (not train/log_joint: log p(x, z)).
LOG_LIKELIHOODS = ("train/elbo", "train/log_p_exact_batch", "val/elbo", "val/log_likelihood", "val/log_p_exact",
                   "val/pseudo_log_likelihood")


MIN_CHANGES, MAX_CHANGES = 5, 100  # validations' changes needed before the regression rule applies; window kept


class DivergenceMonitor:
    """The range, floor and regression rules of the module's docstring. The ranges and the regression state go into
    checkpoints (``state_dict``); the floor (``score_floor``) is recomputed from the data at every start."""

    def __init__(self, factor: float | None = 20.0, regression: float | None = 10.0,
                 floor: dict[str, float] | None = None) -> None:
        self.factor = factor
        self.floor = floor or {}
        self.range: dict[str, tuple[float, float]] = {}
        self.regression_factor = regression
        self.changes: list[float] = []          # |change| between consecutive validations, the last MAX_CHANGES
        self.last_validation: float | None = None
        self.regressing = False

    def check(self, metrics: dict[str, float]) -> str | None:
        """The first watched score in ``metrics`` that is below its floor or outside its range (described in words),
        or None; scores within range widen it."""
        for key in WATCHED:
            value = metrics.get(key)
            if value is None or not math.isfinite(value):
                continue
            fell = self.below_floor(key, value) or self.outside_range(key, value)
            if fell:
                return fell
        return None

    def below_floor(self, key: str, value: float) -> str | None:
        """The floor rule (the module's docstring), from a score's first value on."""
        low = self.floor.get(key)
        if low is None or value >= low:
            return None
        why = getattr(self.floor, "reasons", {}).get(key, "its floor")
        return f"{key} fell to {value:.4g}, below {low:.4g} ({why})"

    def outside_range(self, key: str, value: float) -> str | None:
        """The range rule (the module's docstring); a value within the range widens it."""
        if self.factor is None:
            return None
        if key not in self.range:
            self.range[key] = (value, value)
            return None
        lo, hi = self.range[key]
        if value < lo - self.factor * max(hi - lo, 1.0 + 0.05 * abs(lo)):
            return f"{key} fell to {value:.4g}, far below its range so far [{lo:.4g}, {hi:.4g}]"
        self.range[key] = (min(lo, value), max(hi, value))
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


class ScoreFloor(dict):
    """score -> its floor, with ``reasons[score]``: how it was set, in words (for the one-line message)."""

    def __init__(self, floors: dict[str, float], reasons: dict[str, str]) -> None:
        super().__init__(floors)
        self.reasons = reasons


def score_floor(data, margin: float | None) -> ScoreFloor | None:
    """The absolute floor of each score in ``LOG_LIKELIHOODS`` for the dataset ``data``, ``margin`` nats per dimension
    (per word, for word counts) below its reference model's log-likelihood (the module's docstring); None when
    ``margin`` is None (``trainer.divergence_floor=null``). The floor is computed from the data at every start, never
    stored in a checkpoint."""
    if margin is None:
        return None
    margin = positive_float(margin, "trainer.divergence_floor")
    if data.binarize == "counts":
        return _counts_floor(data, margin)
    if data.binarize == "continuous":
        return _gaussian_floor(data, margin)
    return _uniform_floor(data.dim, margin)


def _same_floor(value: float, reason: str) -> ScoreFloor:
    hint = f"{reason}; trainer.divergence_floor sets the margin"
    return ScoreFloor(dict.fromkeys(LOG_LIKELIHOODS, value), dict.fromkeys(LOG_LIKELIHOODS, hint))


def _uniform_floor(dim: int, margin: float) -> ScoreFloor:
    """Binary data: the uniform model, log p(x) = -D log 2 for every x."""
    reference = -dim * math.log(2)
    return _same_floor(reference - margin * dim,
                       f"{margin:g} nats per dimension below the uniform model's {reference:.4g}")


def _gaussian_floor(data, margin: float) -> ScoreFloor:
    """Real-valued data: per dimension the worse of the independent Gaussian fitted to the training data (its mean
    log-likelihood there, -1/2 log(2 pi e var_d)) and the standard normal (-1/2 log(2 pi) - mean(x_d^2) / 2)."""
    x = data.splits["train"].double()
    fitted = -0.5 * torch.log(2 * math.pi * math.e * x.var(0, unbiased=False))
    standard = -0.5 * math.log(2 * math.pi) - 0.5 * (x**2).mean(0)
    reference = torch.minimum(fitted, standard).sum().item()
    return _same_floor(reference - margin * data.dim, f"{margin:g} nats per dimension below the independent Gaussian "
                       f"fitted to the training data, or the standard normal where worse, {reference:.4g}")


def document_lengths(x: torch.Tensor) -> torch.Tensor:
    """Words per document (row) of a dense or sparse count matrix, in float64."""
    lengths = torch.sparse.sum(x, 1).to_dense() if x.is_sparse else x.sum(1)
    return lengths.double().cpu()


def _counts_floor(data, margin: float) -> ScoreFloor:
    """Word counts: the uniform distribution over the V words, -L log V for a document of L words; L is the longest
    training document for training scores and the largest mean length of a first-n prefix of the validation split for
    validation scores."""
    log_v = math.log(data.dim)
    train = document_lengths(data.splits["train"]).max().item()
    valid = document_lengths(data.splits["valid"])
    valid = (valid.cumsum(0) / torch.arange(1, len(valid) + 1)).max().item()
    floors, reasons = {}, {}
    for key in LOG_LIKELIHOODS:
        words, which = (train, "the longest training document") if key.startswith("train/") else \
            (valid, "the validation documents' largest mean length")
        floors[key] = -words * (log_v + margin)
        reasons[key] = (f"{margin:g} nats per word below the uniform model's {-words * log_v:.4g} on {which}, "
                        f"{words:.4g} words; trainer.divergence_floor sets the margin")
    return ScoreFloor(floors, reasons)


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
