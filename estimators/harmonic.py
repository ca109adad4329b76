"""The harmonic mean estimator (Newton & Raftery 1994), kept to show how it over-estimates.

1 / P(v) = E_{P(h | v)}[1 / P(v | h)] ~= (1/S) sum_s 1 / P(v | h^(s)), h^(s) from a Markov chain on P(h | v)
(Murray & Salakhutdinov 2009, Eq. 2): sequential Gibbs started from a sample of Q(h | v), ``burn_in``
sweeps discarded, then one sample per sweep. By Jensen, E[log P_hat(v)] >= log P(v); samples rarely reach
the tails that carry the large weights, so the over-estimate is usually silent and can be large.
"""

from __future__ import annotations

import torch

from nvil.core.config import positive_int
from nvil.core.errors import ConfigError
from nvil.core.ops import log_mean_exp
from nvil.estimators.base import NO_PROGRESS, BatchProgress
from nvil.estimators.per_example import LatentModel, PerExample
from nvil.mcmc.flip_gibbs import site_gibbs
from nvil.models.protocol import CLOSED_FORM_LIKELIHOOD, capable, protocol_only


class Harmonic(PerExample):
    """``estimator=harmonic``: the harmonic mean of P(v | h) over sequential-Gibbs samples of P(h | v).

    Kept for comparison (Murray & Salakhutdinov 2009, Sec. 2.2, Eq. 2; the module docstring): it over-estimates
    log P(v), often badly. It needs no log Z, even for a DBN (P(v | h) is normalised, and sampling P(h | v) needs
    no Z), and serves a user's binary-latent model too (``LatentModel``). ``estimate`` is ``PerExample``'s
    (``nvil.estimators.per_example``); the defaults are configs/estimator/harmonic.yaml's.

    Parameters
    ----------
    num_samples : int, default 100
        S, the Gibbs samples h^(s) per run after ``burn_in``, one per sweep.
    burn_in : int, default 10
        Sweeps discarded after the start from a sample of Q(h | v); 0 keeps them all.
    num_runs : int, default 10
        Runs per example; their samples are pooled (``combine``).
    batch_size : int, default 50
        Examples per batch (chains = batch_size x num_runs).
    accel : str, default "auto"
        The sequential-Gibbs sweep: auto (the sweep in C on a CPU, one Triton kernel on CUDA) | none | native |
        compile.

    Raises
    ------
    ConfigError
        (``nvil.core.errors``) If ``burn_in`` is not a non-negative integer, or another setting is out of range, in
        one line naming ``estimator.KEY``.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import SBN, LayeredInference
    >>> from nvil.estimators import Harmonic
    >>> sbn, q = SBN(6, [3]), LayeredInference(6, [3])
    >>> x = (torch.rand(5, 6) < 0.5).float()
    >>> result = Harmonic(num_samples=10, burn_in=2, num_runs=2).estimate(sbn, x, inference=q)
    >>> result.log_p.shape, result.run_log_p.shape
    (torch.Size([5]), torch.Size([2, 5]))
    >>> "mean_log_p_per_run_is" in result.extras, result.certified
    (True, True)
    """

    name = "harmonic"
    uses_log_z = False  # P(v | h) is normalised even in a DBN, and sampling P(h | v) needs no Z
    serves_protocol = True  # a user's binary-latent model too (``LatentModel``)

    def __init__(self, *, num_samples: int = 100, burn_in: int = 10, num_runs: int = 10, batch_size: int = 50,
                 accel: str = "auto") -> None:
        super().__init__(num_runs=num_runs, batch_size=batch_size, accel=accel)
        self.num_samples = positive_int(num_samples, "estimator.num_samples")
        if isinstance(burn_in, bool) or not isinstance(burn_in, int) or burn_in < 0:
            raise ConfigError(f"estimator.burn_in must be a non-negative integer, got {burn_in!r}")
        self.burn_in = burn_in

    def check(self, model, inference=None) -> None:
        """Refuse, in one line, a model without p(v | h) in closed form, or one ``LatentModel`` does not take.

        Parameters
        ----------
        model : nn.Module or object
            The model to be scored: an SBN, fDARN or DBN (``CLOSED_FORM_LIKELIHOOD``), or a user's model that follows
            the protocol (``nvil.models.protocol``) with binary latents.
        inference : nn.Module or None, default None
            Q(h | v) of an SBN or fDARN (a DBN uses its greedy up-pass).

        Raises
        ------
        ConfigError
            (``nvil.core.errors``) If p(v | h) is not in closed form (a DBM: h_1 couples v and h_2), or the model
            has no binary latents or no approximate posterior (``LatentModel``).
        """
        if not (protocol_only(model) or capable(model, CLOSED_FORM_LIKELIHOOD)):
            raise ConfigError("estimator=harmonic needs p(v | h) in closed form, which a DBM's latent layers do not give "
                              "(h_1 couples v and h_2); use estimator=chib or ais_posterior")
        super().check(model, inference)

    def settings(self) -> dict:
        """The settings the result's JSON line records.

        With more than one run it also says what ``mean_log_p_per_run`` is here, replacing the JSON line's note
        for estimators whose runs estimate p(v) unbiasedly: the per-run mean over-estimates more than the pooled
        ``mean_log_p``.

        Returns
        -------
        dict
            ``num_samples``, ``burn_in`` and, with ``num_runs > 1``, ``mean_log_p_per_run_is``.
        """
        out = {"num_samples": self.num_samples, "burn_in": self.burn_in}
        if self.num_runs > 1:  # replaces the JSON line's note for estimators whose runs estimate p(v) unbiasedly
            out["mean_log_p_per_run_is"] = (
                "the mean over runs of each run's own log p(v) estimate, kept for run_spread; it is never below "
                "mean_log_p, which pools each example's runs (their 1 / p(v) estimates averaged) and so over-estimates "
                "less (Jensen's inequality): report mean_log_p")
        return out

    def combine(self, per_run: torch.Tensor) -> torch.Tensor:
        """Pool each example's runs: 1 / P_hat is the mean of the runs' 1 / P_hat.

        Parameters
        ----------
        per_run : torch.Tensor
            ``(examples, runs)`` float64 estimates of log P(v), one per run.

        Returns
        -------
        torch.Tensor
            ``(examples,)`` -log mean_r exp(-per_run): the log of the harmonic mean of the runs' P(v) estimates.
        """
        return -log_mean_exp(-per_run, 1)

    def run_batch(self, lm: LatentModel, x: torch.Tensor, generator,
                  progress: BatchProgress = NO_PROGRESS) -> torch.Tensor:
        """The harmonic-mean estimate of log P(v) of each chain from ``num_samples`` sweeps after ``burn_in``.

        Each chain starts from a sample of Q(h | v), runs sequential Gibbs on P(h | v) and returns
        -log (1/S) sum_s 1 / P(v | h^(s)) (Eq. 2). Progress: one unit per sweep, burn-in included.

        Parameters
        ----------
        lm : LatentModel
            (``nvil.estimators.latent_model``) the model's latent units, Q(h | v) and log P(v | h).
        x : torch.Tensor
            ``(chains, n_visible)`` rows, each example repeated once per run (example-major).
        generator : torch.Generator
            The batch's generator, seeded by (seed, first row): the draw of Q and the sweeps.
        progress : BatchProgress, default NO_PROGRESS
            (``nvil.estimators.base``) the batch's share of the progress bar: ``burn_in + num_samples`` units.

        Returns
        -------
        torch.Tensor
            ``(chains,)`` float64 estimates of log P(v), one per chain (run).
        """
        progress.plan(self.burn_in + self.num_samples)
        gibbs = site_gibbs([(1.0, lm.joint(x))], self.accel)
        h = lm.sample_q(x, generator)
        for _ in range(self.burn_in):
            h, _ = gibbs.step(h, 1.0, generator)
            progress.advance()
        neg_log_lik = []
        for _ in range(self.num_samples):
            h, _ = gibbs.step(h, 1.0, generator)
            neg_log_lik.append(-lm.log_likelihood(x, h).double())
            progress.advance()
        return -log_mean_exp(torch.stack(neg_log_lik), 0)
