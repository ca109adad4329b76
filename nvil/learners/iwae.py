"""``learner=iwae``: the importance-weighted bound of Burda, Grosse & Salakhutdinov 2016 (Eq. 8), trained with the
reparameterised gradient (Eq. 14), on a model that draws z ~ q(z | x) by reparameterisation (``model.proposal(x)``
with ``rsample``; the VAE family, ``nvil.models.vae``):

    L_k(x) = E[ log (1/k) sum_i w_i ],   w_i = p(x, z_i) / q(z_i | x),   z_1..z_k ~ q(z | x)

With ``objective="elbo"`` the loss is the mean of the k log w_i instead, the VAE's bound estimated with k samples
(Kingma & Welling 2014, Eq. 7); for k = 1 the two are the same. The learning rate follows Burda et al.'s schedule
when ``stage_steps`` is set: stage i lasts ``stage_steps * 3^i`` updates at ``lr * 10^(-i/7)`` (``stage_steps``
is one pass over the training set in the paper, i = 0..7). Adam with the paper's eps = 1e-4.
"""

from __future__ import annotations

import torch
from torch import nn

from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.core.ops import log_mean_exp
from nvil.learners.base import SurrogateLearner

OBJECTIVES = ("iwae", "elbo")


def stage_lr(lr: float, stage_steps: int | None, updates: int) -> float:
    """Burda et al.'s learning rate after ``updates`` updates: ``lr * 10^(-i/7)`` in stage i, which ends after
    ``stage_steps * (3^(i+1) - 1) / 2`` updates in all."""
    if stage_steps is None:
        return lr
    i = 0
    while updates >= stage_steps * (3 ** (i + 1) - 1) // 2:
        i += 1
    return lr * 10 ** (-i / 7)


class ImportanceWeighted(SurrogateLearner):
    """``learner=iwae``: maximise L_k (``objective=iwae``) or the k-sample ELBO (``objective=elbo``) by Adam."""

    def __init__(self, model: nn.Module, inference: nn.Module | None = None, *, device: torch.device | str = "cpu",
                 seed: int = 0, k: int = 1, objective: str = "iwae",
                 lr: float = 0.001, beta2: float = 0.999, eps: float = 1e-4, stage_steps: int | None = None) -> None:
        """Defaults: configs/learner/iwae.yaml. ``k``: samples of q per example; ``objective``: iwae | elbo;
        ``lr``, ``beta2``, ``eps``: Adam's; ``stage_steps``: Burda et al.'s schedule (None: ``lr`` throughout)."""
        super().__init__()
        if not callable(getattr(model, "proposal", None)) or not hasattr(model, "latent"):
            raise ConfigError(f"learner=iwae trains a model with a reparameterised q(z | x) (model=vae), not a "
                              f"{type(model).__name__}")
        if objective not in OBJECTIVES:
            raise ConfigError(f"learner.objective must be one of {list(OBJECTIVES)}, got {objective!r}")
        self.model, self.inference, self.objective = model, None, objective
        self.k = positive_int(k, "learner.k")
        self.lr = positive_float(lr, "learner.lr")
        self.stage_steps = positive_int(stage_steps, "learner.stage_steps", allow_none=True)
        if not 0.0 <= float(beta2) < 1.0:
            raise ConfigError(f"learner.beta2 must be in [0, 1), got {beta2}")
        self.optimizer = torch.optim.Adam([{"params": list(model.parameters()), "name": "model"}], lr=self.lr,
                                          betas=(0.9, float(beta2)), eps=positive_float(eps, "learner.eps"),
                                          fused=True)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.updates = 0

    def log_weights(self, x: torch.Tensor) -> torch.Tensor:
        """log w_i = log p(x, z_i) - log q(z_i | x) for k reparameterised draws per row: [k, N]."""
        q = self.model.proposal(x)
        z = q.rsample_with((self.k,), self.generator)
        log_q = q.log_prob(z)
        log_p = self.model.log_joint(x.unsqueeze(0).expand(self.k, *x.shape).reshape(-1, x.shape[-1]),
                                     z.reshape(-1, z.shape[-1])).view(self.k, -1)
        return log_p - log_q

    def surrogate(self, x: torch.Tensor, diagnostics: bool = True) -> tuple[torch.Tensor, dict]:
        log_w = self.log_weights(x)
        iwae = log_mean_exp(log_w, 0)
        elbo = log_w.mean(0)
        bound = iwae if self.objective == "iwae" else elbo
        metrics = {"train/iwae": iwae.mean().detach(), "train/elbo": elbo.mean().detach()}
        if diagnostics:
            w = torch.softmax(log_w.detach(), 0)
            metrics["train/ess"] = (1.0 / w.square().sum(0)).mean()
        return -bound.mean(), metrics

    def step(self, x: torch.Tensor, diagnostics: bool = False) -> dict[str, torch.Tensor]:
        lr = stage_lr(self.lr, self.stage_steps, self.updates)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        metrics = super().step(x, diagnostics)
        self.updates += 1
        if diagnostics:
            metrics["train/lr"] = torch.tensor(lr)
        return metrics

    def learner_state(self) -> dict:
        return {**super().learner_state(), "updates": self.updates}

    def load_learner_state(self, state: dict) -> None:
        super().load_learner_state(state)
        self.updates = int(state["updates"])

