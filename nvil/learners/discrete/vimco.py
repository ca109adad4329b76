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
    """VIMCO: the K-sample bound's gradient with leave-one-out learning signals (Mnih & Rezende 2016).

    Each update draws K = ``num_samples`` samples h_k ~ q(h | x) per example and ascends the K-sample bound
    L = log (1/K) sum_k w_k (Eq. 2); the score-function term of the inference network's gradient takes the
    leave-one-out signal L(h_k | h_-k) (Eqs. 8-10, ``signals``). For layered Bernoulli models the gradients are set by
    hand from the same draws (``fused_signals``). Defaults: configs/learner/vimco.yaml.

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
        K, the samples per example (at least 2: a leave-one-out signal needs another sample).

    Raises
    ------
    ConfigError
        If ``num_samples`` is below 2 (or not a positive integer), or an optimiser setting is invalid.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import SBN, LayeredInference
    >>> from nvil.learners import VIMCO
    >>> learner = VIMCO(SBN(6, [4, 3]), LayeredInference(6, [4, 3]), num_samples=3)
    >>> x = torch.bernoulli(torch.full((8, 6), 0.5))
    >>> sorted(learner.step(x))
    ['train/bound', 'train/elbo']
    >>> VIMCO.leave_one_out(torch.tensor([[0.0], [1.0], [2.0]])).squeeze(-1)
    tensor([1.5000, 1.0000, 0.5000])
    """

    NAME = "vimco"

    @staticmethod
    def leave_one_out(log_w: torch.Tensor) -> torch.Tensor:
        """log w^_-k: the mean of the other samples' log weights (Eq. 10).

        Parameters
        ----------
        log_w : torch.Tensor
            The log weights log w_k = log p(x, h_k) - log q(h_k | x), ``[K, batch]``.

        Returns
        -------
        torch.Tensor
            ``[K, batch]``: entry k is (1 / (K - 1)) sum_{j != k} log w_j, the geometric mean of the other weights (in
            log space) that replaces w_k in the baseline.
        """
        return (log_w.sum(0, keepdim=True) - log_w) / (log_w.shape[0] - 1)

    def signals(self, log_w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The bound L and the leave-one-out learning signals L(h_k | h_-k), from the detached log weights (Eqs. 2, 9).

        Parameters
        ----------
        log_w : torch.Tensor
            The detached log weights ``[K, batch]``.

        Returns
        -------
        bound : torch.Tensor
            L = log (1/K) sum_k w_k, ``[batch]``.
        signal : torch.Tensor
            L(h_k | h_-k) = L - log (1/K) (sum_{j != k} w_j + w^_-k), ``[K, batch]``.
        """
        k = log_w.shape[0]
        bound = log_mean_exp(log_w, 0)
        # the K x K matrix whose row k is log w with entry k replaced by log w^_-k
        eye = torch.eye(k, dtype=torch.bool, device=log_w.device).unsqueeze(-1)
        replaced = torch.where(eye, self.leave_one_out(log_w).unsqueeze(1), log_w.unsqueeze(0))
        return bound, bound - log_mean_exp(replaced, 1)

    def surrogate(self, x: torch.Tensor, diagnostics: bool = True) -> tuple[torch.Tensor, dict]:
        """The autograd path's loss, -mean_n [L + sum_k L(h_k | h_-k) log q(h_k | x)], and the metrics.

        Its gradient is minus VIMCO's estimate: the bound's own gradient through log w (the model's, and q's direct
        term) plus the score-function term with the leave-one-out signals held fixed.

        Parameters
        ----------
        x : torch.Tensor
            The minibatch ``[batch, n_visible]``.
        diagnostics : bool, default True
            Also report ``train/model_loss`` and ``vimco/ess``.

        Returns
        -------
        loss : torch.Tensor
            The 0-d surrogate loss.
        metrics : dict
            As ``metrics`` reports them.
        """
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
        """What a step reports: the bound, the mean log weight and, on a logging step, the model loss and the ESS.

        Parameters
        ----------
        bound : torch.Tensor
            L per example, ``[batch]``.
        log_w : torch.Tensor
            The log weights ``[K, batch]``.
        log_p : torch.Tensor
            log p(x, h_k), ``[K, batch]``.
        diagnostics : bool
            Include ``train/model_loss`` and ``vimco/ess``.

        Returns
        -------
        dict of str to torch.Tensor
            ``train/bound`` (mean L), ``train/elbo`` (mean log w) and, with ``diagnostics``, ``train/model_loss``
            (-mean log p) and ``vimco/ess`` (the mean effective sample size 1 / sum_k w~_k^2 of the normalised weights).
        """
        metrics = {"train/bound": bound.mean(), "train/elbo": log_w.mean()}
        if diagnostics:
            metrics["train/model_loss"] = -log_p.mean()
            metrics["vimco/ess"] = (1.0 / torch.softmax(log_w, 0).pow(2).sum(0)).mean()
        return metrics

    @staticmethod
    def inference_signal(signal: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The coefficient of grad_phi log q(h_k | x) in the ascent direction: L(h_k | h_-k) - w~_k.

        L(h_k | h_-k) comes from the score-function term, minus w~_k from the bound's own dependence on phi through
        log w_k = log p - log q (Eq. 8).

        Parameters
        ----------
        signal : torch.Tensor
            L(h_k | h_-k), ``[K, batch]``.
        w : torch.Tensor
            The normalised weights w~_k = w_k / sum_j w_j, ``[K, batch]``.

        Returns
        -------
        torch.Tensor
            ``signal - w``, ``[K, batch]``.
        """
        return signal - w

    @torch.no_grad()
    def fused_signals(self, rows: torch.Tensor, uniforms: list[torch.Tensor], diagnostics: bool = False) -> tuple:
        """The hand-derived step up to its weight GEMMs (``FusedPath``) over the K N rows.

        Forward over the K N rows, the signals, and the gradients of the surrogate's loss
        -mean_n [L + sum_k L(h_k | h_-k) log q(h_k | x)] as dL/d(output) entries.

        Parameters
        ----------
        rows : torch.Tensor
            The minibatch repeated K times, ``[K N, n_visible]`` (sample k of example n in row k N + n).
        uniforms : list of torch.Tensor
            The uniforms of q's draws for the rows, one tensor per layer.
        diagnostics : bool, default False
            Also report ``train/model_loss`` and ``vimco/ess``.

        Returns
        -------
        grads : list of tuple
            The dL/d(output) entries of the model's and q's layers.
        metrics : dict
            As ``metrics`` reports them.
        """
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
