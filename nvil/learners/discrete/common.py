"""What the gradient estimators for discrete latents share (``nvil.learners.discrete``).

Every estimator here estimates the gradient of the ELBO, E_q[f(h)] with f(h) = log p(x, h) - log q(h | x), in the
model's parameters theta and the inference network's phi (VIMCO: of the K-sample bound). The model's part is
always grad_theta log p(x, h) at samples from q; the estimators differ in the inference network's part. f also
depends on phi directly, through log q; that term's expectation is -E_q[grad_phi log q] = 0 and, as in NVIL's
Eq. 6, every estimator leaves it out.

- ``DiscreteLearner``: the optimiser (model, inference network and any control variate), the generator, and
  ``gradient_estimate`` (one unbiased draw of the ascent direction without changing any state), which the tests
  compare with exact gradients and ``nvil.learners.diagnostics`` repeats to measure variance and SNR.
- ``MultiSample``, ``FusedMultiSample``: K samples per example; the latter with the hand-derived path.
- ``repeat``, ``elbo_integrand``, ``bernoulli_path``: the pieces the estimators are written in.
"""

from __future__ import annotations

import torch
from torch import nn

from nvil.core.config import positive_int
from nvil.core.errors import ConfigError
from nvil.learners.base import SurrogateLearner, build_optimizer, directed_groups
from nvil.learners.diagnostics import GradientDiagnostics
from nvil.learners.fused import fused_gradients
from nvil.learners.fused_path import FusedPath

EPS = 1e-6  # see DiscreteLearner.open_rand


class DiscreteLearner(GradientDiagnostics, SurrogateLearner):
    """A learner for a directed binary model whose update is the gradient of ``surrogate`` (minus the estimate).

    Subclasses set ``evaluations_per_example`` (forward evaluations of log p(x, h) per example and update: the
    cost the benchmark matches budgets on) and may add parameters of their own with ``control_variate``.
    ``needs_bernoulli_q``: the estimator draws q's units from its own uniforms (factorial Bernoulli layers)."""

    evaluations_per_example: int = 1
    needs_bernoulli_q: bool = False
    NAME: str = ""  # the learner's name in the registry (``learner=NAME``), for error messages

    def __init__(self, model: nn.Module, inference: nn.Module, *, device: torch.device | str = "cpu", seed: int = 0,
                 optimizer: str = "adam", lr: float = 0.001, momentum: float = 0.0, beta2: float = 0.999,
                 inference_lr_scale: float = 0.2, control_variate: nn.Module | None = None,
                 cv_lr_scale: float = 1.0) -> None:
        """The settings every estimator here shares (configs/learner/<name>.yaml): ``optimizer`` (adam | sgd),
        ``lr`` (the model's rate), ``momentum`` (SGD's), ``beta2`` (Adam's second-moment decay),
        ``inference_lr_scale`` (q's rate relative to lr); ``control_variate`` trains at ``lr * cv_lr_scale``.
        ``device`` and ``seed``: the learner's generator."""
        super().__init__()
        self.model, self.inference = model, inference
        if self.needs_bernoulli_q and not inference.factorial:
            raise ConfigError(f"learner={self.NAME} needs factorial Bernoulli inference layers "
                              "(model.inference.autoregressive=false)")
        self.control_variate = control_variate
        self.to(device)
        lr, groups = directed_groups(model, inference, lr, inference_lr_scale)
        if control_variate is not None:
            groups.append({"params": list(control_variate.parameters()), "lr": lr * float(cv_lr_scale),
                           "name": "control_variate"})
        self.optimizer = build_optimizer(groups, optimizer, lr, momentum, beta2)
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def extra_state(self) -> dict[str, nn.Module]:
        return {} if self.control_variate is None else {"control_variate": self.control_variate}

    def rand(self, shape, like: torch.Tensor) -> torch.Tensor:
        return torch.rand(shape, generator=self.generator, device=like.device, dtype=like.dtype)

    def open_rand(self, shape, like: torch.Tensor) -> torch.Tensor:
        """Uniforms kept in [EPS, 1 - EPS], so their logistic transforms (torch.logit) stay finite in float32."""
        return self.rand(shape, like).clamp_(EPS, 1 - EPS)


class MultiSample(DiscreteLearner):
    """K = ``num_samples`` samples per example (at least 2: a leave-one-out baseline needs another)."""

    def __init__(self, model: nn.Module, inference: nn.Module, *, device: torch.device | str = "cpu", seed: int = 0,
                 optimizer: str = "adam", lr: float = 0.001, momentum: float = 0.0, beta2: float = 0.999,
                 inference_lr_scale: float = 0.2, num_samples: int = 5) -> None:
        """``DiscreteLearner``'s settings and ``num_samples``, K (defaults: configs/learner/vimco.yaml, rloo.yaml)."""
        super().__init__(model, inference, device=device, seed=seed, optimizer=optimizer, lr=lr, momentum=momentum,
                         beta2=beta2, inference_lr_scale=inference_lr_scale)
        self.k = positive_int(num_samples, "learner.num_samples")
        if self.k < 2:
            raise ConfigError(f"learner.num_samples must be at least 2 for learner={self.NAME}, got {self.k}")
        self.evaluations_per_example = self.k


class FusedMultiSample(FusedPath, MultiSample):
    """A K-sample learner (VIMCO, RLOO) that takes the hand-derived path where ``nvil.learners.fused.covers`` holds:
    q draws for K copies of the minibatch, sample k of example n in row k N + n (``repeat``'s order, so the same
    draws as the autograd path); the learner defines ``fused_signals`` (``nvil.learners.fused_path``)."""

    def __init__(self, model: nn.Module, inference: nn.Module, *, device: torch.device | str = "cpu", seed: int = 0,
                 optimizer: str = "adam", lr: float = 0.001, momentum: float = 0.0, beta2: float = 0.999,
                 inference_lr_scale: float = 0.2, num_samples: int = 5) -> None:
        super().__init__(model, inference, device=device, seed=seed, optimizer=optimizer, lr=lr, momentum=momentum,
                         beta2=beta2, inference_lr_scale=inference_lr_scale, num_samples=num_samples)
        self.fused = fused_gradients(model, inference)

    def fused_rows(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat(self.k, 1)


def repeat(x: torch.Tensor, k: int) -> torch.Tensor:
    """x [batch, D] as [k, batch, D] without copies (stride 0: the inference network's first layer runs once)."""
    return x.unsqueeze(0).expand(k, *x.shape)


def elbo_integrand(model: nn.Module, x: torch.Tensor, hs: list[torch.Tensor], log_q: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(x, h), f = log p(x, h) - log q(h | x)) for samples ``hs`` with summed ``log_q``; broadcasts over
    leading dimensions. log p keeps its graph (the model's gradient); f is detached (a learning signal)."""
    log_p = model.log_joint(x, hs)
    return log_p, (log_p - log_q).detach()


def bernoulli_path(inference: nn.Module, x: torch.Tensor, uniforms: list[torch.Tensor],
                   fixed: dict[int, torch.Tensor] | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(h, logits) of q's layers drawn from the given ``uniforms``, h_i = 1[u_i < sigmoid(alpha_i)], except the
    layers in ``fixed`` {i: h_i}, taken as given. No gradient: the estimators recompute the logits they need."""
    hs, logits = [], []
    with torch.no_grad():
        below = x
        for i, u in enumerate(uniforms):
            alpha = inference.layer_logits(i, below)
            below = fixed[i] if fixed and i in fixed else (u < torch.sigmoid(alpha)).to(alpha.dtype)
            hs.append(below)
            logits.append(alpha)
    return hs, logits
