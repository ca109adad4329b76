"""The variance and signal-to-noise ratio of a learner's gradient estimate, by repeated sampling on a fixed
minibatch (the comparison every paper on discrete gradient estimators makes; Rainforth et al. 2018's per-parameter
SNR = |E g| / std g).

``GradientDiagnostics`` is a mixin for learners whose update is an estimate of one gradient (NVIL and the
estimators of ``nvil.learners.discrete``): ``gradient_estimate(x)`` draws one estimate without changing the
learner's state, and ``gradient_diagnostics`` repeats it with its own generator, so the training stream is the same
whether or not diagnostics run. The loop logs the result every ``trainer.grad_diag_every`` steps through
``log_gradient_diagnostics``, which takes those settings as plain values.
"""

from __future__ import annotations

import torch

from nvil.core.ops import take_rows, to_floats


class GradientDiagnostics:
    """Mixin for ``SurrogateLearner``s with ``model`` and ``inference`` networks and a ``generator``."""

    def estimated_params(self) -> dict[str, torch.nn.Parameter]:
        """The parameters whose gradient is estimated: ``model.*`` and ``inference.*`` (not baselines or control
        variates, whose updates are not gradients of the objective)."""
        return dict(self.model.named_parameters(prefix="model")) | dict(
            self.inference.named_parameters(prefix="inference"))

    def gradient_estimate(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """One draw of the ascent direction {name: tensor}, minus the surrogate's gradient, with the learner's
        state (running moments, control variates) left as it is. Learners whose surrogate is not the estimate
        itself (NVIL's variance normalisation, REBAR's second-order update) override it."""
        loss, _ = self.surrogate(x, diagnostics=False)
        return ascent(loss, self.estimated_params())

    def gradient_diagnostics(self, x: torch.Tensor, repeats: int, seed: int) -> dict[str, torch.Tensor]:
        """``grad/inference_variance`` (the trace of the covariance of the inference network's minibatch gradient
        estimate), ``grad/snr`` (the mean over its coordinates of |mean| / std), ``grad/inference_norm`` (|mean|),
        and ``grad/model_variance``, from ``repeats`` estimates on the minibatch ``x`` drawn with ``seed``."""
        saved = self.generator
        self.generator = torch.Generator(device=saved.device).manual_seed(seed)
        try:
            draws = [self.gradient_estimate(x) for _ in range(repeats)]
        finally:
            self.generator = saved
        out = {}
        for prefix in ("inference.", "model."):
            g = torch.stack([torch.cat([t.flatten() for k, t in d.items() if k.startswith(prefix)]) for d in draws])
            mean, var = g.mean(0), g.var(0)
            out[f"grad/{prefix[:-1]}_variance"] = var.sum()
            if prefix == "inference.":
                std = var.sqrt()
                moving = std > 0
                out["grad/snr"] = (mean[moving].abs() / std[moving]).mean()
                out["grad/inference_norm"] = torch.linalg.vector_norm(mean)
        return out


def ascent(loss: torch.Tensor, params: dict[str, torch.nn.Parameter]) -> dict[str, torch.Tensor]:
    """{name: -d loss / d p} (zeros for a parameter the loss does not reach)."""
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    return {k: (-g if g is not None else torch.zeros_like(p)) for (k, p), g in zip(params.items(), grads)}


def log_gradient_diagnostics(logger, run, step: int, *, every: int | None, examples: int = 100, repeats: int = 50,
                             seed: int = 0, device: torch.device | str = "cpu") -> None:
    """The loop's call after step ``step`` of ``run`` (its ``learner`` and ``data``): every ``every`` steps (None:
    never; ``trainer.grad_diag_every``), log ``gradient_diagnostics`` on the first ``examples`` training examples
    (``trainer.grad_diag_examples``) with ``repeats`` draws (``trainer.grad_diag_repeats``), seeded by
    ``seed + step``."""
    if every and step % every == 0:
        x = take_rows(run.data.split("train"), 0, examples).to(device)
        metrics = run.learner.gradient_diagnostics(x, repeats, seed + step)
        if metrics:  # learners that do not estimate a gradient by sampling q have none
            logger.scalars(step, to_floats(metrics))
