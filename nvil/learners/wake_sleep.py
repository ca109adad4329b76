"""Wake-sleep (Hinton et al. 1995), the comparison in Mnih & Gregor 2014 (Sec. 3.2, Table 1).

- wake: h ~ q(h | x) on the data and the same model update as NVIL, grad_theta log p(x, h);
- sleep: (x, h) ~ p(x, h) from the model and the recognition update grad_phi log q(h | x).

The sleep phase does not follow the gradient of any bound, so ``train/elbo`` (reported from the wake
samples, like NVIL's) is a diagnostic, not the quantity being ascended.

For layered Bernoulli models (``nvil.learners.fused.covers``) both phases' gradients are set by hand
(``LayeredBernoulliGradients.model_grads`` and ``sleep_grads``), from the same draws as the autograd path, and
``trainer.accel=compile`` compiles that step; data parallelism runs the autograd path.
"""

from __future__ import annotations

import torch
from torch import nn

from nvil.core.config import positive_int
from nvil.learners.base import SurrogateLearner, build_optimizer, directed_groups
from nvil.learners.fused import fused_gradients
from nvil.learners.fused_path import FusedPath
from nvil.learners.weight_steps import apply_update, plain_sgd_rates


class WakeSleep(FusedPath, SurrogateLearner):
    """Wake-sleep for a directed binary model and its inference network (Hinton et al. 1995).

    The wake phase fits the model to (x, h), h ~ q(h | x), the sleep phase fits q to dreams (x, h) ~ p(x, h).
    Defaults: configs/learner/wake_sleep.yaml.

    Parameters
    ----------
    model : nn.Module
        The directed model p(x, h) with parameters theta (an ``nvil.models.SBN`` or an fDARN).
    inference : nn.Module
        The recognition network q(h | x) with parameters phi (``nvil.models.LayeredInference``).
    device : torch.device or str, default "cpu"
        Where the learner and its generator live.
    seed : int, default 0
        Seed of the learner's generator (the wake draws from q and the dreams from p).
    optimizer : str, default "adam"
        ``adam`` or ``sgd``.
    lr : float, default 0.001
        The model's learning rate.
    momentum : float, default 0.0
        SGD's momentum.
    beta2 : float, default 0.999
        Adam's second-moment decay.
    inference_lr_scale : float, default 0.2
        The recognition network's rate relative to ``lr`` (as NVIL's, for a like-for-like comparison).
    sleep_batch_size : int or None, default None
        Dreams per update; None: the minibatch size.

    Raises
    ------
    ConfigError
        If ``sleep_batch_size`` is not a positive integer or None, or ``optimizer`` / ``lr`` / ``beta2`` is invalid.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import SBN, LayeredInference
    >>> from nvil.learners import WakeSleep
    >>> learner = WakeSleep(SBN(6, [4, 3]), LayeredInference(6, [4, 3]), sleep_batch_size=4)
    >>> x = torch.bernoulli(torch.full((8, 6), 0.5))
    >>> sorted(learner.step(x))
    ['train/elbo', 'train/model_loss', 'wake_sleep/sleep_log_q']
    """

    def __init__(self, model: nn.Module, inference: nn.Module, *, device: torch.device | str = "cpu", seed: int = 0,
                 optimizer: str = "adam", lr: float = 0.001, momentum: float = 0.0, beta2: float = 0.999,
                 inference_lr_scale: float = 0.2, sleep_batch_size: int | None = None) -> None:
        super().__init__()
        self.model, self.inference = model, inference
        self.to(device)
        lr, groups = directed_groups(model, inference, lr, inference_lr_scale)
        self.optimizer = build_optimizer(groups, optimizer, lr, momentum, beta2)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.sleep_batch = positive_int(sleep_batch_size, "learner.sleep_batch_size", allow_none=True)
        self.fused = fused_gradients(model, inference)

    def surrogate(self, x: torch.Tensor, diagnostics: bool = True) -> tuple[torch.Tensor, dict]:
        """The autograd path's loss: the wake phase's -mean log p(x, h) plus the sleep phase's -mean log q(h | x).

        Wake: h ~ q(h | x) on the data (no gradient through the draw), the model fitted to (x, h). Sleep: (x, h) dreamt
        from the model, the recognition network fitted to it. The loss follows the gradient of no single bound.

        Parameters
        ----------
        x : torch.Tensor
            The minibatch ``[batch, n_visible]``.
        diagnostics : bool, default True
            Unused: the metrics are the same on every step (the base class's signature).

        Returns
        -------
        loss : torch.Tensor
            0-d: wake loss plus sleep loss.
        metrics : dict
            ``train/elbo`` (a diagnostic from the wake samples), ``train/model_loss`` and ``wake_sleep/sleep_log_q``.
        """
        # Wake phase: recognise the data, fit the model to (x, h).
        with torch.no_grad():
            hs, log_q = self.inference.sample(x, generator=self.generator)
        log_p = self.model.log_joint(x, hs)
        wake_loss = -log_p.mean()
        # Sleep phase: dream (x, h) from the model, fit the recognition network to it.
        n = int(self.sleep_batch or x.shape[0])
        x_dream, h_dream = self.model.sample(n, generator=self.generator)
        sleep_log_q = self.inference.log_prob(h_dream, x_dream)
        sleep_loss = -sleep_log_q.mean()
        metrics = {
            "train/elbo": (log_p.detach() - torch.stack(log_q).sum(0)).mean(),
            "train/model_loss": wake_loss.detach(),
            "wake_sleep/sleep_log_q": sleep_log_q.detach().mean(),
        }
        return wake_loss + sleep_loss, metrics

    def step(self, x: torch.Tensor, diagnostics: bool = False) -> dict[str, torch.Tensor]:
        """One wake-sleep update on the minibatch ``x``.

        On the fused path the same draws (q's uniforms, then the dream) and optimiser step as
        ``SurrogateLearner.step``, with plain SGD written by the gradients' GEMMs on steps that log nothing.

        Parameters
        ----------
        x : torch.Tensor
            The minibatch ``[batch, n_visible]``.
        diagnostics : bool, default False
            A logging step: also report the gradient norms ``grad_norm/<group>``.

        Returns
        -------
        dict of str to torch.Tensor
            The step's metrics (0-d tensors on the device): ``train/elbo``, ``train/model_loss``,
            ``wake_sleep/sleep_log_q``.
        """
        if self.fused is None:
            return super().step(x, diagnostics)
        rates = None if diagnostics else plain_sgd_rates(self.optimizer)
        uniforms = self.fused.uniforms(x, self.generator)
        x_dream, h_dream = self.model.sample(int(self.sleep_batch or x.shape[0]), generator=self.generator)
        grads, metrics = self.fused_step(x, uniforms, x_dream, h_dream)
        return apply_update(grads, metrics, self.optimizer, rates, diagnostics)

    @torch.no_grad()
    def fused_step(self, x: torch.Tensor, uniforms: list[torch.Tensor], x_dream: torch.Tensor,
                   h_dream: list[torch.Tensor]) -> tuple[list[tuple], dict]:
        """Both phases' dL/d(output) entries and the metrics, from the draws.

        A function of tensors, compiled with ``trainer.accel=compile``.

        Parameters
        ----------
        x : torch.Tensor
            The minibatch ``[batch, n_visible]``.
        uniforms : list of torch.Tensor
            The uniforms of q's wake draws, one tensor per layer.
        x_dream : torch.Tensor
            The dreamt visible vectors ``[n, n_visible]``.
        h_dream : list of torch.Tensor
            The dreamt hidden layers [h_1, ..., h_n], each ``[n, units]``.

        Returns
        -------
        grads : list of tuple
            The wake phase's model entries and the sleep phase's inference entries (``LayeredBernoulliGradients``).
        metrics : dict
            ``train/elbo``, ``train/model_loss`` and ``wake_sleep/sleep_log_q``.
        """
        f = self.fused.forward_from(x, uniforms)
        sleep, sleep_log_q = self.fused.sleep_grads(x_dream, h_dream)
        log_p = sum(f.log_p)
        metrics = {"train/elbo": (log_p - sum(f.log_q)).mean(), "train/model_loss": -log_p.mean(),
                   "wake_sleep/sleep_log_q": sleep_log_q.mean()}
        return self.fused.model_grads(f, x) + sleep, metrics
