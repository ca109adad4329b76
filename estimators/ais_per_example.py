"""Per-example AIS for any model that follows ``nvil.models.protocol`` (a user's own VAE, binary VAE, the built-in
VAE, the Gaussian nets in a sampler form): ``estimator=ais`` on a model whose latents are integrated out
(``nvil.estimators.ROUTES``), batched over examples x chains (example-major), each batch drawing from a
generator seeded by (seed, first row), so a seed fixes every estimate and sharding does not change one.

Per example, ``num_chains`` AIS runs from the base (prior or proposal) to the posterior along
``nvil.estimators.model_paths`` (HMC for continuous z, Gibbs or Metropolis flips for binary z), their weights
averaged: exp(estimate) is unbiased for p(x) (Neal 2001, eq. 3). Its certificate: each example's ESS over its
chains; the estimate at or above IWAE's (a lower bound below a cheaper lower bound, beyond 3 standard errors of
their paired difference, is flagged); and BDMC at the same settings on data simulated from the model (Grosse,
Ghahramani & Adams 2015).
"""


from __future__ import annotations

import time

import torch

from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.core.ops import chunks, log_mean_exp, mean_and_stderr
from nvil.estimators.annealing import ais
from nvil.estimators.annealing import schedule as schedule_betas
from nvil.estimators.base import NO_PROGRESS, BatchProgress, Result, batch_generator, check_seed
from nvil.estimators.bdmc import BDMC
from nvil.estimators.bounds import IWAE
from nvil.estimators.protocol_view import (
    check_data,
    check_start,
    eval_mode,
    protocol,
    stream,
)
from nvil.estimators.model_paths import fixed_kernel_path, path_settings
from nvil.estimators.per_example import PerExample
from nvil.models.protocol import ProtocolModel


class ModelAIS(PerExample):
    """``estimator=ais`` on a user's model, with its certificate (the module docstring).

    ``num_chains`` AIS runs per example on ``num_betas`` steps of the ladder ``schedule`` from ``start``, their
    weights averaged (log-mean-exp): exp(estimate) is unbiased for p(x) (Neal 2001, eq. 3). Continuous z moves by
    HMC with, per example and beta, a step size fixed in advance by a pilot run; binary z by Gibbs or Metropolis
    flips. The checks: each example's ESS over its chains, the comparison with IWAE from the same start
    (``above_iwae``), and BDMC at these settings on data simulated from the model (``bdmc_gap``, ``bdmc_order``).
    Each batch draws from a generator seeded by (seed, first row), so sharding does not change an estimate.

    Parameters
    ----------
    num_betas : int, default 1000
        Steps of the ladder (K).
    schedule : str, default "sigmoid"
        A fixed ladder: sigmoid | linear | paper (adaptive is refused for a user's model).
    num_chains : int, default 16
        AIS runs per example, their weights averaged.
    start : str or None, default None
        The base f_0: prior | proposal (None: the proposal where the model defines one, else the prior).
    batch_size : int, default 50
        Examples per batch (chains = batch_size x num_chains).
    num_leapfrog : int, default 10
        Continuous z: leapfrog steps per HMC move.
    step_size : float, default 0.05
        Continuous z: the pilot chains' initial step size (with ``adapt=False``, the step size throughout).
    target_accept : float, default 0.65
        Continuous z: the acceptance rate the pilot chains adapt their step sizes towards.
    max_step_size : float or None, default 10.0
        Continuous z: the largest step size the pilot may reach (None: no clamp).
    adapt : bool, default True
        Continuous z: fix the step sizes by a pilot run; False uses ``step_size`` throughout.
    pilot_chains : int, default 2
        Continuous z: pilot chains per example, whose per-example, per-beta geometric mean step size the main
        chains use.
    moves : str, default "gibbs"
        Binary z: gibbs (one scan per beta) or mh (Metropolis flips).
    num_moves : int or None, default None
        Binary z with mh: proposals per beta (None: the number of latent units).
    num_flips : int, default 1
        Binary z with mh: units flipped per proposal.
    iwae_samples : int, default 1000
        Samples of the IWAE comparison from the same start (0: none).
    num_simulated : int, default 50
        Examples simulated for BDMC at these settings (0: none).
    max_gap : float, default 1.0
        Nats; BDMC is certified when its mean gap is at most this.
    reverse : bool, default True
        Also run each chain back from its final state to the base along the same kernels: on the real rows an
        estimate from above where the chains reached the posterior (Grosse, Ancha & Roy 2016's BREAD; an upper
        bound only from exact posterior draws, which BDMC has on simulated data). The ``reverse_order`` check
        flags an estimate above it by more than 3 standard errors of the paired difference. Doubles the cost.
    accel : str, default "none"
        none | compile (the tempered log density compiled) | cudagraphs (CUDA only).
    min_example_ess : float or None, default None
        The per-example ESS below which the certificate fails, as ``PerExample`` (None: max(1.5, 0.2 num_chains)).

    Raises
    ------
    nvil.core.errors.ConfigError
        If ``schedule`` is adaptive or unknown, ``start`` is not prior, proposal or None, ``iwae_samples`` or
        ``num_simulated`` is negative, or another setting is out of range.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import VAE
    >>> from nvil.estimators import ModelAIS
    >>> vae = VAE(6, latent=[2], hidden=[[4]])
    >>> x = torch.bernoulli(torch.full((4, 6), 0.5))
    >>> est = ModelAIS(num_betas=10, num_chains=3, num_leapfrog=2, iwae_samples=10, num_simulated=4)
    >>> result = est.estimate(vae, x)
    >>> result.log_p.shape, result.run_log_p.shape
    (torch.Size([4]), torch.Size([3, 4]))
    >>> result.checks
    ['nonzero_estimates', 'example_ess', 'run_spread', 'reverse_order', 'reverse_gap', 'above_iwae', 'bdmc_gap', 'bdmc_order', 'likelihood_consistency']
    >>> result.extras["start"], result.extras["latent"]
    ('proposal', 'continuous(2)')
    """

    name = "ais"
    importance_runs = True
    uses_log_z = False
    runs_name = "num_chains"

    def __init__(self, *, num_betas: int = 1000, schedule: str = "sigmoid", num_chains: int = 16,
                 start: str | None = None, batch_size: int = 50, num_leapfrog: int = 10, step_size: float = 0.05,
                 target_accept: float = 0.65, max_step_size: float | None = 10.0, adapt: bool = True,
                 pilot_chains: int = 2, moves: str = "gibbs", num_moves: int | None = None, num_flips: int = 1,
                 iwae_samples: int = 1000, num_simulated: int = 50, max_gap: float = 1.0, reverse: bool = True,
                 accel: str = "none", min_example_ess: float | None = None) -> None:
        super().__init__(num_runs=num_chains, batch_size=batch_size, min_example_ess=min_example_ess)
        self.reverse = bool(reverse)
        self.num_betas = positive_int(num_betas, "estimator.num_betas")
        if schedule == "adaptive":
            raise ConfigError("estimator.schedule must be a fixed ladder (sigmoid, linear or paper) for a user's model")
        self.schedule = schedule
        self.betas = schedule_betas(schedule, self.num_betas)
        check_start(start)
        self.start = start
        self.path_settings = path_settings(num_leapfrog=num_leapfrog, step_size=step_size,
                                           target_accept=target_accept, adapt=adapt, max_step_size=max_step_size,
                                           pilot_chains=pilot_chains, moves=moves, num_moves=num_moves,
                                           num_flips=num_flips, accel=accel)
        self.step_size, self.pilot_chains = self.path_settings["step_size"], self.path_settings["pilot_chains"]
        self.iwae_samples = int(iwae_samples)
        self.num_simulated = int(num_simulated)
        self.max_gap = positive_float(max_gap, "estimator.max_gap")
        if self.iwae_samples < 0 or self.num_simulated < 0:
            raise ConfigError("estimator.iwae_samples and estimator.num_simulated must be >= 0 (0: that check is off)")
        self.accept: list[torch.Tensor] = []
        self.final_steps: list[torch.Tensor] = []  # per batch: [chains], the step sizes of the last move
        self.reverse_upper: list[torch.Tensor] = []  # per batch: [examples], the reverse runs' log p(x)

    def latent_model(self, model, inference=None) -> ProtocolModel:
        """The model seen through the protocol, what ``run_batch`` works with.

        Parameters
        ----------
        model : torch.nn.Module or ProtocolModel
            A model following ``nvil.models.protocol`` (or one already wrapped).
        inference : torch.nn.Module or None, default None
            Not used (every estimator is handed it).

        Returns
        -------
        ProtocolModel
            ``model`` wrapped (checked once), or ``model`` itself when it is one.
        """
        return protocol(model)

    def check(self, model, inference=None) -> None:
        """Refuse, before any work starts, a model that does not follow the protocol or cannot give the base.

        A prior start needs the model's ``sample_prior``.

        Parameters
        ----------
        model : torch.nn.Module
            The model to be scored.
        inference : torch.nn.Module or None, default None
            Not used (every estimator is handed it).

        Raises
        ------
        nvil.core.errors.ConfigError
            If ``model`` does not follow the protocol, or the base ``start`` (or the model's default) is the prior and
            the model defines no ``sample_prior`` (raised by ``ProtocolModel``).
        """
        pm = protocol(model)
        if (self.start or pm.default_base()) == "prior" and not callable(getattr(pm.obj, "sample_prior", None)):
            pm.base("prior", None)  # its one-line refusal

    def run_batch(self, pm: ProtocolModel, x, generator, progress: BatchProgress = NO_PROGRESS) -> torch.Tensor:
        """One batch's AIS runs from the base to the posterior: a log-weight per chain, exp of each unbiased for p(x).

        The acceptance rates and the last move's step sizes are kept for ``settings``. Progress: one unit per AIS
        step (and per pilot step).

        Parameters
        ----------
        pm : ProtocolModel
            The model through the protocol.
        x : torch.Tensor
            ``[chains, ...]``: each example repeated ``num_chains`` times, example-major.
        generator : torch.Generator
            The batch's source of randomness (seeded by (seed, first row)).
        progress : BatchProgress, default NO_PROGRESS
            The batch's share of the evaluation bar.

        Returns
        -------
        torch.Tensor
            ``[chains]`` log w, each an estimate of log p(x).
        """
        progress.plan((2 if self.reverse else 1) * (len(self.betas) - 1))
        path = fixed_kernel_path(pm, x, self.betas, start=self.start or pm.default_base(), chains=self.num_runs,
                                 generator=generator, on_step=lambda k, inc: progress.advance(), **self.path_settings)
        log_w, final = ais(path, path.start(generator, self.step_size), self.betas, generator,
                           on_step=lambda k, inc: progress.advance())
        self.accept.append((final.accept_sum / max(1, len(self.betas) - 2)).cpu())
        self.final_steps.append(final.step_size.cpu())
        if self.reverse:  # back from the final states, the same fixed kernels in the reverse order (as BDMC)
            start = path.state(final.z, final.step_size, torch.zeros_like(final.accept_sum))
            log_w_rev, _ = ais(path, start, self.betas.flip(0), generator, on_step=lambda k, inc: progress.advance())
            # exp(log w_rev) estimates 1 / p(x): the log of each example's mean weight, negated (BDMC's upper side)
            self.reverse_upper.append(-log_mean_exp(log_w_rev.double().view(-1, self.num_runs), 1).cpu())
        return log_w

    @torch.no_grad()
    def estimate(self, model, x, *, seed: int = 0, progress=None, row_offset: int = 0, **_) -> Result:
        """log p(x) for each row of ``x``: ``num_chains`` AIS runs per example, then the certificate's checks.

        The IWAE comparison runs where ``iwae_samples`` > 0, BDMC on simulated data where ``num_simulated`` > 0
        (each with its own stream of ``seed``).

        Parameters
        ----------
        model : torch.nn.Module
            A model following ``nvil.models.protocol``.
        x : torch.Tensor
            ``[examples, ...]`` rows to score, on the device the model computes on.
        seed : int, default 0
            The result's seed; each batch draws from a generator seeded by (seed, first row + ``row_offset``).
        progress : tqdm or None, default None
            A bar counting examples.
        row_offset : int, default 0
            The index of ``x``'s first row in the whole split, so a shard draws what the whole split would.
        **_ : Any
            Other keywords the evaluation driver hands every estimator (``inference``, ``generator``, ...), ignored.

        Returns
        -------
        Result
            ``log_p`` [examples] (the log-mean-exp over each example's chains), ``run_log_p`` [chains, examples],
            the settings and diagnostics in ``extras`` and the certificate.

        Raises
        ------
        nvil.core.errors.ConfigError
            If ``model`` does not follow the protocol, or ``x`` has no examples along its first dimension.
        ValueError
            If ``seed`` is not an integer.
        """
        pm = self.latent_model(model)
        check_data(x)
        check_seed(seed)
        t0 = time.perf_counter()
        runs = []
        self.reverse_upper = []
        with eval_mode(pm):
            for s0, s1 in chunks(x.shape[0], self.batch_size):
                g = batch_generator(seed, row_offset + s0, x.device)
                share = BatchProgress(progress, s1 - s0)
                log_w = self.run_batch(pm, x[s0:s1].repeat_interleave(self.num_runs, 0), g, share)
                runs.append(log_w.double().view(-1, self.num_runs).cpu())
                share.finish()
        per_run = torch.cat(runs)
        result = Result(self.name, self.combine(per_run), time.perf_counter() - t0, seed, self.settings(pm),
                        run_log_p=per_run.T.contiguous(),
                        runs_name=self.runs_name)
        self.certify(result, per_run)
        if self.reverse_upper:
            upper = torch.cat(self.reverse_upper)
            diff, se = mean_and_stderr(result.log_p - upper)
            result.extras.update({"reverse_mean_log_p": round(upper.mean().item(), 4),
                                  "ais_minus_reverse": round(diff, 4), "ais_minus_reverse_stderr": round(se, 4)})
            self.check_reverse(result)
        if self.iwae_samples:
            self.compare_with_iwae(pm, x, result, seed, row_offset)
        if self.num_simulated:
            self.check_schedule(pm, result, seed)
        result.seconds = time.perf_counter() - t0
        return result

    def check_reverse(self, result: Result) -> None:
        """The sandwich on the real rows: ``reverse_order`` and ``reverse_gap`` against the reverse runs.

        The reverse run from each chain's final state estimates log p(x) from above where the chains reached the
        posterior. ``reverse_order``: the estimate not above it by more than 3 paired SE (a number the runs do not
        support). ``reverse_gap``: not below it by more than ``max_gap`` (the gap BDMC allows on simulated data)
        plus 3 paired SE (a number far below what the chains found, or chains that did not mix). It reads
        ``reverse_mean_log_p`` and ``ais_minus_reverse_stderr`` from ``extras`` and the estimate's mean.

        Parameters
        ----------
        result : Result
            The AIS result, whose certificate is updated in place.
        """
        gap = result.mean - result.extras["reverse_mean_log_p"]
        se = result.extras["ais_minus_reverse_stderr"]
        result.check("reverse_order", gap <= 3 * se + 1e-9,
                     f"reverse_order: the estimate lies {gap:.4g} nats above the reverse runs from its chains' final "
                     f"states (more than 3 standard errors of the paired difference, {3 * se:.3g}): a number the "
                     "runs do not support, or chains that did not reach the posterior; use more betas "
                     "(estimator.num_betas)")
        result.check("reverse_gap", -gap <= self.max_gap + 3 * se,
                     f"reverse_gap: the reverse runs from the chains' final states lie {-gap:.4g} nats above the "
                     f"estimate (more than estimator.max_gap={self.max_gap:g} plus 3 standard errors, {3 * se:.3g}): "
                     "the sandwich on these rows is too wide to trust; use more betas (estimator.num_betas)")

    def compare_with_iwae(self, pm: ProtocolModel, x, result: Result, seed: int, row_offset: int) -> None:
        """The estimate against IWAE(``iwae_samples``) from the same start, recorded as the ``above_iwae`` check.

        Both are stochastic lower bounds, and AIS below the cheaper one by more than 3 standard errors of their
        paired difference is flagged. ``iwae``, ``ais_minus_iwae`` and its standard error go into ``extras``.

        Parameters
        ----------
        pm : ProtocolModel
            The model through the protocol.
        x : torch.Tensor
            ``[examples, ...]`` the rows the estimate is of.
        result : Result
            The AIS result, whose ``extras`` and certificate are updated in place.
        seed : int
            The estimate's seed; IWAE draws from its ``iwae`` stream.
        row_offset : int
            The index of ``x``'s first row in the whole split.
        """
        iwae = IWAE(num_samples=self.iwae_samples, start=self.start,
                    batch_size=self.batch_size).estimate(pm, x, seed=stream(seed, "iwae"), row_offset=row_offset)
        diff, se = mean_and_stderr(result.log_p - iwae.log_p)
        result.extras.update({"iwae": round(iwae.mean, 4), "iwae_num_samples": self.iwae_samples,
                              "ais_minus_iwae": round(diff, 4), "ais_minus_iwae_stderr": round(se, 4)})
        result.check("above_iwae", diff >= -3 * se,
                     f"above_iwae: the AIS estimate lies {-diff:.4g} nats below IWAE with {self.iwae_samples} samples "
                     f"(more than 3 standard errors of the paired difference, {3 * se:.3g}): a lower bound that loses to "
                     "a cheaper lower bound; use more betas (estimator.num_betas) or check the HMC acceptance")

    def check_schedule(self, pm: ProtocolModel, result: Result, seed: int) -> None:
        """BDMC at these settings on ``num_simulated`` examples from the model, its checks carried over.

        Where the model cannot simulate, the schedule stays uncertified and the line says so (``unchecked`` in
        ``extras``). The gap's summaries and BDMC's lower and upper means go into ``extras``.

        Parameters
        ----------
        pm : ProtocolModel
            The model through the protocol.
        result : Result
            The AIS result, whose ``extras`` and certificate are updated in place.
        seed : int
            The estimate's seed; BDMC draws from its ``bdmc`` stream.
        """
        if not pm.can_simulate:
            result.extras["unchecked"] = ("bdmc_gap: the model defines no sample_prior(n, generator) and "
                                          "sample_likelihood(z, generator), so the schedule was not checked on "
                                          "simulated data")
            return
        bdmc = self.bdmc(num_simulated=self.num_simulated, num_betas=self.num_betas, schedule=self.schedule,
                         num_chains=self.num_runs, start=self.start, batch_size=self.batch_size, max_gap=self.max_gap,
                         **self.path_settings).estimate(pm, seed=stream(seed, "bdmc"))
        result.carry(bdmc)
        keep = ("bdmc_gap", "bdmc_gap_stderr", "bdmc_gap_per_example_q50_q90_max", "num_simulated",
                "log_likelihood_ratio_z", "sampler_dependence_z")
        result.extras.update({k: bdmc.extras[k] for k in keep if k in bdmc.extras})
        result.extras["bdmc_mean_log_p_lower_upper"] = [round(bdmc.mean, 4), bdmc.extras.get("mean_log_p_upper")]

    def bdmc(self, **settings) -> BDMC:
        """The BDMC run that checks the schedule.

        Parameters
        ----------
        **settings : Any
            ``BDMC``'s keywords: this estimator's ladder, chains, start and path settings.

        Returns
        -------
        BDMC
            The estimator ``check_schedule`` runs (a subclass may return another).
        """
        return BDMC(**settings)

    def settings(self, pm: ProtocolModel | None = None) -> dict:
        """The estimator's settings for the result's ``extras``.

        Parameters
        ----------
        pm : ProtocolModel or None, default None
            The model through the protocol, for its default base, its latent kind and whether z is binary.

        Returns
        -------
        dict
            ``num_betas``, ``schedule``, ``num_chains``, ``start``, ``latent``, ``moves`` (binary z) or
            ``num_leapfrog`` (continuous z), and ``accept_rate`` once batches have run.
        """
        out = {"num_betas": self.num_betas, "schedule": self.schedule, "num_chains": self.num_runs,
               "start": self.start or (pm.default_base() if pm is not None else None),
               "latent": None if pm is None else f"{pm.latent.kind}({pm.n_latent})"}
        if pm is not None and pm.binary:
            out["moves"] = self.path_settings["moves"]
        else:
            out["num_leapfrog"] = self.path_settings["num_leapfrog"]
        if self.accept:
            out["accept_rate"] = round(torch.cat(self.accept).double().mean().item(), 4)
        return out
