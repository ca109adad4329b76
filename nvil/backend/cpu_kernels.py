"""Which of torch's CPU kernel sets runs (AVX2 on CPUs with AVX-512, unless the user chose), and a compile cache
of its own for each set.

torch picks its vectorised CPU kernels once per process, at the first operation, from the CPU's instruction sets
or the environment variable ``ATEN_CPU_CAPABILITY`` (``default``, ``avx2``, ``avx512``). On a CPU with AVX-512 it
picks ``avx512``, whose ``softplus``, ``log1p`` and ``expm1`` kernels are several times slower than the AVX2 set's
(``python bench/cpu_kernels.py``; figures in docs/benchmarks.md, "Measured defaults"). Every Bernoulli
log-probability (``nvil.core.ops.bernoulli_log_prob``), RBM free energy and AIS weight increment goes through them,
so the AVX2 set speeds up eager HMC on a Gaussian belief net, AIS on an RBM and IWAE evaluation, with identical
estimates. (torch's AVX-512 ``sigmoid`` and ``exp`` are the faster ones; block Gibbs and tempered transitions come out
about even. Compiled steps differ: Inductor's own AVX-512 code is the faster there, so a compiled job may prefer
``avx512``.)

So the entry points (``train.py``, ``evaluate.py``, ``nvil-train``, ``nvil-evaluate``: ``nvil.app.entry``) ask for
``ATEN_CPU_CAPABILITY=avx2`` where the CPU reports AVX-512 and the variable is unset, before torch's first operation
(``trainer.cpu_kernels`` / ``eval.cpu_kernels``: ``auto``, the default; ``avx2``, ``avx512`` or ``default`` to force
a set; ``torch`` to leave torch's pick), and their child processes (torchrun workers, launcher jobs) inherit it. A
user who sets the variable keeps their choice under ``auto``. Importing ``nvil`` changes nothing: in a notebook
call ``choose_kernels()`` before the first torch operation, or set the variable before starting Python;
``capability()`` says what runs, and the training summary and the evaluator's JSON record it.

**The compile cache.** ``torch.compile`` (Inductor) generates C++ for the kernel set in force and caches it on disk
(by default in ``<tmp>/torchinductor_<user>``), keyed without the kernel set: a process under one set loads what a
process under another compiled. Seen here: block Gibbs compiled under ``avx512`` and then run under ``avx2`` from the
same cache drew non-binary "pixels", and the other order corrupted the heap ("malloc(): unaligned tcache chunk
detected"); each set alone, in a clean cache, matches eager. So wherever the variable is set (by nvil or by the
user) and ``TORCHINDUCTOR_CACHE_DIR`` is not, ``choose_kernels`` gives each set a cache of its own,
``<tmp>/torchinductor_<user>_<set>``, and re-points a child process that inherited its parent's per-set cache but
runs the other set (``bench/cpu_kernels.py``'s children did; tests/test_cpu_kernels.py).
"""

from __future__ import annotations

import functools
import getpass
import os
import tempfile

VARIABLE = "ATEN_CPU_CAPABILITY"
CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
PREFERRED = "avx2"
CHOICES = ("auto", "avx2", "avx512", "default", "torch")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's instruction-set flags from /proc/cpuinfo (empty where there is none: macOS, Windows), read once,
    on first use."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return frozenset()
    return frozenset(line.partition(":")[2].split())


def requested(argv: list[str], key: str) -> str:
    """The ``key=VALUE`` override on a command line (``trainer.cpu_kernels``), ``auto`` without one; read from the
    arguments because the choice must be made before torch's first operation, before Hydra composes the config.
    A value outside ``CHOICES`` is left for the config check to report."""
    value = "auto"
    for arg in argv:
        name, _, v = arg.lstrip("+").partition("=")
        if name == key:
            value = v
    return value


def choose_kernels(choice: str = "auto", environ=os.environ, flags: set[str] | None = None) -> str | None:
    """``auto``: set ``ATEN_CPU_CAPABILITY=avx2`` in ``environ`` where the CPU has AVX-512 (and so AVX2) and the
    variable is unset; ``avx2`` / ``avx512`` / ``default``: set it to that; ``torch``: leave it. Then, where the
    variable is set and ``TORCHINDUCTOR_CACHE_DIR`` is not, point the latter at the set's own cache
    (``inductor_cache``). Returns the kernel set now asked for, or None where torch will pick it itself."""
    if choice not in CHOICES:
        return environ.get(VARIABLE)  # refused by the config check with the key's name
    if choice in ("avx2", "avx512", "default"):
        environ[VARIABLE] = choice
    elif choice == "auto" and VARIABLE not in environ:
        flags = cpu_flags() if flags is None else flags
        if "avx512f" in flags and "avx2" in flags:
            environ[VARIABLE] = PREFERRED
    kernel_set = environ.get(VARIABLE)
    if kernel_set and (CACHE_VARIABLE not in environ or _per_set_cache(environ[CACHE_VARIABLE])):
        # a child of an nvil process inherits its parent's per-set cache: re-pointed if it runs another set
        environ[CACHE_VARIABLE] = inductor_cache(kernel_set)
    return kernel_set


def inductor_cache(kernel_set: str) -> str:
    """``<tmp>/torchinductor_<user>_<set>``: beside torch's default ``<tmp>/torchinductor_<user>``, one per set."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (some containers)
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in f"{user}_{kernel_set.lower()}")
    return os.path.join(tempfile.gettempdir(), f"torchinductor_{safe}")


def _per_set_cache(path: str) -> bool:
    """Whether ``path`` is one of ``inductor_cache``'s folders (set by nvil, not by the user)."""
    prefix = inductor_cache("")  # <tmp>/torchinductor_<user>_
    return path.startswith(prefix) and os.sep not in path[len(prefix):]


def capability() -> str:
    """The kernel set torch runs in this process ("AVX2", "AVX512", "DEFAULT", or the platform's name)."""
    import torch

    return torch.backends.cpu.get_cpu_capability()
