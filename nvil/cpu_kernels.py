"""Which of torch's CPU kernel sets runs: AVX2 on CPUs with AVX-512, unless the user chose (``ATEN_CPU_CAPABILITY``).

torch picks its vectorised CPU kernels once per process, at the first operation, from the CPU's instruction sets
or the environment variable ``ATEN_CPU_CAPABILITY`` (``default``, ``avx2``, ``avx512``). On a CPU with AVX-512
it picks ``avx512``, and with torch 2.14.1 two things go wrong there (bench/cpu_kernels.py measures both):

- **Speed.** Several element-wise kernels that this framework's hot loops use (``softplus``, ``log1p``,
  ``expm1``) run 5-10x slower in the AVX-512 set than in the AVX2 set (50,000 floats: log1p 0.97 ms against 0.10,
  softplus 1.06 against 0.21, one thread of an AMD EPYC with AVX-512). Every Bernoulli log-probability
  (``nvil.ops.bernoulli_log_prob``), RBM free energy and AIS weight increment goes through them: with the AVX2 set
  AIS on a 784-500 RBM takes 1.4x less time per step and IWAE(1000) 1.7x less, with identical results.
- **Memory safety of compiled code.** ``torch.compile`` (Inductor) generates C++ for the same instruction set; its
  AVX-512 code for the HMC, Gibbs, tempered-transitions and AIS steps of ``bench/profile_hot_loops.py`` corrupted the
  heap ("malloc(): unaligned tcache chunk detected") on that machine, and the same graphs built for AVX2 ran clean
  and equal to eager (tests/test_cpu_kernels.py).

So the first import of ``nvil`` sets ``ATEN_CPU_CAPABILITY=avx2`` when the CPU reports AVX-512 and the variable is
not set: before any torch operation in the processes of ``train.py``, ``evaluate.py``, the benches and the tests
(they import ``nvil`` first), and inherited by their child processes (torchrun workers, launcher jobs). A user who
sets the variable keeps their choice (``ATEN_CPU_CAPABILITY=avx512 python train.py`` restores torch's). Where torch
had already picked its kernels before ``nvil`` was imported (a notebook that ran torch first) nothing changes;
``capability()`` says what runs, and the training summary and the evaluator's JSON record it.
"""

from __future__ import annotations

import os

VARIABLE = "ATEN_CPU_CAPABILITY"
PREFERRED = "avx2"


def cpu_flags() -> set[str]:
    """The CPU's instruction-set flags from /proc/cpuinfo (empty where there is none: macOS, Windows)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.partition(":")[2].split())


def prefer_avx2(environ=os.environ, flags: set[str] | None = None) -> str | None:
    """Set ``ATEN_CPU_CAPABILITY=avx2`` in ``environ`` where the CPU has AVX-512 (and so AVX2) and the variable is
    unset; returns the value set, or None where nothing was changed."""
    if VARIABLE in environ:
        return None
    flags = cpu_flags() if flags is None else flags
    if "avx512f" not in flags or "avx2" not in flags:
        return None
    environ[VARIABLE] = PREFERRED
    return PREFERRED


def capability() -> str:
    """The kernel set torch runs in this process ("AVX2", "AVX512", "DEFAULT", or the platform's name)."""
    import torch

    return torch.backends.cpu.get_cpu_capability()
