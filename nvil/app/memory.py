"""An evaluation that ran out of memory: whether an exception says so (``out_of_memory``), and the one line that
names the estimator and the settings to lower (``memory_advice``)."""

from __future__ import annotations

import re

import torch

# Settings that size an estimator's tensors, in the order to lower them.
SIZE_SETTINGS = ("num_chains", "num_samples", "num_runs", "batch_size", "max_elements", "log_z.num_chains")
ALLOCATOR_FAILURES = ("can't allocate memory", "out of memory", "not enough memory", "overflow when unpacking long",
                      "storage size calculation overflowed")


def out_of_memory(e: BaseException) -> bool:
    """An allocation the allocator refused: ``MemoryError``, torch's ``OutOfMemoryError``, or a ``RuntimeError``
    whose message says so (the CPU allocator's "can't allocate memory", a size beyond any allocation)."""
    if isinstance(e, MemoryError) or isinstance(e, getattr(torch, "OutOfMemoryError", MemoryError)):
        return True
    return isinstance(e, RuntimeError) and any(f in str(e).lower() for f in ALLOCATOR_FAILURES)


def memory_advice(name: str, estimator_cfg, e: BaseException) -> str:
    """One line: which estimator ran out of memory, how much it asked for, and the settings to lower."""
    values = {k: _setting(estimator_cfg, k) for k in SIZE_SETTINGS}
    lower = ", ".join(f"estimator.{k}={v}" for k, v in values.items() if v is not None)
    asked = re.search(r"allocate (\d+) bytes", str(e))
    size = f" (it asked for {int(asked.group(1)) / 2**30:.1f} GiB at once)" if asked else ""
    return (f"estimator={name} needs more memory than this machine has{size}; "
            + (f"lower {lower}" if lower else "evaluate fewer examples or a smaller model"))


def _setting(cfg, dotted: str):
    """``cfg``'s value at a dotted key (a dict or a DictConfig), None where it has none."""
    for part in dotted.split("."):
        cfg = cfg.get(part) if hasattr(cfg, "get") else None
    return cfg
