"""RLOO: REINFORCE with K samples and leave-one-out baselines (Kool, van Hoof & Welling 2019), on the ELBO.

For h_1..h_K ~ q(h | x) and f_k = log p(x, h_k) - log q(h_k | x):

    grad_phi ELBO ~ (1/K) sum_k (f_k - b_k) grad_phi log q(h_k | x),   b_k = (1/(K-1)) sum_{j != k} f_j,
    grad_theta ELBO ~ (1/K) sum_k grad_theta log p(x, h_k).

b_k does not depend on h_k, so each term is unbiased; ``baseline`` is the one place that says so.
"""

from __future__ import annotations

import torch

from nvil.learners.discrete.common import MultiSample, elbo_integrand, repeat


class RLOO(MultiSample):
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
        metrics = {"train/elbo": f.mean()}
        if diagnostics:
            metrics["train/model_loss"] = -log_p.detach().mean()
            metrics["rloo/signal_var"] = signal.var()
        return loss, metrics
