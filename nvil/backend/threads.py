"""How many intra-op threads a run uses: chosen by the work of one step, never more than the cores the process may
run on (``trainer.threads``, ``eval.threads``: ``auto`` or a number).

A second thread pays only where a step's products are large enough to split: torch's OpenMP pool synchronises at
the end of every parallel operation, and an NVIL step on a minibatch of 20 is some 50 small operations, so a second
thread adds a barrier per operation and gains almost nothing. On a node shared with other jobs the barrier is
worse: a thread whose core is taken by a neighbour holds every operation up (the pool waits for it). So ``auto``
gives one thread per ``WORK_PER_THREAD`` multiply-adds of the step's products (rows x weights), at least one and at
most the cores in the process's affinity mask (``os.sched_getaffinity``: what SLURM or ``taskset`` granted),
divided among the ranks torchrun starts on the node (``LOCAL_WORLD_SIZE``), and no more than the cores that are
idle when the run starts (``idle_cores``: a neighbour already running keeps its core).
"""

from __future__ import annotations

import contextlib
import os
import time

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


def idle_cores(seconds: float = 0.2) -> float | None:
    """How many of this process's cores other processes leave idle: the idle share of each core in the affinity
    mask over ``seconds``, from ``/proc/stat`` (None where there is none: macOS, Windows)."""
    try:
        mask = os.sched_getaffinity(0)
        first = _cpu_times(mask)
        time.sleep(seconds)
        second = _cpu_times(mask)
    except (AttributeError, OSError):
        return None
    idle = 0.0
    for cpu, (busy1, idle1) in first.items():
        busy2, idle2 = second.get(cpu, (busy1, idle1))
        total = (busy2 - busy1) + (idle2 - idle1)
        idle += (idle2 - idle1) / total if total > 0 else 1.0
    return idle


def _cpu_times(mask: set[int]) -> dict[int, tuple[int, int]]:
    """{cpu: (busy ticks, idle ticks)} of the cpus in ``mask`` (idle: idle + iowait)."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in mask:
                ticks = [int(v) for v in fields[:8]]
                out[int(name[3:])] = (sum(ticks) - ticks[3] - ticks[4], ticks[3] + ticks[4])
    return out


def threads_for_work(work: float, cores: int | None = None) -> int:
    """One thread per ``WORK_PER_THREAD`` multiply-adds, between 1 and ``cores`` (default ``available_cores``)."""
    cores = available_cores() if cores is None else cores
    return max(1, min(cores, int(work // WORK_PER_THREAD)))


def free_cores() -> int:
    """``available_cores()``, less those a neighbour keeps busy now (``idle_cores``, rounded; at least one)."""
    cores = available_cores()
    idle = idle_cores()
    return cores if idle is None else max(1, min(cores, int(idle + 0.5)))


def choose_threads(setting, work: float, key: str) -> int:
    """The thread count for ``setting`` (``auto``: ``threads_for_work(work)``, at most the ``free_cores()``; a
    positive number: that many, at most ``available_cores()``)."""
    if setting in (None, "auto"):
        wanted = threads_for_work(work)
        return 1 if wanted == 1 else min(wanted, free_cores())
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
        raise ConfigError(f"{key} must be auto or a positive number of threads, got {setting!r}")
    return min(setting, available_cores())


def model_work(modules, rows: int) -> float:
    """Multiply-adds of one pass of ``rows`` rows through every weight matrix of ``modules`` (parameters with two
    or more dimensions): the products that dominate a step."""
    weights = sum(p.numel() for m in modules if m is not None for p in m.parameters() if p.dim() >= 2)
    return float(rows) * weights


@contextlib.contextmanager
def restored_threads():
    """torch's intra-op thread count as it was before the block, whatever the block sets."""
    previous = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(previous)
