"""NVIL: Neural Variational Inference and Learning (Mnih & Gregor 2014).

One sample h ~ q(h | x) per observation and the learning signal l(x, h) = log p(x, h) - log q(h | x):

- model:      grad_theta log p(x, h)                                       (Eq. 5)
- inference:  (l - b_psi(x) - c) / max(1, sqrt(v)) * grad_phi log q(h | x)  (Eq. 6, Sec. 2.3)
- baseline:   b_psi trained to reduce (l - b_psi(x) - c)^2                  (Sec. 2.3.1)

c and v are running averages (smoothing 0.8) of the mean and variance of l - b_psi(x) over the
minibatch, updated before they are used (supplementary Algorithm 1). With layer-wise signals
(Sec. 2.3.3) layer i gets l_i = log p(h_{i-1}, ..., h_n) - log q(h_i, ..., h_n | h_{i-1}) with its own
b_i(h_{i-1}), c_i and v_i. Each technique can be switched off for the paper's Fig. 1 ablation.

``step`` returns the reported objective (``train/elbo``) separately from the surrogate loss that is
differentiated; no Python loop runs over examples or samples, only over the (few) layers. The arithmetic of
the signals is in ``nvil.learners.baselines``.
"""

from __future__ import annotations

import torch
from torch import nn

from nvil.core.ops import RunningMoments
from nvil.learners.base import SurrogateLearner, build_optimizer, directed_groups
from nvil.learners.baselines import (
    InputDependentBaseline,
    LearningSignal,
    SignalFlags,
    baseline_loss,
    layerwise_signals,
    learning_signal,
    signal_metrics,
)
from nvil.learners.diagnostics import GradientDiagnostics, ascent
from nvil.learners.fused import fused_gradients
from nvil.learners.fused_path import FusedPath


class NVIL(FusedPath, GradientDiagnostics, SurrogateLearner):
    """The NVIL learner for directed binary models with a layered inference network.

    Two gradient paths share the draws, the signals (``signals``) and the optimiser step: autograd through
    ``surrogate`` (every model), and for layered Bernoulli models (``nvil.learners.fused.covers``) the hand-derived
    gradients of ``nvil.learners.fused`` (faster than autograd: ``nvil.backend.registry``, entry
    ``nvil_hand_derived``). For one seed both take the same updates.
    Data parallelism (whose gradients DDP averages during ``backward``) runs the autograd path; ``trainer.accel=compile``
    compiles whichever path runs (``FusedPath.accelerate``)."""

    def __init__(self, model: nn.Module, inference: nn.Module, *, device: torch.device | str = "cpu", seed: int = 0,
                 optimizer: str = "adam", lr: float = 0.001, momentum: float = 0.0, beta2: float = 0.999,
                 inference_lr_scale: float = 0.2, baseline_lr_scale: float = 1.0, baseline_hidden: int = 100,
                 smoothing: float = 0.8, input_baseline: bool = True, constant_baseline: bool = True,
                 variance_normalisation: bool = True, layerwise: bool = True) -> None:
        """Defaults: configs/learner/nvil.yaml. ``optimizer``: adam | sgd (the paper: plain SGD at a fixed rate);
        ``lr``: the model's rate; ``momentum``: SGD's; ``beta2``: Adam's second-moment decay (the REBAR authors'
        code: 0.99999); ``inference_lr_scale``: the inference network's rate relative to lr (five times smaller, as
        in the paper); ``baseline_lr_scale``: the input-dependent baseline's; ``baseline_hidden``: its tanh units
        (one hidden layer); ``smoothing``: of the running mean / variance of the centred signal (c and v). The
        switches of the Fig. 1 ablation: ``input_baseline``, ``constant_baseline``, ``variance_normalisation``,
        ``layerwise`` (Sec. 2.3.1-2.3.3). ``device`` and ``seed``: the learner's generator."""
        super().__init__()
        self.model, self.inference = model, inference
        self.flags = SignalFlags(bool(input_baseline), bool(constant_baseline), bool(variance_normalisation),
                                 bool(layerwise))
        in_dims = [model.n_visible] + model.layers[:-1]
        self.baselines = nn.ModuleList(
            InputDependentBaseline(d, int(baseline_hidden)) for d in in_dims
        ) if self.flags.input_baseline else nn.ModuleList()
        self.moments = nn.ModuleList(RunningMoments(float(smoothing)) for _ in range(len(model.layers)))
        self.to(device)
        lr, groups = directed_groups(model, inference, lr, inference_lr_scale)
        if self.flags.input_baseline:
            groups.append({"params": list(self.baselines.parameters()), "lr": lr * float(baseline_lr_scale),
                           "name": "baseline"})
        self.optimizer = build_optimizer(groups, optimizer, lr, momentum, beta2)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.fused = fused_gradients(model, inference, self.baselines)

    @property
    def use_variance_norm(self) -> bool:
        return self.flags.variance_normalisation

    # ---------------------------------------------------------------------------------------------
    def signals(self, log_p: list[torch.Tensor], log_q: list[torch.Tensor], b: list[torch.Tensor],
                update_moments: bool, diagnostics: bool) -> tuple[list[LearningSignal], dict]:
        """Each layer's ``LearningSignal`` (c and v updated unless ``update_moments`` is false) and the metrics, from
        the detached log-probabilities and the baselines' outputs ``b`` (with their graph on the autograd path)."""
        ls = layerwise_signals(log_p, log_q, self.flags.layerwise)
        # ls[0] is the full l = log p(x, h) - log q(h | x) whether or not signals are layer-wise.
        metrics = {"train/elbo": ls[0].mean()}
        signals = [learning_signal(l, b_j, m, self.flags, update_moments) for l, b_j, m in zip(ls, b, self.moments)]
        if diagnostics:
            metrics["train/model_loss"] = -sum(log_p).mean()
            for j, (l, b_j, m) in enumerate(zip(ls, b, self.moments)):
                metrics.update(signal_metrics(l, b_j, m, self.flags, f"nvil/layer{j + 1}"))
        return signals, metrics

    def surrogate(self, x: torch.Tensor, update_moments: bool = True, diagnostics: bool = True) -> tuple[torch.Tensor, dict]:
        """(surrogate loss to differentiate, metrics). The loss's gradient is minus NVIL's estimate.

        ``update_moments=False`` keeps c and v fixed (used by the gradient tests); ``diagnostics=False`` leaves
        out ``train/model_loss`` and the per-layer metrics (steps the loop does not log).
        """
        hs, log_q = self.inference.sample(x, generator=self.generator)
        log_p = self.model.log_prob_layers(x, hs)
        inputs = [self.inference.centre(x)] + hs[:-1]
        b = [net(v) for net, v in zip(self.baselines, inputs)] or [torch.zeros_like(lq) for lq in log_q]
        signals, metrics = self.signals([t.detach() for t in log_p], [t.detach() for t in log_q], b, update_moments,
                                        diagnostics)
        loss = -sum(log_p).mean()
        for s, lq in zip(signals, log_q):
            loss = loss - (s.a * lq).mean() + baseline_loss(s, self.flags)
        return loss, metrics

    def gradient_estimate(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """One draw of NVIL's estimate of the ELBO's gradient (autograd path, c and v held): the inference network's
        part with the variance normalisation undone (layer j's signal is divided by max(1, sqrt v_j), Sec. 2.3.2),
        so it estimates the gradient itself and compares with other estimators' and the exact one."""
        loss, _ = self.surrogate(x, update_moments=False, diagnostics=False)
        grads = ascent(loss, self.estimated_params())
        if self.use_variance_norm:
            for k in grads:
                if k.startswith("inference."):
                    grads[k] = grads[k] * self.moments[int(k.split(".")[2])].var.sqrt().clamp(min=1.0)
        return grads

    @torch.no_grad()
    def fused_signals(self, x: torch.Tensor, uniforms: list[torch.Tensor], diagnostics: bool = False) -> tuple:
        """The hand-derived step up to its weight GEMMs, from the forward pass's uniforms: forward, signals (c and v
        updated), every layer's dL/d(output) (``LayeredBernoulliGradients.output_grads``). Returns (grads, metrics)."""
        f = self.fused.forward_from(x, uniforms)
        signals, metrics = self.signals(f.log_p, f.log_q, f.b, True, diagnostics)
        return self.fused.output_grads(f, x, signals), metrics

    def extra_state(self) -> dict[str, nn.Module]:
        """Baselines and c/v travel in checkpoints beside the optimiser and RNG."""
        return {"baselines": self.baselines, "moments": self.moments}
