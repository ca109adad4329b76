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

For layered Bernoulli models (``nvil.learners.fused.covers``) the gradients are set by hand (``fused_signals``,
``nvil.learners.fused_path``): path i + 1 is the forward pass with layer i's uniforms replaced by 1 - u_i (the
layers below it draw the main path's units again, the layers above are redrawn from the same uniforms), so the
n + 1 paths are one forward pass over (n + 1) N rows; the model's gradient is the mean over them of
grad_theta log p, q's layer i gets dL/d alpha_i = -g_alpha / N on the main path.
"""

from __future__ import annotations

import torch
from torch import nn

from nvil.backend.native.bernoulli_log_prob import bernoulli_log_prob
from nvil.learners.discrete.common import DiscreteLearner, bernoulli_path, elbo_integrand, repeat
from nvil.learners.fused import fused_gradients
from nvil.learners.fused_path import FusedPath


class ARM(FusedPath, DiscreteLearner):
    """ARM; the keywords are ``DiscreteLearner``'s (defaults: configs/learner/arm.yaml, disarm.yaml)."""

    needs_bernoulli_q = True
    NAME = "arm"

    def __init__(self, model: nn.Module, inference: nn.Module, *, device: torch.device | str = "cpu", seed: int = 0,
                 optimizer: str = "adam", lr: float = 0.001, momentum: float = 0.0, beta2: float = 0.999,
                 inference_lr_scale: float = 0.2) -> None:
        super().__init__(model, inference, device=device, seed=seed, optimizer=optimizer, lr=lr, momentum=momentum,
                         beta2=beta2, inference_lr_scale=inference_lr_scale)
        self.evaluations_per_example = len(inference.encoders) + 1
        self.fused = fused_gradients(model, inference)

    def logit_gradient(self, f: torch.Tensor, f_anti: torch.Tensor, u: torch.Tensor, b: torch.Tensor,
                       b_anti: torch.Tensor, prob: torch.Tensor) -> torch.Tensor:
        """ARM's g_alpha [batch, units] from f on the main path and on the antithetic one [batch] (prob: sigmoid(alpha),
        which DisARM reads)."""
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
            g = self.logit_gradient(f[0], f[i + 1], us[i], main[i], paths[i + 1][i], torch.sigmoid(alphas[i].detach()))
            loss = loss - (g * alphas[i]).sum(-1).mean()
        return loss, self.metrics(f, log_p.detach(), [(paths[i + 1][i], main[i]) for i in range(n)], diagnostics)

    @staticmethod
    def metrics(f: torch.Tensor, log_p: torch.Tensor, pairs: list[tuple], diagnostics: bool) -> dict:
        """``pairs``: (b~_i, b_i) of each layer."""
        metrics = {"train/elbo": f[0].mean()}
        if diagnostics:
            metrics["train/model_loss"] = -log_p.mean()
            metrics["arm/flipped"] = torch.stack([(anti != b).float().mean() for anti, b in pairs]).mean()
        return metrics

    @torch.no_grad()
    def fused_signals(self, x: torch.Tensor, uniforms: list[torch.Tensor], diagnostics: bool = False) -> tuple:
        """The hand-derived step up to its weight GEMMs (``FusedPath``): the n + 1 paths as one forward pass over
        (n + 1) N rows (path i + 1: layer i's uniforms 1 - u_i), f on each, every layer's g_alpha on the main path.
        Returns (grads, metrics)."""
        n_layers, n = len(uniforms), x.shape[0]
        stacked = [torch.cat([u] + [self.antithetic(u) if i == j else u for i in range(n_layers)])
                   for j, u in enumerate(uniforms)]
        rows = x.repeat(n_layers + 1, 1)
        fw = self.fused.forward_from(rows, stacked)
        log_p = sum(fw.log_p).view(n_layers + 1, n)
        f = log_p - sum(fw.log_q).view(n_layers + 1, n)
        grads, pairs = self.fused.model_grads(fw, rows), []
        for i, (enc, u) in enumerate(zip(self.inference.encoders, uniforms)):
            h = fw.hs[i].view(n_layers + 1, n, -1)
            d_a = self.logit_gradient(f[0], f[i + 1], u, h[0], h[i + 1], fw.q_probs[i][:n]).neg_()
            grads.append((enc, d_a, fw.inputs[i][:n], 1 / n, d_a.mean(0)))
            pairs.append((h[i + 1], h[0]))
        return grads, self.metrics(f, log_p, pairs, diagnostics)


class DisARM(ARM):
    NAME = "disarm"

    def logit_gradient(self, f, f_anti, u, b, b_anti, prob) -> torch.Tensor:
        """DisARM's g_alpha: 1/2 (f(b) - f(b~)) (-1)^{b~} 1[b != b~] sigmoid(|alpha|), with sigmoid(|alpha|) =
        max(p, 1 - p)."""
        sign = 1.0 - 2.0 * b_anti
        return 0.5 * (f - f_anti).unsqueeze(-1) * sign * (b != b_anti).to(f.dtype) * torch.maximum(prob, 1 - prob)
