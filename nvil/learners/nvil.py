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
    """The NVIL learner for directed binary models with a layered inference network (Mnih & Gregor 2014).

    Two gradient paths share the draws, the signals (``signals``) and the optimiser step: autograd through
    ``surrogate`` (every model), and for layered Bernoulli models (``nvil.learners.fused.covers``) the hand-derived
    gradients of ``nvil.learners.fused`` (faster than autograd: ``nvil.backend.registry``, entry
    ``nvil_hand_derived``). For one seed both take the same updates.
    Data parallelism (whose gradients DDP averages during ``backward``) runs the autograd path;
    ``trainer.accel=compile`` compiles whichever path runs (``FusedPath.accelerate``).

    The keyword defaults are those of configs/learner/nvil.yaml. The switches ``input_baseline``,
    ``constant_baseline``, ``variance_normalisation`` and ``layerwise`` are the paper's Fig. 1 ablation
    (Sec. 2.3.1-2.3.3).

    Parameters
    ----------
    model : nn.Module
        The directed model p(x, h) with parameters theta (an ``nvil.models.SBN`` or an fDARN), with ``n_visible``,
        ``layers`` and ``log_prob_layers``.
    inference : nn.Module
        The inference network q(h | x) with parameters phi (``nvil.models.LayeredInference``), with the same layer
        sizes as the model.
    device : torch.device or str, default "cpu"
        Where the learner (baselines, running moments) and its generator live.
    seed : int, default 0
        Seed of the learner's generator, which draws every h ~ q(h | x).
    optimizer : str, default "adam"
        ``adam`` or ``sgd`` (the paper: plain SGD at a fixed rate).
    lr : float, default 0.001
        The model's learning rate.
    momentum : float, default 0.0
        SGD's momentum.
    beta2 : float, default 0.999
        Adam's second-moment decay (the REBAR authors' code: 0.99999).
    inference_lr_scale : float, default 0.2
        The inference network's rate relative to ``lr`` (five times smaller, as in the paper).
    baseline_lr_scale : float, default 1.0
        The input-dependent baseline b_psi's rate relative to ``lr``.
    baseline_hidden : int, default 100
        Tanh units of b_psi's one hidden layer.
    smoothing : float, default 0.8
        Smoothing of the running mean c and variance v of the centred signal l - b_psi(x).
    input_baseline : bool, default True
        Subtract the input-dependent baseline b_psi(x) (Sec. 2.3.1).
    constant_baseline : bool, default True
        Subtract the running mean c (Sec. 2.3.1).
    variance_normalisation : bool, default True
        Divide the centred signal by max(1, sqrt(v)) (Sec. 2.3.2).
    layerwise : bool, default True
        Give layer i its own signal l_i, baseline b_i(h_{i-1}), c_i and v_i (Sec. 2.3.3); false: every layer gets
        the full l = log p(x, h) - log q(h | x).

    Examples
    --------
    >>> import torch
    >>> from nvil.models import SBN, LayeredInference
    >>> from nvil.learners import NVIL
    >>> learner = NVIL(SBN(6, [4, 3]), LayeredInference(6, [4, 3]), lr=0.01)
    >>> x = torch.bernoulli(torch.full((8, 6), 0.5))
    >>> metrics = learner.step(x)
    >>> sorted(metrics), metrics["train/elbo"].shape
    (['train/elbo'], torch.Size([]))
    >>> sorted(learner.step(x, diagnostics=True))[:4]
    ['grad_norm/baseline', 'grad_norm/inference', 'grad_norm/model', 'nvil/layer1/baseline_mse']
    """

    def __init__(self, model: nn.Module, inference: nn.Module, *, device: torch.device | str = "cpu", seed: int = 0,
                 optimizer: str = "adam", lr: float = 0.001, momentum: float = 0.0, beta2: float = 0.999,
                 inference_lr_scale: float = 0.2, baseline_lr_scale: float = 1.0, baseline_hidden: int = 100,
                 smoothing: float = 0.8, input_baseline: bool = True, constant_baseline: bool = True,
                 variance_normalisation: bool = True, layerwise: bool = True) -> None:
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
        """Whether the centred signal is divided by max(1, sqrt(v)) (``learner.variance_normalisation``, Sec. 2.3.2)."""
        return self.flags.variance_normalisation

    # ---------------------------------------------------------------------------------------------
    def signals(self, log_p: list[torch.Tensor], log_q: list[torch.Tensor], b: list[torch.Tensor],
                update_moments: bool, diagnostics: bool) -> tuple[list[LearningSignal], dict]:
        """Each layer's ``LearningSignal`` and the metrics, from detached log-probabilities and the baselines' outputs.

        c and v are updated unless ``update_moments`` is false; ``b`` are the baselines' outputs (with their graph
        on the autograd path).

        Parameters
        ----------
        log_p : list of torch.Tensor
            The model's per-layer terms [log p(x | h_1), ..., log p(h_{n-1} | h_n), log p(h_n)] (n + 1 tensors, each
            ``[batch]``), detached.
        log_q : list of torch.Tensor
            The inference network's per-layer terms [log q(h_1 | x), ..., log q(h_n | h_{n-1})] (n tensors, each
            ``[batch]``), detached.
        b : list of torch.Tensor
            Each layer's input-dependent baseline b_i(h_{i-1}) ``[batch]`` (zeros without ``input_baseline``).
        update_moments : bool
            Update each layer's running mean c and variance v with this minibatch before using them (Algorithm 1).
        diagnostics : bool
            Also report ``train/model_loss`` and the per-layer ``nvil/layer<i>/...`` metrics (signal mean and variance,
            c, v, the baseline's mean squared error).

        Returns
        -------
        signals : list of LearningSignal
            Per layer: a = (l - b - c) / max(1, sqrt(v)) (the factor of grad_phi log q, Eq. 6), the residual
            l - c - b and the scale.
        metrics : dict
            ``train/elbo`` (the mean of l = log p(x, h) - log q(h | x)) and, with ``diagnostics``, the rest;
            0-d tensors.
        """
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
        """The surrogate loss to differentiate (its gradient is minus NVIL's estimate) and the metrics.

        ``update_moments=False`` keeps c and v fixed (used by the gradient tests); ``diagnostics=False`` leaves
        out ``train/model_loss`` and the per-layer metrics (steps the loop does not log).

        Parameters
        ----------
        x : torch.Tensor
            The minibatch ``[batch, n_visible]``.
        update_moments : bool, default True
            Update the running mean c and variance v before they are used.
        diagnostics : bool, default True
            Report the metrics only a logging step reads.

        Returns
        -------
        loss : torch.Tensor
            0-d: -mean log p(x, h) - sum_i mean(a_i log q_i) plus the baselines' losses, whose gradient is minus the
            update (Eqs. 5-6, Sec. 2.3.1).
        metrics : dict
            As ``signals`` reports them.
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
        """One draw of NVIL's estimate of the ELBO's gradient (autograd path, c and v held).

        The inference network's part has the variance normalisation undone (layer j's signal is divided by
        max(1, sqrt v_j), Sec. 2.3.2), so it estimates the gradient itself and compares with other estimators' and the
        exact one.

        Parameters
        ----------
        x : torch.Tensor
            The minibatch ``[batch, n_visible]``.

        Returns
        -------
        dict of str to torch.Tensor
            The ascent direction per parameter name (``model.*``, ``inference.*``), each shaped like its parameter.
        """
        loss, _ = self.surrogate(x, update_moments=False, diagnostics=False)
        grads = ascent(loss, self.estimated_params())
        if self.use_variance_norm:
            for k in grads:
                if k.startswith("inference."):
                    grads[k] = grads[k] * self.moments[int(k.split(".")[2])].var.sqrt().clamp(min=1.0)
        return grads

    @torch.no_grad()
    def fused_signals(self, x: torch.Tensor, uniforms: list[torch.Tensor], diagnostics: bool = False) -> tuple:
        """The hand-derived step up to its weight GEMMs, from the forward pass's uniforms.

        Forward, signals (c and v updated), every layer's dL/d(output) (``LayeredBernoulliGradients.output_grads``).

        Parameters
        ----------
        x : torch.Tensor
            The minibatch ``[batch, n_visible]``.
        uniforms : list of torch.Tensor
            The uniforms of q's draws, one tensor per layer (``LayeredBernoulliGradients.uniforms``).
        diagnostics : bool, default False
            Report the metrics only a logging step reads.

        Returns
        -------
        grads : list of tuple
            The dL/d(output) entries of every affine layer and of the prior, as ``output_grads`` lists them.
        metrics : dict
            As ``signals`` reports them.
        """
        f = self.fused.forward_from(x, uniforms)
        signals, metrics = self.signals(f.log_p, f.log_q, f.b, True, diagnostics)
        return self.fused.output_grads(f, x, signals), metrics

    def extra_state(self) -> dict[str, nn.Module]:
        """Baselines and c/v travel in checkpoints beside the optimiser and RNG.

        Returns
        -------
        dict of str to nn.Module
            ``{"baselines": ..., "moments": ...}``, each saved and restored with its ``state_dict``.
        """
        return {"baselines": self.baselines, "moments": self.moments}
