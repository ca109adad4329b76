"""A plain eager-PyTorch NVIL for a one-layer SBN, as a researcher would write it: the third side of
``bench/peer_pyro.py`` (not a script).

Mnih & Gregor 2014: h ~ q(h | x), the learning signal l = log p(x, h) - log q(h | x), an input-dependent baseline
b(x) (an MLP with 100 tanh units), a constant baseline c and variance normalisation by v (running averages of
the mean and variance of l - b(x), smoothing 0.8, the first minibatch setting them, as Algorithm 1 updates them);
the surrogate loss

    -mean(log p(x, h)) - mean(a * log q(h | x)) + 0.5 mean((l - c - b(x))^2) / max(1, sqrt v),
    a = (l - b(x) - c) / max(1, sqrt v) (detached),

differentiated by autograd and stepped by one ``torch.optim`` optimiser with three parameter groups (model,
inference network, baseline). Log-probabilities are ``torch.distributions.Bernoulli(logits=...).log_prob`` (how log p
- log q is usually written; its argument checks on, the default), or with ``log_prob="bce"``
``binary_cross_entropy_with_logits``, the faster form an engineer tuning the script would switch to; h is drawn with
``torch.bernoulli``, which with the same seed draws the same h as our ``LayeredInference.sample`` (u < sigmoid(a)), so
the script and our learner take the same updates to float rounding. Nothing here is tuned beyond the idioms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Bernoulli


def distributions_log_prob(logits: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return Bernoulli(logits=logits).log_prob(value).sum(-1)


def bce_log_prob(logits: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return -F.binary_cross_entropy_with_logits(logits, value, reduction="none").sum(-1)


LOG_PROBS = {"distributions": distributions_log_prob, "bce": bce_log_prob}


class Generative(nn.Module):
    """p(h) p(x | h): factorial Bernoulli prior and a sigmoid belief layer."""

    def __init__(self, n_visible: int, n_hidden: int, log_prob: str = "distributions") -> None:
        super().__init__()
        self.prior = nn.Parameter(torch.zeros(n_hidden))
        self.decoder = nn.Linear(n_hidden, n_visible)
        self.bernoulli_log_prob = LOG_PROBS[log_prob]

    def log_prob(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return self.bernoulli_log_prob(self.prior.expand_as(h), h) + self.bernoulli_log_prob(self.decoder(h), x)


class Recognition(nn.Module):
    """q(h | x): a sigmoid layer on the centred input."""

    def __init__(self, n_visible: int, n_hidden: int, log_prob: str = "distributions") -> None:
        super().__init__()
        self.encoder = nn.Linear(n_visible, n_hidden)
        self.register_buffer("mean", torch.zeros(n_visible))
        self.bernoulli_log_prob = LOG_PROBS[log_prob]

    def forward(self, x: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.encoder(x - self.mean)
        h = torch.bernoulli(torch.sigmoid(logits).detach(), generator=generator)
        return h, self.bernoulli_log_prob(logits, h)


class PlainNVIL:
    """``step(x)``: one NVIL update. ``optimizer``: "sgd" or "adam"; rates per group as in ``learner=nvil``."""

    def __init__(self, p: Generative, q: Recognition, baseline: nn.Module, lr: float, inference_scale: float,
                 baseline_scale: float, optimizer: str = "sgd", smoothing: float = 0.8, seed: int = 0) -> None:
        self.p, self.q, self.baseline, self.alpha = p, q, baseline, smoothing
        groups = [{"params": p.parameters(), "lr": lr}, {"params": q.parameters(), "lr": lr * inference_scale},
                  {"params": baseline.parameters(), "lr": lr * baseline_scale}]
        self.optimizer = torch.optim.SGD(groups, lr=lr) if optimizer == "sgd" else torch.optim.Adam(groups, lr=lr)
        self.generator = torch.Generator(next(p.parameters()).device).manual_seed(seed)
        self.c, self.v = None, None

    def step(self, x: torch.Tensor) -> torch.Tensor:
        h, log_q = self.q(x, self.generator)
        log_p = self.p.log_prob(x, h)
        b = self.baseline(x - self.q.mean).squeeze(-1)
        l = (log_p - log_q).detach()
        centred = l - b.detach()
        with torch.no_grad():
            mean, var = centred.mean(), centred.var(unbiased=False)
            if self.c is None:
                self.c, self.v = mean, var
            else:
                self.c = self.alpha * self.c + (1 - self.alpha) * mean
                self.v = self.alpha * self.v + (1 - self.alpha) * var
            scale = self.v.sqrt().clamp(min=1.0)
            a = (centred - self.c) / scale
        loss = -log_p.mean() - (a * log_q).mean() + 0.5 * ((l - self.c - b) ** 2).mean() / scale
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return l.mean()
