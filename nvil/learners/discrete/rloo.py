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
    """RLOO: REINFORCE with K samples and leave-one-out baselines on the ELBO (Kool, van Hoof & Welling 2019).

    Each update draws K = ``num_samples`` samples h_k ~ q(h | x) per example; the inference network's estimate is
    (1/K) sum_k (f_k - b_k) grad_phi log q(h_k | x) with b_k the mean of the other samples' f (``baseline``), the
    model's (1/K) sum_k grad_theta log p(x, h_k). For layered Bernoulli models the gradients are set by hand from the
    same draws (``fused_signals``). Defaults: configs/learner/rloo.yaml.

    Parameters
    ----------
    model : nn.Module
        The directed model p(x, h) with parameters theta (an ``nvil.models.SBN`` or an fDARN).
    inference : nn.Module
        The inference network q(h | x) with parameters phi (``nvil.models.LayeredInference``).
    device : torch.device or str, default "cpu"
        Where the learner and its generator live.
    seed : int, default 0
        Seed of the learner's generator, which draws every h_k.
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
    num_samples : int, default 5
        K, the samples per example (at least 2: a leave-one-out baseline needs another sample).

    Raises
    ------
    ConfigError
        If ``num_samples`` is below 2 (or not a positive integer), or an optimiser setting is invalid.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import SBN, LayeredInference
    >>> from nvil.learners import RLOO
    >>> learner = RLOO(SBN(6, [4, 3]), LayeredInference(6, [4, 3]), num_samples=3)
    >>> x = torch.bernoulli(torch.full((8, 6), 0.5))
    >>> sorted(learner.step(x, diagnostics=True))
    ['grad_norm/inference', 'grad_norm/model', 'rloo/signal_var', 'train/elbo', 'train/model_loss']
    >>> RLOO.baseline(torch.tensor([[1.0], [2.0], [6.0]])).squeeze(-1)
    tensor([4.0000, 3.5000, 1.5000])
    """

    NAME = "rloo"

    @staticmethod
    def baseline(f: torch.Tensor) -> torch.Tensor:
        """b_k, the mean of the other K - 1 samples' f: it does not depend on h_k, so each term stays unbiased.

        Parameters
        ----------
        f : torch.Tensor
            f_k = log p(x, h_k) - log q(h_k | x), ``[K, batch]``.

        Returns
        -------
        torch.Tensor
            ``[K, batch]``: b_k = (1 / (K - 1)) sum_{j != k} f_j.
        """
        return (f.sum(0, keepdim=True) - f) / (f.shape[0] - 1)

    def surrogate(self, x: torch.Tensor, diagnostics: bool = True) -> tuple[torch.Tensor, dict]:
        """The autograd path's loss, -mean [log p(x, h_k) + (f_k - b_k) log q(h_k | x)], and the metrics.

        Its gradient is minus RLOO's estimate (f_k - b_k held fixed).

        Parameters
        ----------
        x : torch.Tensor
            The minibatch ``[batch, n_visible]``.
        diagnostics : bool, default True
            Also report ``train/model_loss`` and ``rloo/signal_var``.

        Returns
        -------
        loss : torch.Tensor
            The 0-d surrogate loss.
        metrics : dict
            As ``metrics`` reports them.
        """
        hs, log_q_layers = self.inference.sample(repeat(x, self.k), generator=self.generator)
        log_q = sum(log_q_layers)
        log_p, f = elbo_integrand(self.model, repeat(x, self.k), hs, log_q.detach())
        signal = f - self.baseline(f)
        loss = -(log_p + signal * log_q).mean()
        return loss, self.metrics(f, log_p.detach(), signal, diagnostics)

    @staticmethod
    def metrics(f: torch.Tensor, log_p: torch.Tensor, signal: torch.Tensor, diagnostics: bool) -> dict:
        """What a step reports: the ELBO and, on a logging step, the model loss and the signal's variance.

        Parameters
        ----------
        f : torch.Tensor
            f_k, ``[K, batch]``.
        log_p : torch.Tensor
            log p(x, h_k), ``[K, batch]``.
        signal : torch.Tensor
            f_k - b_k, ``[K, batch]``.
        diagnostics : bool
            Include ``train/model_loss`` and ``rloo/signal_var``.

        Returns
        -------
        dict of str to torch.Tensor
            ``train/elbo`` (mean f) and, with ``diagnostics``, ``train/model_loss`` (-mean log p) and
            ``rloo/signal_var`` (the variance of f_k - b_k).
        """
        metrics = {"train/elbo": f.mean()}
        if diagnostics:
            metrics["train/model_loss"] = -log_p.mean()
            metrics["rloo/signal_var"] = signal.var()
        return metrics

    @torch.no_grad()
    def fused_signals(self, rows: torch.Tensor, uniforms: list[torch.Tensor], diagnostics: bool = False) -> tuple:
        """The hand-derived step up to its weight GEMMs (``FusedPath``) over the K N rows.

        Forward over the K N rows, the signals f_k - b_k, and the gradients of the surrogate's loss
        -mean_rows [log p + (f_k - b_k) log q] as dL/d(output) entries.

        Parameters
        ----------
        rows : torch.Tensor
            The minibatch repeated K times, ``[K N, n_visible]`` (sample k of example n in row k N + n).
        uniforms : list of torch.Tensor
            The uniforms of q's draws for the rows, one tensor per layer.
        diagnostics : bool, default False
            Also report ``train/model_loss`` and ``rloo/signal_var``.

        Returns
        -------
        grads : list of tuple
            The dL/d(output) entries of the model's and q's layers.
        metrics : dict
            As ``metrics`` reports them.
        """
        f = self.fused.forward_from(rows, uniforms)
        log_p = sum(f.log_p).view(self.k, -1)
        integrand = log_p - sum(f.log_q).view(self.k, -1)
        signal = integrand - self.baseline(integrand)
        grads = self.fused.model_grads(f, rows) + self.fused.inference_grads(f, [signal.reshape(-1)] * len(f.hs))
        return grads, self.metrics(integrand, log_p, signal, diagnostics)
