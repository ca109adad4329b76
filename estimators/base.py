"""The estimator result every evaluator returns: per-example log p(v), its mean and standard error."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

from nvil.ops import mean_and_stderr


@dataclass
class Result:
    estimator: str
    log_p: torch.Tensor  # [num_examples], one estimate per example
    seconds: float
    seed: int
    extras: dict = field(default_factory=dict)

    @property
    def mean(self) -> float:
        return mean_and_stderr(self.log_p)[0]

    @property
    def stderr(self) -> float:
        """Standard error of the mean over examples (covers both test-set and Monte Carlo noise)."""
        return mean_and_stderr(self.log_p)[1]

    def summary(self) -> dict:
        out = {
            "estimator": self.estimator,
            "mean_log_p": round(self.mean, 4),
            "stderr": round(self.stderr, 4),
            "num_examples": int(self.log_p.numel()),
            "seconds": round(self.seconds, 3),
            "seed": self.seed,
        }
        out.update(self.extras)
        return out

    def to_json(self) -> str:
        return json.dumps(self.summary())


def chunks(n: int, size: int):
    """(start, stop) pairs covering range(n) in pieces of at most ``size``."""
    for start in range(0, n, size):
        yield start, min(start + size, n)
