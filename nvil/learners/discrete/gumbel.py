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
    """Straight-through Gumbel-softmax for Bernoulli latents (Jang, Gu & Poole 2017; Maddison, Mnih & Teh 2017).

    The keywords are ``DiscreteLearner``'s and ``temperature``, tau of sigmoid(z / tau) (defaults:
    configs/learner/gumbel_st.yaml). The forward value is a true sample from q; the gradient is not the ELBO's, so
    the estimator is biased.

    Parameters
    ----------
    model : nn.Module
        The directed model p(x, h) with parameters theta (an ``nvil.models.SBN``).
    inference : nn.Module
        The inference network q(h | x) with parameters phi: factorial Bernoulli layers
        (``nvil.models.LayeredInference`` with ``autoregressive=False``).
    device : torch.device or str, default "cpu"
        Where the learner and its generator live.
    seed : int, default 0
        Seed of the learner's generator, which draws the logistic noise.
    optimizer : str, default "adam"
        ``adam`` or ``sgd``.
    lr : float, default 0.001
        The model's learning rate.
    momentum : float, default 0.0
        SGD's momentum.
    beta2 : float, default 0.999
        Adam's second-moment decay.
    inference_lr_scale : float, default 0.2
        q's rate relative to ``lr``.
    temperature : float, default 1.0
        tau, the temperature of the relaxed sample s = sigmoid(z / tau) whose gradient flows backward.

    Raises
    ------
    ConfigError
        If ``temperature`` is not positive, the inference network's layers are not factorial Bernoulli, or an
        optimiser setting is invalid.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import SBN, LayeredInference
    >>> from nvil.learners import GumbelST
    >>> learner = GumbelST(SBN(6, [4, 3]), LayeredInference(6, [4, 3]), temperature=0.5)
    >>> x = torch.bernoulli(torch.full((8, 6), 0.5))
    >>> sorted(learner.step(x, diagnostics=True))
    ['grad_norm/inference', 'grad_norm/model', 'train/elbo', 'train/model_loss']
    """

    needs_bernoulli_q = True
    NAME = "gumbel_st"

    def __init__(self, model: nn.Module, inference: nn.Module, *, device: torch.device | str = "cpu", seed: int = 0,
                 optimizer: str = "adam", lr: float = 0.001, momentum: float = 0.0, beta2: float = 0.999,
                 inference_lr_scale: float = 0.2, temperature: float = 1.0) -> None:
        super().__init__(model, inference, device=device, seed=seed, optimizer=optimizer, lr=lr, momentum=momentum,
                         beta2=beta2, inference_lr_scale=inference_lr_scale)
        self.temperature = positive_float(temperature, "learner.temperature")

    def surrogate(self, x: torch.Tensor, diagnostics: bool = True) -> tuple[torch.Tensor, dict]:
        """The loss -mean f(h), f = log p(x, h) - log q(h | x), at straight-through samples h.

        Each layer draws z = alpha + log u - log(1 - u) from its logits (given the layer below's h), takes b = 1[z > 0]
        forward and s = sigmoid(z / tau)'s gradient backward, h = b + s - stop_gradient(s), so the gradient flows
        through the whole stack.

        Parameters
        ----------
        x : torch.Tensor
            The minibatch ``[batch, n_visible]``.
        diagnostics : bool, default True
            Also report ``train/model_loss``.

        Returns
        -------
        loss : torch.Tensor
            0-d: -mean f.
        metrics : dict
            ``train/elbo`` (mean f) and, with ``diagnostics``, ``train/model_loss`` (-mean log p(x, h)).
        """
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
