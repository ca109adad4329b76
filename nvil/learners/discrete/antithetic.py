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
    """ARM, the augment-REINFORCE-merge estimator for Bernoulli latents (Yin & Zhou 2019).

    Layer i's logit gradient is g_alpha = (f(b~) - f(b)) (u - 1/2) from the antithetic pair b = 1[u < sigmoid(alpha)],
    b~ = 1[1 - u < sigmoid(alpha)] (Thm. 1), the layers above redrawn from the same uniforms (n + 1 evaluations of f
    per example for n layers, ``evaluations_per_example``). For layered Bernoulli models the gradients are set by hand
    (``fused_signals``). The keywords are ``DiscreteLearner``'s (defaults: configs/learner/arm.yaml, disarm.yaml).

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
        Seed of the learner's generator, which draws the uniforms u.
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

    Raises
    ------
    ConfigError
        If the inference network's layers are not factorial Bernoulli (``model.inference.autoregressive=true``), or
        an optimiser setting is invalid.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import SBN, LayeredInference
    >>> from nvil.learners import ARM
    >>> learner = ARM(SBN(6, [4, 3]), LayeredInference(6, [4, 3]))
    >>> learner.evaluations_per_example
    3
    >>> x = torch.bernoulli(torch.full((8, 6), 0.5))
    >>> sorted(learner.step(x, diagnostics=True))
    ['arm/flipped', 'grad_norm/inference', 'grad_norm/model', 'train/elbo', 'train/model_loss']
    """

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
        """ARM's per-unit logit gradient g_alpha = (f(b~) - f(b)) (u - 1/2) (Yin & Zhou, Thm. 1).

        Parameters
        ----------
        f : torch.Tensor
            f = log p(x, h) - log q(h | x) on the main path, ``[batch]``.
        f_anti : torch.Tensor
            f on the path with this layer flipped to its antithetic draw, ``[batch]``.
        u : torch.Tensor
            The layer's uniforms, ``[batch, units]``.
        b : torch.Tensor
            The layer's units on the main path, ``[batch, units]`` (read by DisARM).
        b_anti : torch.Tensor
            The antithetic units b~, ``[batch, units]`` (read by DisARM).
        prob : torch.Tensor
            sigmoid(alpha), ``[batch, units]`` (read by DisARM).

        Returns
        -------
        torch.Tensor
            g_alpha, ``[batch, units]``.
        """
        return (f_anti - f).unsqueeze(-1) * (u - 0.5)

    def antithetic(self, u: torch.Tensor) -> torch.Tensor:
        """The uniforms of the antithetic draw: 1 - u.

        Parameters
        ----------
        u : torch.Tensor
            The uniforms of the main draw.

        Returns
        -------
        torch.Tensor
            ``1 - u``, shaped like ``u``.
        """
        return 1.0 - u

    def surrogate(self, x: torch.Tensor, diagnostics: bool = True) -> tuple[torch.Tensor, dict]:
        """The autograd path's loss, -mean log p(x, h) - sum_i mean(g_alpha_i . alpha_i), and the metrics.

        The n + 1 paths (the main one, and path i + 1 with layer i flipped to b~_i and the layers above redrawn from the
        same uniforms) are evaluated in one stacked pass; the model's gradient averages grad_theta log p over all
        of them, layer i's logits alpha_i carry g_alpha_i into phi.

        Parameters
        ----------
        x : torch.Tensor
            The minibatch ``[batch, n_visible]``.
        diagnostics : bool, default True
            Also report ``train/model_loss`` and ``arm/flipped``.

        Returns
        -------
        loss : torch.Tensor
            The 0-d surrogate loss, whose gradient is minus the estimate.
        metrics : dict
            As ``metrics`` reports them.
        """
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
        """What a step reports: the ELBO on the main path and, on a logging step, the model loss and the flip rate.

        Parameters
        ----------
        f : torch.Tensor
            f on every path, ``[n + 1, batch]`` (row 0: the main path).
        log_p : torch.Tensor
            log p(x, h) on every path, ``[n + 1, batch]``.
        pairs : list of tuple
            (b~_i, b_i) of each layer.
        diagnostics : bool
            Include ``train/model_loss`` and ``arm/flipped``.

        Returns
        -------
        dict of str to torch.Tensor
            ``train/elbo`` (mean f on the main path) and, with ``diagnostics``, ``train/model_loss`` (-mean log p over
            the paths) and ``arm/flipped`` (the fraction of units whose antithetic draw differs, averaged over layers).
        """
        metrics = {"train/elbo": f[0].mean()}
        if diagnostics:
            metrics["train/model_loss"] = -log_p.mean()
            metrics["arm/flipped"] = torch.stack([(anti != b).float().mean() for anti, b in pairs]).mean()
        return metrics

    @torch.no_grad()
    def fused_signals(self, x: torch.Tensor, uniforms: list[torch.Tensor], diagnostics: bool = False) -> tuple:
        """The hand-derived step up to its weight GEMMs (``FusedPath``): the n + 1 paths as one forward pass.

        The n + 1 paths as one forward pass over (n + 1) N rows (path i + 1: layer i's uniforms 1 - u_i), f on each,
        every layer's g_alpha on the main path.

        Parameters
        ----------
        x : torch.Tensor
            The minibatch ``[N, n_visible]``.
        uniforms : list of torch.Tensor
            The main path's uniforms, one ``[N, units]`` tensor per layer.
        diagnostics : bool, default False
            Also report ``train/model_loss`` and ``arm/flipped``.

        Returns
        -------
        grads : list of tuple
            The dL/d(output) entries of the model's layers and of q's layers (dL/d alpha_i = -g_alpha_i / N).
        metrics : dict
            As ``metrics`` reports them.
        """
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
    """DisARM, ARM with the uniform integrated out given (b, b~) (Dong, Mnih & Tucker 2020): never worse than ARM.

    Layer i's logit gradient is g_alpha = 1/2 (f(b) - f(b~)) (-1)^{b~} 1[b != b~] sigmoid(|alpha|) (Eq. 6); the
    paths, the multi-layer scheme and the hand-derived path are ARM's. Defaults: configs/learner/disarm.yaml.

    Parameters
    ----------
    model : nn.Module
        The directed model p(x, h) with parameters theta (an ``nvil.models.SBN``).
    inference : nn.Module
        The inference network q(h | x) with parameters phi: factorial Bernoulli layers.
    device : torch.device or str, default "cpu"
        Where the learner and its generator live.
    seed : int, default 0
        Seed of the learner's generator, which draws the uniforms u.
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

    Raises
    ------
    ConfigError
        If the inference network's layers are not factorial Bernoulli, or an optimiser setting is invalid.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import SBN, LayeredInference
    >>> from nvil.learners import DisARM
    >>> learner = DisARM(SBN(6, [4, 3]), LayeredInference(6, [4, 3]))
    >>> x = torch.bernoulli(torch.full((8, 6), 0.5))
    >>> sorted(learner.step(x))
    ['train/elbo']
    >>> f, f_anti = torch.tensor([1.0]), torch.tensor([3.0])
    >>> b, b_anti, prob = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 0.0]]), torch.tensor([[0.25, 0.5]])
    >>> learner.logit_gradient(f, f_anti, None, b, b_anti, prob)
    tensor([[-0.7500, -0.0000]])
    """

    NAME = "disarm"

    def logit_gradient(self, f, f_anti, u, b, b_anti, prob) -> torch.Tensor:
        """DisARM's g_alpha = 1/2 (f(b) - f(b~)) (-1)^{b~} 1[b != b~] sigmoid(|alpha|).

        sigmoid(|alpha|) is computed as max(p, 1 - p).

        Parameters
        ----------
        f : torch.Tensor
            f on the main path, ``[batch]``.
        f_anti : torch.Tensor
            f on the antithetic path, ``[batch]``.
        u : torch.Tensor
            The layer's uniforms (unused: DisARM integrates them out).
        b : torch.Tensor
            The layer's units on the main path, ``[batch, units]``.
        b_anti : torch.Tensor
            The antithetic units b~, ``[batch, units]``.
        prob : torch.Tensor
            p = sigmoid(alpha), ``[batch, units]``.

        Returns
        -------
        torch.Tensor
            g_alpha, ``[batch, units]`` (zero where b = b~).
        """
        sign = 1.0 - 2.0 * b_anti
        return 0.5 * (f - f_anti).unsqueeze(-1) * sign * (b != b_anti).to(f.dtype) * torch.maximum(prob, 1 - prob)
