"""Straight-through Gumbel-softmax for Bernoulli latents (Jang, Gu & Poole 2017; Maddison, Mnih & Teh 2017).

Each unit draws z = alpha + log u - log(1 - u) (the two-class Gumbel-softmax is the logistic), takes the hard
sample b = 1[z > 0] forward and the relaxed sample's gradient backward: h = b + s - stop_gradient(s), s =
sigmoid(z / tau). Every layer's logits see the layer below's h, so the gradient of f(h) = log p(x, h) - log q(h | x)
flows through the whole stack by backpropagation. The forward value is a true sample from q, the gradient is not
the gradient of the ELBO: the estimator is biased (the reference users ask about; the tests measure its bias).
"""

from __future__ import annotations

import torch
from torch import nn

from nvil.backend.native.bernoulli_log_prob import bernoulli_log_prob
from nvil.core.config import positive_float
from nvil.learners.discrete.common import DiscreteLearner


class GumbelST(DiscreteLearner):
    """``DiscreteLearner``'s keywords and ``temperature``, tau of sigmoid(z / tau) (defaults:
    configs/learner/gumbel_st.yaml)."""

    needs_bernoulli_q = True
    NAME = "gumbel_st"

    def __init__(self, model: nn.Module, inference: nn.Module, *, device: torch.device | str = "cpu", seed: int = 0,
                 optimizer: str = "adam", lr: float = 0.001, momentum: float = 0.0, beta2: float = 0.999,
                 inference_lr_scale: float = 0.2, temperature: float = 1.0) -> None:
        super().__init__(model, inference, device=device, seed=seed, optimizer=optimizer, lr=lr, momentum=momentum,
                         beta2=beta2, inference_lr_scale=inference_lr_scale)
        self.temperature = positive_float(temperature, "learner.temperature")

    def surrogate(self, x: torch.Tensor, diagnostics: bool = True) -> tuple[torch.Tensor, dict]:
        hs, log_q, below = [], 0.0, x
        for i in range(len(self.inference.encoders)):
            alpha = self.inference.layer_logits(i, below)
            z = alpha + torch.logit(self.open_rand(alpha.shape, x))
            soft = torch.sigmoid(z / self.temperature)
            below = (z > 0).to(x.dtype) + soft - soft.detach()
            hs.append(below)
            log_q = log_q + bernoulli_log_prob(alpha, below)
        log_p = self.model.log_joint(x, hs)
        f = log_p - log_q
        metrics = {"train/elbo": f.detach().mean()}
        if diagnostics:
            metrics["train/model_loss"] = -log_p.detach().mean()
        return -f.mean(), metrics
