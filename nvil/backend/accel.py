"""A switchable acceleration layer for the hot loops: ``accel`` is ``none``, ``compile`` or ``cudagraphs``.

- ``none``: the eager functions, exactly as written (the default; bit-for-bit the plain code path).
- ``compile``: ``torch.compile`` (default mode; Inductor fuses the elementwise work around each matmul into
  a few vectorised kernels, on CPU and CUDA).
- ``cudagraphs``: ``torch.compile(mode="reduce-overhead")``, which also records the compiled kernels in CUDA
  graphs and replays them, removing the per-kernel launch cost. CUDA only.
- ``native``: the sequential (single-site) Gibbs sweeps as one C call per sweep (``nvil.backend.native``: the semi-RBM's
  pixel sweep, ``SequentialGibbs`` for Chib, the harmonic mean and per-example AIS); every other function stays
  eager. CPU only; compiled once per machine with the system C compiler.
- ``auto``: ``native`` for the sequential sweeps of CPU tensors where the C kernels build (else, after one warning,
  the eager sweeps); ``none`` for everything else and on CUDA. The estimators' default. In a training run of at
  least ``AUTO_COMPILE_STEPS`` updates on a CPU, a learner whose step repays its compilation there (the hand-derived
  NVIL-family steps, ``FusedPath.auto_compiles``) is compiled as with ``compile``; where that compilation fails (no
  C++ compiler for Inductor), one warning and the eager step (``eager_if_uncompilable``).

``compiled(mode)`` says whether a mode compiles anything with ``torch.compile`` (``compile``, ``cudagraphs``): the
fused-kernel and autograd paths switch on that, never on ``native`` or ``auto``.

Our samplers draw their random numbers from an explicit ``torch.Generator``, which ``torch.compile`` cannot
trace (a graph break at every ``torch.rand(..., generator=g)``). So what is compiled is always a deterministic
function of tensors: the caller draws the uniforms with its generator first, in the order the eager code draws
them, and passes them in. The random stream is therefore the same in every mode; the numbers agree with
``none`` up to float rounding (fused kernels may round differently in the last bit).

    from nvil.backend.accel import accelerate
    fast = accelerate(fn, "compile")             # fn itself when accel=none

Learners apply ``trainer.accel`` to their own hot loops (``Learner.accelerate``: NVIL / wake-sleep compile their
surrogate, SAP its negative phase's sweeps).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from typing import Callable

import torch

from nvil.core.errors import ConfigError

MODES = ("none", "compile", "cudagraphs", "native", "auto")
# The run length from which ``auto`` compiles a CPU step: long enough for the compiled step's savings to repay the
# compilation (docs/benchmarks.md, "Measured defaults").
AUTO_COMPILE_STEPS = 20_000


def compiled(mode: str) -> bool:
    """Whether ``mode`` runs functions through ``torch.compile``."""
    return mode in ("compile", "cudagraphs")


def check_mode(mode: str, device=None, what: str = "accel") -> str:
    """``mode`` if it is known and possible on ``device`` (None: wherever CUDA is available); else a one-line
    ConfigError."""
    if mode not in MODES:
        raise ConfigError(f"{what} must be one of {list(MODES)}, got {mode!r}")
    if mode == "cudagraphs":
        on_cuda = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
        if not on_cuda:
            where = "this machine has no CUDA device" if device is None else f"the device is {torch.device(device).type}"
            raise ConfigError(f"{what}=cudagraphs captures CUDA graphs and needs a CUDA device, but {where}; "
                              f"use {what}=compile or {what}=none")
    if mode == "native" and device is not None and torch.device(device).type != "cpu":
        raise ConfigError(f"{what}=native runs the sequential sweeps as C code on the CPU, but the device is "
                          f"{torch.device(device).type}; use {what}=compile or {what}=cudagraphs there")
    return mode


def accelerate(fn: Callable, mode: str = "none", device=None, what: str = "accel") -> Callable:
    """``fn`` compiled according to ``mode`` (``fn`` itself for ``none``). ``fn`` must be a function of tensors
    (and Python constants) that draws no random numbers."""
    check_mode(mode, device, what)
    if not compiled(mode):  # native, auto: only the sequential sweeps have C kernels (nvil.backend.native)
        return fn
    if mode == "compile":
        return torch.compile(fn)
    graphed = torch.compile(fn, mode="reduce-overhead")

    @functools.wraps(fn)
    def replay(*args, **kwargs):
        # Outputs of a CUDA-graph replay live in memory the next replay overwrites: mark the step, and clone
        # them so that callers may keep them (a state carried to the next step, a log-weight) safely.
        torch.compiler.cudagraph_mark_step_begin()
        out = graphed(*args, **kwargs)
        return torch.utils._pytree.tree_map(lambda t: t.clone() if torch.is_tensor(t) else t, out)

    return replay


def eager_if_uncompilable(compiled_fn: Callable, eager_fn: Callable, what: str) -> Callable:
    """``compiled_fn``, or from its first call on ``eager_fn`` where that first call fails: ``auto``'s compilation,
    which must not stop a run that the eager step can do (Inductor's CPU code needs a C++ compiler and Python's
    headers). One warning names the reason; a later failure, or one the eager step shares, is raised as it is.
    ``compiled_fn`` must draw no random numbers and change no state before it fails (``accelerate``'s contract:
    a function of tensors), so the eager call repeats nothing."""
    chosen: list[Callable] = []

    @functools.wraps(eager_fn)
    def call(*args, **kwargs):
        if chosen:
            return chosen[0](*args, **kwargs)
        try:
            with quiet_cpu_compile():
                out = compiled_fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001  (any failure to compile; the eager call below raises real errors)
            warnings.warn(f"{what}=auto could not compile the step ({type(e).__name__}: "
                          f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else 'no message'}); it runs "
                          "eagerly (slower)", stacklevel=2)
            chosen.append(eager_fn)
            return eager_fn(*args, **kwargs)
        chosen.append(compiled_fn)
        return out

    return call


@contextlib.contextmanager
def quiet_cpu_compile():
    """Inductor's first CPU compilation logs "No CUDA runtime is found, using CUDA_HOME=..." as a warning on a machine
    without CUDA (``torch.utils.cpp_extension``): noise for a CPU graph. Silenced for the duration."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def accelerate_sampling(mode: str, *modules: torch.nn.Module) -> None:
    """``mode`` (``trainer.accel`` or ``estimator.accel``) passed to every submodule with sequential draws of its own:
    the ``accelerate_sampling(mode)`` protocol of the autoregressive layers (fDARN's prior, autoregressive inference
    networks), which draw their units in C with ``native`` / ``auto`` on a CPU (``nvil.backend.native``)."""
    for module in modules:
        if module is None:
            continue
        for m in module.modules():
            if hasattr(m, "accelerate_sampling"):
                m.accelerate_sampling(mode)


_libraries: dict[str, torch.library.Library] = {}  # one per namespace, kept alive while its operators are in use


def opaque_when_compiled(name: str, fake: Callable) -> Callable:
    """Decorator: ``fn`` called as itself eagerly and, under ``torch.compile``, as the operator ``name``
    (``"namespace::op"``; ``fake`` gives its output's shape), an opaque call inside the graph with no break.
    Eager callers never go through the operator: its first eager call costs seconds of set-up.
    Defined with ``torch.library.Library`` (schema inferred from ``fn``'s type annotations, one implementation for
    every device): a compiled graph's call then skips ``torch.library.custom_op``'s wrappers, which cost more than
    the call itself in a step this small. Like a ``custom_op`` without a registered backward,
    the operator is for calls outside autograd."""

    def wrap(fn: Callable) -> Callable:
        namespace, op_name = name.split("::")
        if namespace not in _libraries:
            _libraries[namespace] = torch.library.Library(namespace, "FRAGMENT")
        library = _libraries[namespace]
        library.define(op_name + torch.library.infer_schema(fn, mutates_args=()))
        library.impl(op_name, fn, "CompositeExplicitAutograd")
        torch.library.register_fake(name, fake, lib=library)
        op = getattr(getattr(torch.ops, namespace), op_name).default

        @functools.wraps(fn)
        def call(*args):
            return op(*args) if torch.compiler.is_compiling() else fn(*args)

        return call

    return wrap
