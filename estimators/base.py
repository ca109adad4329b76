"""The estimator result every evaluator returns: per-example log p(v), its mean and standard error."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import torch

from nvil.ops import log_mean_exp, mean_and_stderr


@dataclass
class Result:
    estimator: str
    log_p: torch.Tensor  # [num_examples], one estimate per example
    seconds: float
    seed: int
    extras: dict = field(default_factory=dict)
    # Standard error of a term every example shares (an estimated log Z), added in quadrature.
    shared_stderr: float = 0.0
    # [runs, num_examples]: each independent run's own estimate, for the per-run spread.
    run_log_p: torch.Tensor | None = None

    @property
    def mean(self) -> float:
        return mean_and_stderr(self.log_p)[0]

    @property
    def stderr_examples(self) -> float:
        """Standard error of the mean over examples (covers both test-set and Monte Carlo noise)."""
        return mean_and_stderr(self.log_p)[1]

    @property
    def stderr(self) -> float:
        return math.sqrt(self.stderr_examples**2 + self.shared_stderr**2)

    def summary(self) -> dict:
        out = {
            "estimator": self.estimator,
            "mean_log_p": round(self.mean, 4),
            "stderr": round(self.stderr, 4),
            "num_examples": int(self.log_p.numel()),
            "seconds": round(self.seconds, 3),
            "seed": self.seed,
        }
        if self.shared_stderr:
            out["stderr_examples"] = round(self.stderr_examples, 4)
        if self.run_log_p is not None:
            run_means = self.run_log_p.double().mean(1)
            out["num_runs"] = int(run_means.numel())
            out["run_spread"] = round(run_means.std().item(), 4) if run_means.numel() > 1 else 0.0
            out["mean_log_p_per_run"] = round(run_means.mean().item(), 4)
        out.update(self.extras)
        return out

    def to_json(self) -> str:
        return json.dumps(self.summary())


def chunks(n: int, size: int):
    """(start, stop) pairs covering range(n) in pieces of at most ``size``."""
    for start in range(0, n, size):
        yield start, min(start + size, n)


def batch_generator(seed: int, start: int, device) -> torch.Generator:
    """The generator for the batch of examples that starts at row ``start``: seeded by (seed, start), so an
    example's random numbers do not depend on how the test set is sharded, only on its batch."""
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + start) % (2**63))


def combine_runs(log_p_runs: torch.Tensor) -> torch.Tensor:
    """[examples, runs] estimates of log P(v), each exp() unbiased for P(v) -> the log of their mean, which is
    unbiased in P(v) too."""
    return log_mean_exp(log_p_runs.double(), 1)
