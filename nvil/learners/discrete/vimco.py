"""VIMCO: the K-sample bound with leave-one-out learning signals (Mnih & Rezende 2016, Eqs. 8-10).

With log w_k = log p(x, h_k) - log q(h_k | x), h_k ~ q(h | x), and L = log (1/K) sum_k w_k (the bound, Eq. 2):

    grad L = sum_k L(h_k | h_-k) grad_phi log q(h_k | x) + sum_k w~_k grad log w_k,
    L(h_k | h_-k) = L - log (1/K) (sum_{j != k} w_j + w^_-k),   log w^_-k = (1/(K-1)) sum_{j != k} log w_j,

w~_k = w_k / sum_j w_j. The second sum is the gradient of L itself through log w (the model's gradient, and the
inference network's direct term); the first is the score-function term whose baseline, w_k replaced by the geometric
mean of the others (``leave_one_out``), does not depend on h_k. It estimates the gradient of the K-sample bound,
which is what VIMCO ascends.
"""

from __future__ import annotations

import torch

from nvil.learners.discrete.common import MultiSample, repeat
from nvil.ops import log_mean_exp


class VIMCO(MultiSample):
    @staticmethod
    def leave_one_out(log_w: torch.Tensor) -> torch.Tensor:
        """log w^_-k [K, batch]: the mean of the other samples' log weights (Eq. 10)."""
        return (log_w.sum(0, keepdim=True) - log_w) / (log_w.shape[0] - 1)

    def surrogate(self, x: torch.Tensor, diagnostics: bool = True) -> tuple[torch.Tensor, dict]:
        k = self.k
        hs, log_q_layers = self.inference.sample(repeat(x, k), generator=self.generator)
        log_q = sum(log_q_layers)
        log_p = self.model.log_joint(repeat(x, k), hs)
        log_w = log_p - log_q                                                    # [K, batch]
        bound = log_mean_exp(log_w, 0)                                           # L
        with torch.no_grad():
            lw = log_w.detach()
            # the K x K matrix whose row k is log w with entry k replaced by log w^_-k
            eye = torch.eye(k, dtype=torch.bool, device=lw.device).unsqueeze(-1)
            replaced = torch.where(eye, self.leave_one_out(lw).unsqueeze(1), lw.unsqueeze(0))
            signal = bound.detach() - log_mean_exp(replaced, 1)                      # L(h_k | h_-k)
        loss = -(bound + (signal * log_q).sum(0)).mean()
        metrics = {"train/bound": bound.detach().mean(), "train/elbo": lw.mean()}
        if diagnostics:
            metrics["train/model_loss"] = -log_p.detach().mean()
            w = torch.softmax(lw, 0)
            metrics["vimco/ess"] = (1.0 / w.pow(2).sum(0)).mean()
        return loss, metrics
