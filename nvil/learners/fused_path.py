"""The step of the learners with hand-derived gradients (``nvil.learners.fused``): NVIL's, VIMCO's, RLOO's, ARM's
and DisARM's, and wake-sleep's ``accelerate`` and ``distribute``."""

from __future__ import annotations

import torch

from nvil.backend.accel import AUTO_COMPILE_STEPS, check_mode, compiled
from nvil.learners.fused import LayeredBernoulliGradients, compile_fused
from nvil.learners.weight_steps import apply_update, plain_sgd_rates


class FusedPath:
    """The step of a learner with hand-derived gradients (NVIL, VIMCO, RLOO, ARM, DisARM; wake-sleep takes
    ``accelerate`` and ``distribute``): ``fused``, ``nvil.learners.fused.fused_gradients`` (None: autograd's
    ``SurrogateLearner.step``). The learner defines ``fused_signals(rows, uniforms, diagnostics) -> (grads,
    metrics)``, the step up to its weight GEMMs, and may define ``fused_rows(x)``, the rows q draws for (VIMCO: K
    copies of the minibatch). On a step that logs nothing ``fused_step`` runs it (compiled with
    ``trainer.accel=compile``) and plain SGD is written by the gradients' GEMMs (``apply_update``)."""

    fused: LayeredBernoulliGradients | None

    def fused_rows(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def step(self, x: torch.Tensor, diagnostics: bool = False) -> dict[str, torch.Tensor]:
        """One update; on the fused path the same draws, signals and optimiser step as ``SurrogateLearner.step``,
        with the gradients set by hand (no ``zero_grad``: every gradient is overwritten)."""
        if self.fused is None:
            return super().step(x, diagnostics)
        rates = None if diagnostics else plain_sgd_rates(self.optimizer)  # a logging step reports gradient norms
        rows = self.fused_rows(x)
        uniforms = self.fused.uniforms(rows, self.generator)
        grads, metrics = (self.fused_signals(rows, uniforms, diagnostics) if diagnostics
                          else self.fused_step(rows, uniforms))
        return apply_update(grads, metrics, self.optimizer, rates, diagnostics)

    def fused_step(self, x: torch.Tensor, uniforms: list[torch.Tensor]) -> tuple:
        """``fused_signals`` on a step that logs nothing: compiled with ``trainer.accel=compile`` (one graph, the
        small elementwise ops fused around the forward GEMMs; the weight GEMMs stay outside, writing in place),
        else eager."""
        return self.fused_signals(x, uniforms)

    def accelerate(self, mode: str, device=None, steps: int | None = None):
        """``trainer.accel=compile`` compiles the hand-derived step (``fused_step``) where it applies, else the
        autograd path's ``surrogate``; the autoregressive layers take the mode either way. ``auto`` compiles it too
        in a run of ``steps`` that repays the compilation (``auto_compiles``), falling back to the eager step where
        it cannot compile."""
        if self.fused is not None:
            check_mode(mode, device, "trainer.accel")
            auto = self.auto_compiles(mode, device, steps)
            if compiled(mode) or auto:
                self.fused_step = compile_fused(self.fused_step, self.fused, "compile" if auto else mode, device,
                                                fallback=auto)
                return self
        return super().accelerate(mode, device, steps)

    def auto_compiles(self, mode: str, device, steps: int | None) -> bool:
        """Whether ``trainer.accel=auto`` compiles the fused step: a CPU run of at least ``AUTO_COMPILE_STEPS`` updates
        whose step is one graph (``fused.compilable``). On a CPU, compiling roughly halves a batch-20 step (Python's
        per-operation cost is most of it); on CUDA ``auto`` leaves the choice to ``compile`` / ``cudagraphs``."""
        return (mode == "auto" and steps is not None and steps >= AUTO_COMPILE_STEPS and self.fused.compilable
                and device is not None and torch.device(device).type == "cpu")

    def distribute(self, d, device: torch.device) -> None:
        """Data parallelism averages gradients in DDP's ``backward``: the autograd path."""
        self.fused = None
        super().distribute(d, device)
