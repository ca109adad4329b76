"""Denormal floats flushed to zero on the CPU while training and evaluating (``trainer.flush_denormal``,
``eval.flush_denormal``).

A float32 below 1.18e-38 in magnitude (1e-308 in float64) is denormal, and x86 cores take one to two orders of
magnitude longer on arithmetic with it. Training makes such values: a unit whose logit saturates has
sigmoid(alpha) (1 - sigmoid(alpha)) ~ 1e-40 in every backward pass through it, and REBAR / RELAX's relaxed samples
sigma(z / lambda) at lambda = 0.5 saturate whenever |z| > 44. Late in RELAX's protocol the control variate's
double backward meets enough of them to run REBAR and RELAX at half speed or less (``bench/denormals.py``; figures in
docs/benchmarks.md, "Measured defaults"). Flushing (the CPU's FTZ and DAZ modes, which
``torch.set_flush_denormal`` sets) turns them into zeros: a value that small differs from 0 by less than float32
resolves next to any O(1) quantity, and every log-density here is computed in log space (``logsigmoid``,
``softplus``), where nothing that small is formed.

The mode belongs to each thread. torch's worker threads copy it from the thread that starts them, at their first
parallel operation, so ``train.py`` and ``evaluate.py`` set it before they touch data; a caller whose workers are
already running (a notebook that trained before, a test session) gets it on the calling thread only, and
``flushed_denormals`` logs that once. CUDA kernels are not affected (their own flush mode is a compile option).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch

from nvil.core.errors import ConfigError

log = logging.getLogger("nvil")
_TINY_BITS = 1 << 20   # the bit pattern of a float32 denormal, 1.47e-39 (made from bits: no conversion can flush it)
_PROBE = 1 << 18       # elements: enough for torch to split a multiply across its worker threads
_warned = False


def flushing(all_threads: bool = False) -> bool:
    """Whether denormals are flushed on this thread (``all_threads``: on every thread of torch's pool), read off
    the result of multiplying a denormal by one."""
    n = _PROBE if all_threads and torch.get_num_threads() > 1 else 1
    product = torch.full((n,), _TINY_BITS, dtype=torch.int32).view(torch.float32) * 1.0
    return bool((product == 0).all())


@contextmanager
def flushed_denormals(enabled, key: str = "trainer.flush_denormal"):
    """Flush denormals to zero inside the block when ``enabled`` (a bool: ``key`` names it in the error); the
    calling thread's previous mode is put back on the way out. Without x86 SSE3 / ARM support it is a no-op."""
    global _warned
    if not isinstance(enabled, bool):
        raise ConfigError(f"{key} must be true or false, got {enabled!r}")
    before = flushing()
    supported = torch.set_flush_denormal(enabled)
    if enabled and supported and not _warned and not flushing(all_threads=True):
        _warned = True
        log.info("%s: torch's worker threads started before it was set, so denormals are flushed on the calling "
                 "thread only (one thread per run, or a fresh process, flushes them everywhere)", key)
    try:
        yield supported
    finally:
        torch.set_flush_denormal(before)
