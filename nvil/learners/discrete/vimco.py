"""VIMCO: the K-sample bound with leave-one-out learning signals (Mnih & Rezende 2016, Eqs. 8-10).

With log w_k = log p(x, h_k) - log q(h_k | x), h_k ~ q(h | x), and L = log (1/K) sum_k w_k (the bound, Eq. 2):

    grad L = sum_k L(h_k | h_-k) grad_phi log q(h_k | x) + sum_k w~_k grad log w_k,
    L(h_k | h_-k) = L - log (1/K) (sum_{j != k} w_j + w^_-k),   log w^_-k = (1/(K-1)) sum_{j != k} log w_j,

w~_k = w_k / sum_j w_j. The second sum is the gradient of L itself through log w (the model's gradient, and the
inference network's direct term); the first is the score-function term whose baseline, w_k replaced by the geometric
mean of the others (``leave_one_out``), does not depend on h_k. It estimates the gradient of the K-sample bound,
which is what VIMCO ascends.

For layered Bernoulli models (``nvil.learners.fused.covers``) the gradients are set by hand from the same draws
(``fused_signals``): the model's layers get sum_k w~_k grad_theta log p(x, h_k), q's layers
sum_k (L(h_k | h_-k) - w~_k) grad_phi log q(h_k | x), both with d log Bernoulli(h; a) / da = h - sigmoid(a).
"""

from __future__ import annotations

import torch

from nvil.core.ops import log_mean_exp
from nvil.learners.discrete.common import FusedMultiSample, repeat


class VIMCO(FusedMultiSample):
    NAME = "vimco"

    @staticmethod
    def leave_one_out(log_w: torch.Tensor) -> torch.Tensor:
        """log w^_-k [K, batch]: the mean of the other samples' log weights (Eq. 10)."""
        return (log_w.sum(0, keepdim=True) - log_w) / (log_w.shape[0] - 1)

    def signals(self, log_w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(L [batch], L(h_k | h_-k) [K, batch]) from the detached log weights [K, batch] (Eqs. 2, 9)."""
        k = log_w.shape[0]
        bound = log_mean_exp(log_w, 0)
        # the K x K matrix whose row k is log w with entry k replaced by log w^_-k
        eye = torch.eye(k, dtype=torch.bool, device=log_w.device).unsqueeze(-1)
        replaced = torch.where(eye, self.leave_one_out(log_w).unsqueeze(1), log_w.unsqueeze(0))
        return bound, bound - log_mean_exp(replaced, 1)

    def surrogate(self, x: torch.Tensor, diagnostics: bool = True) -> tuple[torch.Tensor, dict]:
        k = self.k
        hs, log_q_layers = self.inference.sample(repeat(x, k), generator=self.generator)
        log_q = sum(log_q_layers)
        log_p = self.model.log_joint(repeat(x, k), hs)
        log_w = log_p - log_q                                                    # [K, batch]
        bound = log_mean_exp(log_w, 0)                                           # L
        with torch.no_grad():
            lw = log_w.detach()
            signal = self.signals(lw)[1]                                         # L(h_k | h_-k)
        loss = -(bound + (signal * log_q).sum(0)).mean()
        return loss, self.metrics(bound.detach(), lw, log_p.detach(), diagnostics)

    @staticmethod
    def metrics(bound: torch.Tensor, log_w: torch.Tensor, log_p: torch.Tensor, diagnostics: bool) -> dict:
        metrics = {"train/bound": bound.mean(), "train/elbo": log_w.mean()}
        if diagnostics:
            metrics["train/model_loss"] = -log_p.mean()
            metrics["vimco/ess"] = (1.0 / torch.softmax(log_w, 0).pow(2).sum(0)).mean()
        return metrics

    @staticmethod
    def inference_signal(signal: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The coefficient of grad_phi log q(h_k | x) in the ascent direction: L(h_k | h_-k) from the score-function
        term, minus w~_k from the bound's own dependence on phi through log w_k = log p - log q (Eq. 8)."""
        return signal - w

    @torch.no_grad()
    def fused_signals(self, rows: torch.Tensor, uniforms: list[torch.Tensor], diagnostics: bool = False) -> tuple:
        """The hand-derived step up to its weight GEMMs (``FusedPath``): forward over the K N rows, the signals, and
        the gradients of the surrogate's loss -mean_n [L + sum_k L(h_k | h_-k) log q(h_k | x)] as dL/d(output)
        entries. Returns (grads, metrics)."""
        f = self.fused.forward_from(rows, uniforms)
        k, n = self.k, rows.shape[0] // self.k
        log_p = sum(f.log_p).view(k, n)
        log_w = log_p - sum(f.log_q).view(k, n)
        bound, signal = self.signals(log_w)
        w = torch.softmax(log_w, 0)                                                # w~
        a = self.inference_signal(signal, w).reshape(-1)                           # per row, every layer
        grads = self.fused.model_grads(f, rows, w.reshape(-1), 1 / n)
        grads += self.fused.inference_grads(f, [a] * len(f.hs), 1 / n)
        return grads, self.metrics(bound, log_w, log_p, diagnostics)
