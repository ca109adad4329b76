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

from nvil.learners.base import SurrogateLearner, build_optimizer, directed_groups
from nvil.learners.baselines import (InputDependentBaseline, SignalFlags, layerwise_signals, learning_signal,
                                     signal_metrics)
from nvil.ops import RunningMoments


class NVIL(SurrogateLearner):
    """The NVIL learner for directed binary models with a layered inference network."""

    def __init__(self, model: nn.Module, inference: nn.Module, cfg, device: torch.device, seed: int) -> None:
        super().__init__()
        self.model, self.inference, self.cfg = model, inference, cfg
        self.flags = SignalFlags.from_cfg(cfg)
        in_dims = [model.n_visible] + model.layers[:-1]
        self.baselines = nn.ModuleList(
            InputDependentBaseline(d, int(cfg.baseline_hidden)) for d in in_dims
        ) if self.flags.input_baseline else nn.ModuleList()
        self.moments = nn.ModuleList(RunningMoments(float(cfg.smoothing)) for _ in range(len(model.layers)))
        self.to(device)
        lr, groups = directed_groups(model, inference, cfg)
        if self.flags.input_baseline:
            groups.append({"params": list(self.baselines.parameters()), "lr": lr * float(cfg.baseline_lr_scale), "name": "baseline"})
        self.optimizer = build_optimizer(groups, cfg)
        self.generator = torch.Generator(device=device).manual_seed(seed)

    @property
    def use_variance_norm(self) -> bool:
        return self.flags.variance_normalisation

    # ---------------------------------------------------------------------------------------------
    def surrogate(self, x: torch.Tensor, update_moments: bool = True, diagnostics: bool = True) -> tuple[torch.Tensor, dict]:
        """(surrogate loss to differentiate, metrics). The loss's gradient is minus NVIL's estimate.

        ``update_moments=False`` keeps c and v fixed (used by the gradient tests); ``diagnostics=False`` leaves
        out the per-layer metrics (steps the loop does not log).
        """
        hs, log_q = self.inference.sample(x, generator=self.generator)
        log_p = self.model.log_prob_layers(x, hs)
        signals = layerwise_signals([t.detach() for t in log_p], [t.detach() for t in log_q], self.flags.layerwise)
        baseline_inputs = [self.inference.centre(x)] + hs[:-1]

        model_loss = -sum(log_p).mean()
        inference_loss = x.new_zeros(())
        baseline_loss = x.new_zeros(())
        # signals[0] is the full l = log p(x, h) - log q(h | x) whether or not signals are layer-wise.
        metrics = {"train/elbo": signals[0].mean().detach()}
        for j, (l, lq) in enumerate(zip(signals, log_q)):
            b = self.baselines[j](baseline_inputs[j]) if self.flags.input_baseline else torch.zeros_like(l)
            a, layer_baseline_loss = learning_signal(l, b, self.moments[j], self.flags, update_moments)
            inference_loss = inference_loss - (a * lq).mean()
            baseline_loss = baseline_loss + layer_baseline_loss
            if diagnostics:
                metrics.update(signal_metrics(l, b, self.moments[j], self.flags, f"nvil/layer{j + 1}"))
        metrics["train/model_loss"] = model_loss.detach()
        return model_loss + inference_loss + baseline_loss, metrics

    def extra_state(self) -> dict[str, nn.Module]:
        """Baselines and c/v travel in checkpoints beside the optimiser and RNG."""
        return {"baselines": self.baselines, "moments": self.moments}
