"""RLOO: REINFORCE with K samples and leave-one-out baselines (Kool, van Hoof & Welling 2019), on the ELBO.

For h_1..h_K ~ q(h | x) and f_k = log p(x, h_k) - log q(h_k | x):

    grad_phi ELBO ~ (1/K) sum_k (f_k - b_k) grad_phi log q(h_k | x),   b_k = (1/(K-1)) sum_{j != k} f_j,
    grad_theta ELBO ~ (1/K) sum_k grad_theta log p(x, h_k).

b_k does not depend on h_k, so each term is unbiased; ``baseline`` is the one place that says so.

For layered Bernoulli models (``nvil.learners.fused.covers``) the gradients are set by hand from the same draws
(``fused_signals``, ``nvil.learners.fused_path``): the mean over the K N rows of grad_theta log p and of
(f_k - b_k) grad_phi log q, with d log Bernoulli(h; a) / da = h - sigmoid(a).
"""

from __future__ import annotations

import torch

from nvil.learners.discrete.common import FusedMultiSample, elbo_integrand, repeat


class RLOO(FusedMultiSample):
    NAME = "rloo"

    @staticmethod
    def baseline(f: torch.Tensor) -> torch.Tensor:
        """b_k = the mean of the other K - 1 samples' f [K, batch]."""
        return (f.sum(0, keepdim=True) - f) / (f.shape[0] - 1)

    def surrogate(self, x: torch.Tensor, diagnostics: bool = True) -> tuple[torch.Tensor, dict]:
        hs, log_q_layers = self.inference.sample(repeat(x, self.k), generator=self.generator)
        log_q = sum(log_q_layers)
        log_p, f = elbo_integrand(self.model, repeat(x, self.k), hs, log_q.detach())
        signal = f - self.baseline(f)
        loss = -(log_p + signal * log_q).mean()
        return loss, self.metrics(f, log_p.detach(), signal, diagnostics)

    @staticmethod
    def metrics(f: torch.Tensor, log_p: torch.Tensor, signal: torch.Tensor, diagnostics: bool) -> dict:
        metrics = {"train/elbo": f.mean()}
        if diagnostics:
            metrics["train/model_loss"] = -log_p.mean()
            metrics["rloo/signal_var"] = signal.var()
        return metrics

    @torch.no_grad()
    def fused_signals(self, rows: torch.Tensor, uniforms: list[torch.Tensor], diagnostics: bool = False) -> tuple:
        """The hand-derived step up to its weight GEMMs (``FusedPath``): forward over the K N rows, the signals
        f_k - b_k, and the gradients of the surrogate's loss -mean_rows [log p + (f_k - b_k) log q] as dL/d(output)
        entries. Returns (grads, metrics)."""
        f = self.fused.forward_from(rows, uniforms)
        log_p = sum(f.log_p).view(self.k, -1)
        integrand = log_p - sum(f.log_q).view(self.k, -1)
        signal = integrand - self.baseline(integrand)
        grads = self.fused.model_grads(f, rows) + self.fused.inference_grads(f, [signal.reshape(-1)] * len(f.hs))
        return grads, self.metrics(integrand, log_p, signal, diagnostics)
