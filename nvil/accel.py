"""A switchable acceleration layer for the hot loops: ``accel`` is ``none``, ``compile`` or ``cudagraphs``.

- ``none``: the eager functions, exactly as written (the default; bit-for-bit the plain code path).
- ``compile``: ``torch.compile`` (default mode; Inductor fuses the elementwise work around each matmul into
  a few vectorised kernels, on CPU and CUDA).
- ``cudagraphs``: ``torch.compile(mode="reduce-overhead")``, which also records the compiled kernels in CUDA
  graphs and replays them, removing the per-kernel launch cost. CUDA only.

Our samplers draw their random numbers from an explicit ``torch.Generator``, which ``torch.compile`` cannot
trace (a graph break at every ``torch.rand(..., generator=g)``). So what is compiled is always a deterministic
function of tensors: the caller draws the uniforms with its generator first, in the order the eager code draws
them, and passes them in. The random stream is therefore the same in every mode; the numbers agree with
``none`` up to float rounding (fused kernels may round differently in the last bit).

    from nvil.accel import accelerate, accelerate_learner
    fast = accelerate(fn, "compile")             # fn itself when accel=none
    accelerate_learner(learner, cfg.trainer.accel, device)   # NVIL / wake-sleep surrogate, SAP negative phase
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from nvil.errors import ConfigError

MODES = ("none", "compile", "cudagraphs")


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
    return mode


def accelerate(fn: Callable, mode: str = "none", device=None, what: str = "accel") -> Callable:
    """``fn`` compiled according to ``mode`` (``fn`` itself for ``none``). ``fn`` must be a function of tensors
    (and Python constants) that draws no random numbers."""
    check_mode(mode, device, what)
    if mode == "none":
        return fn
    if mode == "compile":
        return torch.compile(fn)
    compiled = torch.compile(fn, mode="reduce-overhead")

    @functools.wraps(fn)
    def replay(*args, **kwargs):
        # Outputs of a CUDA-graph replay live in memory the next replay overwrites: mark the step, and clone
        # them so that callers may keep them (a state carried to the next step, a log-weight) safely.
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(*args, **kwargs)
        return torch.utils._pytree.tree_map(lambda t: t.clone() if torch.is_tensor(t) else t, out)

    return replay


def accelerate_learner(learner, mode: str = "none", device=None):
    """Apply ``accel`` to a training learner in place and return it; the training loop calls this once, after
    building the learner (and before restoring a checkpoint or not: it keeps no state of its own).

    - learners with a ``surrogate(x)`` (``SurrogateLearner``: NVIL, wake-sleep): ``surrogate`` is replaced by its
      compiled version (an instance attribute); sampling stays eager, on the learner's generator, between the
      compiled pieces. ``step`` is unchanged: it still calls ``surrogate``, ``backward`` and the optimiser.
    - ``SAP`` (sap, trans_sap, cd; pt_sap's Gibbs sweeps): the block-Gibbs sweeps and the tempered-transitions
      run of the negative phase use the fused kernels of ``BoltzmannMachine.gibbs_kernel`` (binary RBMs
      without labels or lateral weights; other Boltzmann machines stay eager).
    - anything else (MCEM, exact ML): unchanged.

    ``none`` changes nothing. The random stream is unchanged in every mode.
    """
    check_mode(mode, device, "trainer.accel")
    if mode == "none":
        return learner
    from nvil.mcmc.gibbs import BlockGibbs
    from nvil.mcmc.tempered import TemperedTransitions

    if isinstance(getattr(learner, "gibbs", None), BlockGibbs):  # SAP and its variants
        learner.gibbs = BlockGibbs(learner.model, accel=mode)
        if getattr(learner, "pt", None) is not None:
            learner.pt.gibbs = BlockGibbs(learner.model, accel=mode)
        if isinstance(getattr(learner, "tt", None), TemperedTransitions):
            learner.tt = TemperedTransitions(learner.model, learner.tt.betas, accel=mode)
        return learner
    if callable(getattr(learner, "surrogate", None)):
        # Dynamo splits the surrogate at each sampling call (torch.rand with the learner's generator, which it
        # cannot trace) and compiles the pieces between them, forward and backward; the draws stay eager.
        learner.surrogate = accelerate(learner.surrogate, mode, device, "trainer.accel")
    return learner
