"""Bidirectional Monte Carlo (Grosse, Ghahramani & Adams 2015): AIS run both ways along one path, for every model
that can simulate exact (z, x) pairs, built-in or a user's (``BDMC``, ``estimator=bdmc``). Both sides are stochastic
bounds on each simulated example's log p(x); their gap certifies the AIS schedule. It also checks that a model's
``log_likelihood`` and ``sample_likelihood`` agree on whether x depends on z (``likelihood_consistency``).

(For an RBM's log Z, AIS is run both ways by ``nvil.estimators.ais_rbm.reverse_log_z``, which
``nvil.estimators.certify`` runs from the checkpoint's persistent particles or a Gibbs run: ``estimator=ais`` and
``raise``.)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.core.ops import chunks, log_mean_exp, mean_and_stderr
from nvil.estimators.ais_posterior import PosteriorPath
from nvil.estimators.annealing import ais, check_schedule
from nvil.estimators.annealing import schedule as schedule_betas
from nvil.estimators.base import (
    NO_PROGRESS,
    BatchProgress,
    Estimator,
    Result,
    batch_generator,
    combine_runs,
    default_generator,
)
from nvil.estimators.protocol_view import (
    CONSISTENCY_PAIRS,
    check_likelihood_consistency,
    check_start,
    eval_mode,
    protocol,
    stream,
)
from nvil.estimators.model_paths import MAX_STEP_SIZE, ContinuousLatent, fixed_kernel_path, path_settings
from nvil.estimators.ais_posterior import pilot_steps, posterior_ladder
from nvil.estimators.latent_model import LatentModel
from nvil.models.gaussian import FORMS
from nvil.models.protocol import ANCESTRAL, CONTINUOUS_LATENTS, ProtocolModel, capable, protocol_only

@dataclass
class BDMCResult(Result):
    """A ``Result`` whose ``log_p`` is the forward (lower) side, with the reverse (upper) side and the simulated
    rows beside it (for tests and callers in Python; the JSON line carries their summaries)."""

    log_p_upper: torch.Tensor | None = None      # [num_simulated], -log mean_r exp(log w_rev)
    run_log_p_upper: torch.Tensor | None = None  # [runs, num_simulated], -log w_rev of each run
    simulated: torch.Tensor | None = None        # [num_simulated, n_visible], the v the estimates are of


class BDMC(Estimator):
    """``estimator=bdmc``: bidirectional Monte Carlo, forward and reverse AIS that sandwich log p(v) on simulated data.

    Grosse, Ghahramani & Adams 2015, "Sandwiching the marginal likelihood using bidirectional Monte Carlo"; Wu,
    Burda, Salakhutdinov & Grosse 2017, "On the quantitative analysis of decoder-based generative models", who use
    it to validate AIS for decoder-based models.

    For a directed model, one ancestral sample (h, v) ~ p(h) p(v | h) is a simulated data point v together with
    an exact sample h of its posterior p(h | v). Per simulated v, along one annealing path f_beta with Z_0 = 1:

    - forward AIS (beta 0 -> 1) from exact samples of f_0: E[exp(log w)] = Z_1 / Z_0 = p(v), so
      log mean_r exp(log w_r) under-estimates log p(v) in expectation (Jensen): a stochastic lower bound;
    - reverse AIS (the betas reversed, ``betas.flip(0)``, beta 1 -> 0) from the exact posterior sample h:
      E[exp(log w_rev)] = Z_0 / Z_1 = 1 / p(v) (Neal 2001's identity run backwards), so
      -log mean_r exp(log w_rev,r) over-estimates log p(v) in expectation: a stochastic upper bound.

    The true log p(v) lies between the two in expectation, so the mean gap (upper - lower) bounds the forward side's
    bias; a small gap certifies the schedule (num_betas, schedule, the HMC settings) for forward AIS on real data,
    where no exact posterior sample exists (``estimator=ais_posterior``, ``ais_hmc`` or ``ais``), as far as the
    simulated data resemble the real data (Wu et al. 2017 discuss this caveat).

    Paths (both directions the one loop ``nvil.estimators.annealing.ais``, each increment taken before the move):

    - binary latents of a built-in net with an inference network (SBN, fDARN): ``PosteriorPath`` over
      ``LatentModel``, f_beta(h) = Q(h | v)^(1 - beta) P(v, h)^beta, sequential Gibbs at each beta, exactly
      ``AISPosterior.run_batch`` forward (Murray & Salakhutdinov 2009, Sec. 2.3); Z_0 = 1 as Q is normalised;
    - every other model, through the protocol (``nvil.models.protocol``: a user's model, the VAE, the Gaussian nets
      in the sampler's ``form``): ``nvil.estimators.model_paths.fixed_kernel_path`` from the base ``start`` (prior
      or proposal), f_beta(z) = f_0(z)^(1 - beta) p(x, z)^beta, the path of ``estimator=ais`` and ``ais_hmc``.
      Continuous z moves by HMC, both directions with the step sizes of one pilot run
      (``nvil.estimators.model_paths.pilot_steps``: ``pilot_chains`` chains per v adapting their own, then per v
      and beta their geometric mean), fixed before either direction starts. They depend on v and the pilot's random
      numbers only, which given v are independent of the forward chains and of the exact posterior sample z, so
      every move in either direction is a fixed kernel leaving its f_beta invariant: exp(log w) is unbiased for
      p(v), and exp(log w_rev) for 1 / p(v). A step size adapted on the chain it moves would not be: it depends,
      through the acceptance of the previous move, on the state the move starts from. Binary z moves by ``moves``
      (gibbs or mh flips).

    Chains are examples x chains, example-major, batched; each batch of ``batch_size`` simulated examples draws its
    random numbers from a generator seeded by (seed, first row). The data split passed in is not used (the
    estimator simulates its own data); ``log_p`` is the forward side, ``mean_log_p_upper`` the reverse one.
    Defaults: configs/estimator/bdmc.yaml.

    Parameters
    ----------
    num_simulated : int, default 100
        (z, x) pairs drawn from the model.
    num_betas : int, default 1000
        Steps on the ladder ``schedule`` to certify (K).
    schedule : str, default "linear"
        linear | sigmoid | paper; adaptive for a built-in net's binary latents (one ladder per batch from a pilot
        run, fixed before both directions run on it).
    num_chains : int, default 4
        Chains per simulated example in each direction.
    start : str or None, default None
        Through the protocol: the base, prior | proposal (None: the proposal where the model defines one).
    batch_size : int, default 50
        Simulated examples per batch.
    max_gap : float, default 1.0
        Nats; certified when the mean gap (upper - lower) is at most this.
    num_leapfrog : int, default 10
        Continuous z: leapfrog steps per HMC move.
    step_size : float, default 0.05
        Continuous z: the initial step size of a pilot run of ``pilot_chains`` chains per simulated example
        adapting towards ``target_accept`` with ``adapt``, whose per-example geometric means both directions use;
        ``step_size`` throughout without ``adapt``.
    target_accept : float, default 0.65
        Continuous z: the acceptance rate the pilot adapts towards.
    max_step_size : float or None, default MAX_STEP_SIZE
        Continuous z: the largest step size of the pilot (None: no clamp).
    adapt : bool, default True
        Continuous z: fix the step sizes by the pilot run; False uses ``step_size``.
    pilot_chains : int, default 2
        Continuous z: pilot chains per simulated example.
    form : str, default "auxiliary"
        A Gaussian net's sampler state: auxiliary | centred.
    moves : str, default "gibbs"
        Binary z through the protocol: gibbs | mh.
    num_moves : int or None, default None
        Binary z with mh: proposals per beta (None: the number of latent units).
    num_flips : int, default 1
        Binary z with mh: units flipped per proposal.
    accel : str, default "none"
        none | compile | cudagraphs.

    Raises
    ------
    nvil.core.errors.ConfigError
        If ``form`` is not auxiliary or centred, ``start`` is not prior, proposal or None, the schedule is unknown,
        or a count, gap or step size is not positive, in one line naming the key.

    Examples
    --------
    >>> from nvil.models import GaussianBeliefNet
    >>> from nvil.estimators import BDMC
    >>> net = GaussianBeliefNet(6, [2])
    >>> result = BDMC(num_simulated=4, num_betas=20, num_chains=2, num_leapfrog=2).estimate(net)
    >>> result.log_p.shape, result.log_p_upper.shape, result.simulated.shape
    (torch.Size([4]), torch.Size([4]), torch.Size([4, 6]))
    >>> result.checks
    ['bdmc_gap', 'bdmc_order', 'likelihood_consistency']
    >>> result.extras["certifies"]
    'estimator=ais_hmc estimator.num_betas=20 estimator.schedule=linear'
    """

    runs_name = "num_chains"  # what the settings call the chains per simulated example (errors, the JSON line)
    name = "bdmc"
    simulates_own_data = True  # evaluate_checkpoint refuses to shard it: every shard would simulate the same rows
    serves_protocol = True  # a user's model and the VAE too, through the protocol
    # The running batch's share of the progress bar (a unit per AIS step either way), set around each ``run_batch``.
    batch_progress: BatchProgress = NO_PROGRESS

    def __init__(self, *, num_simulated: int = 100, num_betas: int = 1000, schedule: str = "linear",
                 num_chains: int = 4, start: str | None = None, batch_size: int = 50, max_gap: float = 1.0,
                 num_leapfrog: int = 10, step_size: float = 0.05, target_accept: float = 0.65,
                 max_step_size: float | None = MAX_STEP_SIZE, adapt: bool = True, pilot_chains: int = 2,
                 form: str = "auxiliary", moves: str = "gibbs", num_moves: int | None = None, num_flips: int = 1,
                 accel: str = "none") -> None:
        self.num_simulated = positive_int(num_simulated, "estimator.num_simulated")
        self.num_runs = positive_int(num_chains, f"estimator.{self.runs_name}")
        self.batch_size = positive_int(batch_size, "estimator.batch_size")
        self.num_betas = positive_int(num_betas, "estimator.num_betas")
        self.schedule = schedule
        check_schedule(self.schedule, self.num_betas)
        # adaptive (binary latents): one ladder per batch from a pilot run, fixed before both directions run on it
        self.betas = None if self.schedule == "adaptive" else schedule_betas(self.schedule, self.num_betas)
        self.max_gap = positive_float(max_gap, "estimator.max_gap")
        check_start(start)
        self.start = start
        self.path_settings = path_settings(num_leapfrog=num_leapfrog, step_size=step_size,
                                           target_accept=target_accept, adapt=adapt, max_step_size=max_step_size,
                                           pilot_chains=pilot_chains, moves=moves, num_moves=num_moves,
                                           num_flips=num_flips, accel=accel)
        if form not in FORMS:
            raise ConfigError(f"estimator.form must be one of {list(FORMS)}, got {form!r}")
        self.form = form

    def latent_model(self, model, inference=None):
        """What the paths run on: a built-in net's ``LatentModel``, else the model through the protocol.

        ``LatentModel`` for a built-in net's binary latents with its inference network; else ``ProtocolModel`` (a
        user's model, the VAE; a Gaussian net in the sampler's ``form``, ``ContinuousLatent``).

        Parameters
        ----------
        model : torch.nn.Module
            The model to simulate from and score.
        inference : torch.nn.Module or None, default None
            The inference network Q(h | v) of an SBN or fDARN.

        Returns
        -------
        LatentModel or ProtocolModel
            The latent view both directions of AIS run on.

        Raises
        ------
        nvil.core.errors.ConfigError
            If the model cannot simulate exact (h, v) pairs by ancestral sampling (a Boltzmann machine), or a model
            seen through the protocol alone lacks ``sample_prior`` or ``sample_likelihood``.
        """
        if protocol_only(model):
            pm = protocol(model)
            pm.require_simulation("estimator=bdmc")
            return pm
        if not capable(model, ANCESTRAL):
            raise ConfigError(f"estimator=bdmc simulates exact (h, v) pairs by ancestral sampling, which a "
                              f"{type(model).__name__} does not allow; for Boltzmann machines use estimator=raise "
                              f"(forward and reverse AIS for log Z) or estimator=ais")
        if capable(model, CONTINUOUS_LATENTS):
            return ProtocolModel(ContinuousLatent(model, self.name, self.form), "the Gaussian net")
        return LatentModel(model, inference, self.name)

    def check(self, model, inference=None) -> None:
        """Refuse, before any work starts, a model BDMC cannot simulate from (``latent_model``).

        Parameters
        ----------
        model : torch.nn.Module
            The model to be scored.
        inference : torch.nn.Module or None, default None
            The inference network of an SBN or fDARN.

        Raises
        ------
        nvil.core.errors.ConfigError
            If the model cannot simulate exact (h, v) pairs.
        """
        self.latent_model(model, inference)

    @staticmethod
    def continuous(lm) -> bool:
        """Whether ``lm``'s latents are continuous (a protocol model with continuous z: HMC moves).

        Parameters
        ----------
        lm : LatentModel or ProtocolModel
            The latent view of ``latent_model``.

        Returns
        -------
        bool
            True for a ``ProtocolModel`` whose latents are not binary.
        """
        return isinstance(lm, ProtocolModel) and not lm.binary

    def target(self, lm) -> str:
        """The forward estimator whose schedule this run certifies.

        Parameters
        ----------
        lm : LatentModel or ProtocolModel
            The latent view of ``latent_model``.

        Returns
        -------
        str
            ``ais_posterior`` (a built-in net's binary latents), ``ais_hmc`` (a Gaussian net) or ``ais``.
        """
        if isinstance(lm, LatentModel):
            return "ais_posterior"
        return "ais_hmc" if isinstance(lm.obj, ContinuousLatent) else "ais"

    @torch.no_grad()
    def simulate(self, lm, n: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` exact draws (x [n, ...], z [n, n_latent]) from the model, each z an exact posterior sample of its x.

        A built-in net's ancestral sample (its binary layers [h_1, ..., h_L] side by side), else the protocol's
        ``sample_prior`` then ``sample_likelihood`` (a Gaussian net's state in ``estimator.form``).

        Parameters
        ----------
        lm : LatentModel or ProtocolModel
            The latent view of ``latent_model``.
        n : int
            Number of pairs.
        generator : torch.Generator
            Source of randomness.

        Returns
        -------
        tuple of (torch.Tensor, torch.Tensor)
            The simulated rows x ``[n, ...]`` and their latents z ``[n, n_latent]``.
        """
        if isinstance(lm, LatentModel):
            v, h = lm.model.sample(n, generator=generator)
            return v, torch.cat(h, -1)
        z = lm.sample_prior(n, generator)
        return lm.sample_likelihood(z, generator), z

    def run_batch(self, lm, v: torch.Tensor, h: torch.Tensor, generator) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Forward and reverse AIS for chains (v, h), v repeated per chain and h the exact posterior sample of its v.

        exp of the forward log-weight is unbiased for p(v), of the reverse one for 1 / p(v). Both directions run on
        the same ladder (reversed, ``betas.flip(0)``) and the same fixed kernels. Progress goes to
        ``batch_progress``.

        Parameters
        ----------
        lm : LatentModel or ProtocolModel
            The latent view of ``latent_model``.
        v : torch.Tensor
            ``[chains, ...]``: each simulated row repeated ``num_chains`` times, example-major.
        h : torch.Tensor
            ``[chains, n_latent]``: each row's exact posterior sample, repeated alike.
        generator : torch.Generator
            The batch's source of randomness (seeded by (seed, first row)).

        Returns
        -------
        tuple of (torch.Tensor, torch.Tensor, dict)
            (log w forward [chains], log w reverse [chains], diagnostics): the diagnostics hold
            ``accept_forward`` and ``accept_reverse`` (per chain) for a protocol model, nothing for a built-in
            net's binary latents.

        Raises
        ------
        nvil.core.errors.ConfigError
            If the schedule is adaptive and the model is not a built-in net with binary latents.
        """
        progress = self.batch_progress
        step = lambda k, increment: progress.advance()  # noqa: E731
        s = self.path_settings
        if isinstance(lm, LatentModel):
            progress.plan(pilot_steps(self.schedule, self.num_betas) + 2 * self.num_betas)
            path = PosteriorPath(lm.joint(v), lm.q_density(v), s["accel"])
            betas = self.betas
            if betas is None:
                betas = posterior_ladder(path, lm, v, self.schedule, self.num_betas, self.num_runs, generator,
                                         on_step=step).betas(self.num_betas)
            log_w, _ = ais(path, path.state(lm.sample_q(v, generator)), betas, generator, on_step=step)
            log_w_rev, _ = ais(path, path.state(h), betas.flip(0), generator, on_step=step)
            return log_w, log_w_rev, {}
        if self.betas is None:
            raise ConfigError("estimator.schedule=adaptive covers a built-in net's binary latents in bdmc; for "
                              "this model use a fixed ladder (sigmoid, linear or paper)")
        pilot = self.continuous(lm) and s["adapt"]
        progress.plan((2 + pilot) * (len(self.betas) - 1))
        # Forward: what estimator=ais (ais_hmc on a Gaussian net) does, the same pilot, path, start and stream.
        path = fixed_kernel_path(lm, v, self.betas, start=self.start or lm.default_base(), chains=self.num_runs,
                                 generator=generator, on_step=step, **s)
        log_w, final = ais(path, path.start(generator, s["step_size"]), self.betas, generator, on_step=step)
        # Reverse: from the exact posterior sample, the same fixed kernels in the reverse order.
        start = path.state(h, final.step_size, torch.zeros_like(final.accept_sum))
        log_w_rev, final_rev = ais(path, start, self.betas.flip(0), generator, on_step=step)
        moves = max(1, len(self.betas) - 2)
        return log_w, log_w_rev, {"accept_forward": (final.accept_sum / moves).cpu(),
                                  "accept_reverse": (final_rev.accept_sum / moves).cpu()}

    @torch.no_grad()
    def estimate(self, model, data=None, *, inference=None, seed: int = 0, generator=None, progress=None,
                 **inputs) -> BDMCResult:
        """Simulate ``num_simulated`` examples and sandwich each one's log p(v) between forward and reverse AIS.

        ``generator`` draws the simulated pairs (default: seeded by ``seed``), each batch of chains its own generator
        seeded by (``seed``, first row). Through the protocol, the model's ``log_likelihood`` and
        ``sample_likelihood`` are also checked for agreeing on whether x depends on z (``likelihood_consistency``).

        Parameters
        ----------
        model : torch.nn.Module
            A model that can simulate exact (z, x) pairs (built-in or a user's).
        data : torch.Tensor or None, default None
            Not used (its width is checked when given).
        inference : torch.nn.Module or None, default None
            The inference network Q(h | v) of an SBN or fDARN.
        seed : int, default 0
            The result's seed and the seed of the batches' generators.
        generator : torch.Generator or None, default None
            Draws the simulated pairs; None: one seeded by ``seed``.
        progress : tqdm or None, default None
            A bar, reset to count the simulated examples.
        **inputs : Any
            Other keywords the evaluation driver hands every estimator, ignored.

        Returns
        -------
        BDMCResult
            ``log_p`` the forward (lower) side [num_simulated], ``log_p_upper`` the reverse (upper) side, the
            ``simulated`` rows, the gap's summaries in ``extras`` and the checks ``bdmc_gap`` and ``bdmc_order``
            (and ``likelihood_consistency``).

        Raises
        ------
        nvil.core.errors.ConfigError
            If ``data``'s width differs from the model's ``n_visible``, or the model cannot simulate.
        ValueError
            If ``seed`` is not an integer.
        """
        lm = self.latent_model(model, inference)
        generator = default_generator(generator, seed, model, data)
        t0 = time.perf_counter()
        n_visible = getattr(model, "n_visible", None)
        if data is not None and n_visible is not None and data.shape[1] != n_visible:
            raise ConfigError(f"data has {data.shape[1]} visible units but the model has {n_visible}")
        with eval_mode(model):
            result = self.sandwich(lm, seed, generator, progress)
            if isinstance(lm, ProtocolModel):
                check_likelihood_consistency(lm, result, max(self.num_simulated, CONSISTENCY_PAIRS),
                                             torch.Generator(generator.device).manual_seed(stream(seed, "consistency")))
        result.seconds = time.perf_counter() - t0
        return result

    def sandwich(self, lm, seed: int, generator, progress) -> BDMCResult:
        """Forward and reverse AIS on ``num_simulated`` simulated examples, batched; the result with its checks.

        Parameters
        ----------
        lm : LatentModel or ProtocolModel
            The latent view of ``latent_model``.
        seed : int
            Seeds each batch's generator (with the batch's first row).
        generator : torch.Generator
            Draws the simulated pairs.
        progress : tqdm or None
            A bar, reset to count the simulated examples.

        Returns
        -------
        BDMCResult
            Both sides per simulated example, each run's estimates and the ``report`` extras and checks.
        """
        n, runs = self.num_simulated, self.num_runs
        v_all, h_all = self.simulate(lm, n, generator)
        device = v_all.device
        if progress is not None and hasattr(progress, "reset"):
            progress.reset(total=n)  # the bar counts simulated examples, not the rows of the split
        fwd, rev, accept = [], [], {"accept_forward": [], "accept_reverse": []}
        for s0, s1 in chunks(n, self.batch_size):
            g = batch_generator(seed, s0, device)
            self.batch_progress = BatchProgress(progress, s1 - s0)
            try:
                log_w, log_w_rev, info = self.run_batch(lm, v_all[s0:s1].repeat_interleave(runs, 0),
                                                        h_all[s0:s1].repeat_interleave(runs, 0), g)
                self.batch_progress.finish()
            finally:
                self.batch_progress = NO_PROGRESS
            fwd.append(log_w.double().view(-1, runs).cpu())
            rev.append(log_w_rev.double().view(-1, runs).cpu())
            for k, t in info.items():
                accept[k].append(t)
        lower_runs = torch.cat(fwd)    # [examples, chains]: log w, each exp() unbiased for p(v)
        log_w_rev = torch.cat(rev)     # [examples, chains]: log w_rev, each exp() unbiased for 1 / p(v)
        lower = combine_runs(lower_runs)
        upper = -log_mean_exp(log_w_rev, 1)
        result = BDMCResult(self.name, lower, 0.0, seed, run_log_p=lower_runs.T.contiguous(), runs_name=self.runs_name,
                            log_p_upper=upper, run_log_p_upper=(-log_w_rev).T.contiguous(), simulated=v_all.cpu())
        result.extras.update(self.report(lm, result, accept))
        return result

    def report(self, lm, result: BDMCResult, accept: dict) -> dict:
        """The JSON extras and the two checks of the certificate (recorded on ``result``).

        ``bdmc_gap`` fails when the mean gap exceeds ``max_gap``; ``bdmc_order`` when the upper side lies below the
        lower by more than 3 standard errors of the per-example gap (an inverted sandwich).

        Parameters
        ----------
        lm : LatentModel or ProtocolModel
            The latent view of ``latent_model``.
        result : BDMCResult
            The result with both sides, whose certificate is updated in place.
        accept : dict
            Lists of per-batch acceptance rates (``accept_forward``, ``accept_reverse``); empty lists for none.

        Returns
        -------
        dict
            ``mean_log_p_upper``, ``stderr_upper``, ``bdmc_gap`` and its standard error and quantiles, ``max_gap``,
            ``certifies`` (the estimator and settings certified), the settings and the acceptance rates.
        """
        gap = result.log_p_upper - result.log_p
        mean_gap, se_gap = mean_and_stderr(gap)
        mean_upper, se_upper = mean_and_stderr(result.log_p_upper)
        q = ([*torch.quantile(gap, torch.tensor([0.5, 0.9], dtype=gap.dtype)).tolist(), gap.max().item()]
             if torch.isfinite(gap).all() else [math.nan] * 3)  # JSON null, with the reason beside it
        target = self.target(lm)
        settings = f"estimator.num_betas={self.num_betas} estimator.schedule={self.schedule}"
        result.check("bdmc_gap", mean_gap <= self.max_gap,
                     f"bdmc_gap: the mean gap between reverse-AIS (upper) and forward-AIS (lower) log p over "
                     f"{self.num_simulated} simulated examples is {mean_gap:.4g} nats, above estimator.max_gap="
                     f"{self.max_gap:g}, so {settings} is not certified for estimator={target} on real data; use more "
                     f"betas (raise estimator.num_betas) until the gap is small, which certifies that schedule")
        result.check("bdmc_order", not mean_gap < -3 * se_gap,  # a NaN gap fails bdmc_gap, not this
                     f"bdmc_order: the reverse-AIS (upper) side lies {-mean_gap:.4g} nats below the forward-AIS (lower) "
                     f"side on average, more than 3 standard errors of the per-example gap ({3 * se_gap:.4g}), an "
                     f"inverted sandwich that means a bug or too few runs (raise estimator.{self.runs_name} or "
                     f"estimator.num_simulated)")
        r = lambda x: round(x, 4)  # noqa: E731
        out = {"mean_log_p_upper": r(mean_upper), "stderr_upper": r(se_upper), "bdmc_gap": r(mean_gap),
               "bdmc_gap_stderr": r(se_gap), "bdmc_gap_per_example_q50_q90_max": [r(x) for x in q],
               "max_gap": self.max_gap, "certifies": f"estimator={target} {settings}", "num_betas": self.num_betas,
               "schedule": self.schedule, "num_simulated": self.num_simulated, self.runs_name: self.num_runs,
               "latents": "continuous" if self.continuous(lm) else "binary"}
        s = self.path_settings
        if isinstance(lm, ProtocolModel):
            out["start"] = self.start or lm.default_base()
        if self.continuous(lm):
            out.update({"num_leapfrog": s["num_leapfrog"], "adapt": s["adapt"], "pilot_chains": s["pilot_chains"]})
            if isinstance(lm.obj, ContinuousLatent):
                out["form"] = self.form
        elif isinstance(lm, ProtocolModel):
            out["moves"] = s["moves"]
        for k, parts in accept.items():
            if parts:
                out[k.replace("accept", "accept_rate")] = r(torch.cat(parts).double().mean().item())
        return out
