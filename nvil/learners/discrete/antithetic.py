"""ARM (Yin & Zhou 2019) and DisARM (Dong, Mnih & Tucker 2020): antithetic estimators for Bernoulli latents.

For one layer of Bernoulli units with logits alpha and f(b), one uniform vector u gives the antithetic pair
b = 1[u < sigmoid(alpha)] and b~ = 1[1 - u < sigmoid(alpha)], each distributed as q, and

    ARM    (Yin & Zhou, Thm. 1):      g_alpha = (f(b~) - f(b)) (u - 1/2)
    DisARM (Dong et al., Eq. 6):      g_alpha = 1/2 (f(b) - f(b~)) (-1)^{b~} 1[b != b~] sigmoid(|alpha|)

DisARM is ARM with u integrated out given (b, b~), so it is never worse. Both are per-unit gradients in the logits,
carried into phi by ``alpha``'s graph.

Multi-layer q (ARM's Sec. 3.2, DisARM's Sec. 4): layer i's estimator conditions on the layers below, so with
h = (b_1, ..., b_n) drawn from uniforms u_1..u_n, layer i compares f on h with f on the path that flips layer i
to its antithetic b~_i and redraws the layers above from the same uniforms (common random numbers, so the two
continuations differ only through b~_i). That is n + 1 evaluations of f per example; every path is marginally a
draw from q, and the model's gradient averages grad_theta log p over all n + 1.
"""

from __future__ import annotations

import torch

from nvil.learners.discrete.common import DiscreteLearner, bernoulli_path, elbo_integrand, repeat
from nvil.ops import bernoulli_log_prob


class ARM(DiscreteLearner):
    needs_bernoulli_q = True

    def __init__(self, model, inference, cfg, device, seed) -> None:
        super().__init__(model, inference, cfg, device, seed)
        self.evaluations_per_example = len(inference.encoders) + 1

    def logit_gradient(self, f: torch.Tensor, f_anti: torch.Tensor, u: torch.Tensor, b: torch.Tensor,
                       b_anti: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """ARM's g_alpha [batch, units] from f on the main path and on the antithetic one [batch]."""
        return (f_anti - f).unsqueeze(-1) * (u - 0.5)

    def antithetic(self, u: torch.Tensor) -> torch.Tensor:
        """The uniforms of the antithetic draw: 1 - u."""
        return 1.0 - u

    def surrogate(self, x: torch.Tensor, diagnostics: bool = True) -> tuple[torch.Tensor, dict]:
        inf = self.inference
        us = [self.rand((x.shape[0], enc.out_features), x) for enc in inf.encoders]
        n = len(us)
        alphas, main, below = [], [], x            # the main path h = (b_1, ..., b_n), logits with phi's graph
        for i, u in enumerate(us):
            alphas.append(inf.layer_logits(i, below))
            below = (u < torch.sigmoid(alphas[-1].detach())).to(x.dtype)
            main.append(below)
        paths = [main]                              # path i + 1: layer i flipped to b~_i, the layers above redrawn
        for i in range(n):
            b_anti = (self.antithetic(us[i]) < torch.sigmoid(alphas[i].detach())).to(x.dtype)
            paths.append(bernoulli_path(inf, x, us, fixed={**dict(enumerate(main[:i])), i: b_anti})[0]
                         if i + 1 < n else [*main[:i], b_anti])
        hs = [torch.stack([p[j] for p in paths]) for j in range(n)]                  # [n + 1, batch, units]
        xs = repeat(x, n + 1)
        with torch.no_grad():                       # log q of every path: layer 1's logits are shared by all
            log_q = bernoulli_log_prob(alphas[0].detach(), hs[0]) + sum(
                bernoulli_log_prob(inf.layer_logits(j, hs[j - 1]), hs[j]) for j in range(1, n))
        log_p, f = elbo_integrand(self.model, xs, hs, log_q)                       # [n + 1, batch]
        loss = -log_p.mean()
        for i in range(n):
            g = self.logit_gradient(f[0], f[i + 1], us[i], main[i], paths[i + 1][i], alphas[i].detach())
            loss = loss - (g * alphas[i]).sum(-1).mean()
        metrics = {"train/elbo": f[0].mean()}
        if diagnostics:
            metrics["train/model_loss"] = -log_p.detach().mean()
            metrics["arm/flipped"] = torch.stack([(paths[i + 1][i] != main[i]).float().mean() for i in range(n)]).mean()
        return loss, metrics


class DisARM(ARM):
    def logit_gradient(self, f, f_anti, u, b, b_anti, alpha) -> torch.Tensor:
        """DisARM's g_alpha: 1/2 (f(b) - f(b~)) (-1)^{b~} 1[b != b~] sigmoid(|alpha|)."""
        sign = 1.0 - 2.0 * b_anti
        return 0.5 * (f - f_anti).unsqueeze(-1) * sign * (b != b_anti).to(f.dtype) * torch.sigmoid(alpha.abs())
