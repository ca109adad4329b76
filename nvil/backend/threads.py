"""How many intra-op threads a run uses: chosen by the work of one step, never more than the cores the process may
run on (``trainer.threads``, ``eval.threads``: ``auto`` or a number).

A second thread pays only where a step's products are large enough to split: torch's OpenMP pool synchronises at
the end of every parallel operation, and an NVIL step on a minibatch of 20 is some 50 small operations, so a second
thread adds a barrier per operation and gains almost nothing. On a node shared with other jobs the barrier is
worse: a thread whose core is taken by a neighbour holds every operation up (the pool spin-waits for it). So
``auto`` gives one thread per ``WORK_PER_THREAD`` multiply-adds of the step's products (rows x weights), at least
one and at most the cores in the process's affinity mask (``os.sched_getaffinity``: what SLURM or ``taskset``
granted), divided among the ranks torchrun starts on the node (``LOCAL_WORLD_SIZE``).
"""

from __future__ import annotations

import os

import torch

from nvil.core.errors import ConfigError

WORK_PER_THREAD = 2**25  # multiply-adds per thread and step: a [20, 784] x [784, 200] NVIL step has ~2**22 in all


def available_cores() -> int:
    """The cores this process may run on, shared among torchrun's ranks on this node."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        cores = os.cpu_count() or 1
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, cores // max(ranks, 1))


def threads_for_work(work: float, cores: int | None = None) -> int:
    """One thread per ``WORK_PER_THREAD`` multiply-adds, between 1 and ``cores`` (default ``available_cores``)."""
    cores = available_cores() if cores is None else cores
    return max(1, min(cores, int(work // WORK_PER_THREAD)))


def choose_threads(setting, work: float, key: str) -> int:
    """The thread count for ``setting`` (``auto``: ``threads_for_work(work)``; a positive number: that many, at
    most ``available_cores()``)."""
    if setting in (None, "auto"):
        return threads_for_work(work)
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
        raise ConfigError(f"{key} must be auto or a positive number of threads, got {setting!r}")
    return min(setting, available_cores())


def model_work(modules, rows: int) -> float:
    """Multiply-adds of one pass of ``rows`` rows through every weight matrix of ``modules`` (parameters with two
    or more dimensions): the products that dominate a step."""
    weights = sum(p.numel() for m in modules if m is not None for p in m.parameters() if p.dim() >= 2)
    return float(rows) * weights


class using_threads:
    """``torch.set_num_threads(n)`` while the block runs, the previous count restored after it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __enter__(self) -> int:
        self.previous = torch.get_num_threads()
        torch.set_num_threads(self.n)
        return self.n

    def __exit__(self, *exc) -> None:
        torch.set_num_threads(self.previous)
