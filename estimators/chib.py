"""The Chib-style estimator of Murray & Salakhutdinov 2009 (Sec. 3, Fig. 1), unbiased for P(v) at any S.

For a test case v, a special state h* (a sample of Q(h | v), then deterministic hill-climbing in
log P(v, h) to a local mode), S Markov-chain steps and T sequential Gibbs leaving P(h | v) invariant:

    1. s ~ Uniform{1..S}
    2. h^(s) ~ T~(. <- h*)                              (T~: the same single-site updates in reverse order)
    3-4. h^(s') ~ T(. <- h^(s'-1))    for s' = s+1..S
    5-6. h^(s') ~ T~(. <- h^(s'+1))   for s' = s-1 down to 1
    7. P(v) ~= P(v, h*) / [(1/S) sum_{s'} T(h* <- h^(s'))]

with T(h* <- h) = prod_j P(h*_j | h*_{1..j-1}, h_{j+1..M}, v) (Eq. 11), evaluated by one forced sweep from h
(``SequentialGibbs.sweep(force=h_star)``; ``FlipGibbs`` for a user's model). Chains are test cases x runs, each with its own s: all chains
step together, chain c going forward for its first S - s steps and then, restarted at its h^(s), backward,
so no chain waits for another and nothing loops over chains. exp(estimate) is unbiased for P(v) (their
Eq. 15), so log P(v) is under-estimated in expectation.

r = exp(estimate) / P(v) has a heavy right tail: Q(H) r(H) = P(H) (Eq. 14, P the equilibrium chain of Eq. 10), so
the runs with r > c carry P_P(r > c) of E[r] but occur with probability at most P_P(r > c) / c. Most test sets
lack them: their mean of r falls below 1 and its sample standard error is too small. E_Q[min(r, c)] =
E_P[min(1, c / r)], a mean of bounded terms on either side, is the form of Eq. 15 to test against.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.core.ops import log_mean_exp
from nvil.estimators.base import NO_PROGRESS, BatchProgress
from nvil.estimators.model_paths import ContinuousLatent
from nvil.estimators.per_example import LatentModel, PerExample
from nvil.estimators.settings import LOG_Z, LogZSettings
from nvil.mcmc.base import ChibKernel
from nvil.mcmc.flip_gibbs import site_gibbs
from nvil.mcmc.mh import PROPOSALS, MetropolisHastings, adapt_step_size
from nvil.models.protocol import ProtocolModel, follows_protocol, protocol_only


@torch.no_grad()
def chib_log_p(op: ChibKernel, h_star: torch.Tensor, num_steps: int, generator=None, on_step=None,
               s: torch.Tensor | None = None) -> torch.Tensor:
    """log of the Fig. 1 estimate of sum_h f(h) (or its integral), f the target of the transition operator
    ``op``, for each chain: log f(h*) - log p_hat. ``op`` is a ``nvil.mcmc.base.ChibKernel`` whose state is h:
    sequential Gibbs for binary latents, Metropolis-Hastings for continuous ones. ``on_step(info)`` is called
    with each of the S steps' info (progress, acceptance rates). ``s``: each chain's 0-based position of h^(s)
    (step 1), None to draw it uniformly; given, exp(estimate) is unbiased only on average over s (Eq. 14-15)."""
    chains = h_star.shape[0]
    S = num_steps
    if s is None:
        s = torch.randint(0, S, (chains,), generator=generator, device=h_star.device)  # 0-based position of h^(s)
    forward_steps = S - 1 - s  # states after h^(s); the other s states come before it
    on_step = on_step or (lambda info: None)
    h_s, info = op.reverse().step(h_star, 1.0, generator)  # step 2
    log_t = [op.log_transition(h_star, h_s)]
    on_step(info)
    h = h_s
    for t in range(1, S):
        backward = t > forward_steps
        restart = (t == forward_steps + 1)[:, None]
        h = torch.where(restart, h_s, h)  # the backward run starts again from h^(s)
        h, info = op.oriented(backward).step(h, 1.0, generator)
        log_t.append(op.log_transition(h_star, h))
        on_step(info)
    log_p_hat = log_mean_exp(torch.stack(log_t).double(), 0)  # log (1/S) sum T(h* <- h^(s'))
    return op.log_prob(h_star).double() - log_p_hat


class Chib(PerExample):
    """``estimator=chib``: the Chib-style estimate of log P(v) per test case (Murray & Salakhutdinov 2009, Fig. 1).

    ``num_steps`` = S sequential-Gibbs steps around h*, ``num_runs`` independent runs per test case (their P(v)
    estimates averaged), ``hill_climb`` for h* (the module docstring). exp(estimate) is unbiased for P(v) at any S
    (their Eq. 15), so log P(v) is under-estimated in expectation. It serves SBNs, fDARNs, DBNs, DBMs and a user's
    binary-latent model (``LatentModel``); a DBN's or DBM's estimate subtracts the shared log Z of its top machine.
    ``estimate`` is ``PerExample``'s (``nvil.estimators.per_example``); the defaults are
    configs/estimator/chib.yaml's.

    Parameters
    ----------
    num_steps : int, default 40
        S, the sequential-Gibbs steps around h*.
    num_runs : int, default 10
        Independent runs per test case, each with its own s ~ Uniform{1..S}.
    hill_climb : bool, default True
        h* is a Q sample hill-climbed (deterministic argmax sweeps in log P(v, h)) to a local mode; False: the Q
        sample itself.
    max_hill_climb_sweeps : int, default 100
        The most hill-climbing sweeps.
    batch_size : int, default 50
        Test cases per batch (chains = batch_size x num_runs).
    accel : str, default "auto"
        The sweep: auto (in C on a CPU, one Triton kernel on CUDA) | none | native | compile.
    log_z : LogZSettings or Mapping, default LOG_Z
        A DBN's top-RBM (or a DBM's top machine's) log Z (``nvil.estimators.settings.LogZSettings`` or a
        mapping of its fields).

    Raises
    ------
    ConfigError
        (``nvil.core.errors``) If a setting is out of range, in one line naming ``estimator.KEY``.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import SBN, LayeredInference
    >>> from nvil.estimators import Chib, Exact
    >>> sbn, q = SBN(6, [3]), LayeredInference(6, [3])
    >>> x = (torch.rand(5, 6) < 0.5).float()
    >>> result = Chib(num_steps=5, num_runs=3).estimate(sbn, x, inference=q)
    >>> result.log_p.shape, result.run_log_p.shape, result.extras
    (torch.Size([5]), torch.Size([3, 5]), {'num_steps': 5, 'hill_climb': True})
    >>> bool((result.log_p - Exact().estimate(sbn, x).log_p).abs().max() < 0.1)
    True
    """

    name = "chib"
    serves_protocol = True  # a user's binary-latent model too (``LatentModel``)

    def __init__(self, *, num_steps: int = 40, num_runs: int = 10, hill_climb: bool = True,
                 max_hill_climb_sweeps: int = 100, batch_size: int = 50, accel: str = "auto",
                 log_z: LogZSettings | Mapping = LOG_Z) -> None:
        super().__init__(num_runs=num_runs, batch_size=batch_size, accel=accel, log_z=log_z)
        self.num_steps = positive_int(num_steps, "estimator.num_steps")
        self.max_climb = positive_int(max_hill_climb_sweeps, "estimator.max_hill_climb_sweeps")
        self.hill_climb = bool(hill_climb)
        self.climb_sweeps = 10  # the last batch's hill-climb sweeps (progress only); about 6 on an MNIST SBN-200

    def settings(self) -> dict:
        """The settings the result's JSON line records.

        Returns
        -------
        dict
            ``{"num_steps": ..., "hill_climb": ...}``.
        """
        return {"num_steps": self.num_steps, "hill_climb": self.hill_climb}

    def run_batch(self, lm: LatentModel, x: torch.Tensor, generator,
                  progress: BatchProgress = NO_PROGRESS) -> torch.Tensor:
        """The Fig. 1 estimate of log P*(v) for each chain: h* from Q (hill-climbed), then S steps of sequential Gibbs.

        Progress in sweeps: each of the S steps is two (the move and the forced sweep of T(h* <- h)). The
        hill-climb's length is known only when it stops: it is planned at the previous batch's (``climb_sweeps``),
        and a longer one moves the bar on by less with each sweep rather than stalling it.

        Parameters
        ----------
        lm : LatentModel
            (``nvil.estimators.latent_model``) the model's latent units, log P*(v, h) and Q(h | v).
        x : torch.Tensor
            ``(chains, n_visible)`` rows, each test case repeated once per run (example-major).
        generator : torch.Generator
            The batch's generator, seeded by (seed, first row): the draw of Q, each chain's s and the sweeps.
        progress : BatchProgress, default NO_PROGRESS
            (``nvil.estimators.base``) the batch's share of the progress bar, in sweeps.

        Returns
        -------
        torch.Tensor
            ``(chains,)`` float64 estimates log P*(v, h*) - log p_hat, p_hat = (1/S) sum_s T(h* <- h^(s)); a DBN's
            log Z is subtracted afterwards (``PerExample``).
        """
        gibbs = site_gibbs([(1.0, lm.joint(x))], self.accel)
        h_star = lm.sample_q(x, generator)
        later = 2 * self.num_steps
        if self.hill_climb:
            expected = min(self.max_climb, self.climb_sweeps)
            progress.plan(expected + later)

            def climbed(sweep: int) -> None:
                progress.plan(max(expected, sweep + 1) + later)
                progress.advance()

            h_star, self.climb_sweeps = gibbs.hill_climb(h_star, self.max_climb, on_sweep=climbed)
            progress.plan(self.climb_sweeps + later)
        else:
            progress.plan(later)
        return chib_log_p(gibbs, h_star, self.num_steps, generator, on_step=lambda info: progress.advance(2))


def climb_to_mode(log_f, h: torch.Tensor, steps: int, lr: float, on_step=None) -> torch.Tensor:
    """Deterministic hill-climbing in log f from h for every chain at once: ``steps`` Adam steps on
    -sum_chains log f (each chain's gradient is its own), the continuous counterpart of the argmax sweeps.
    ``on_step()`` after each (progress)."""
    h = h.detach().clone().requires_grad_(True)
    opt = torch.optim.Adam([h], lr=lr)
    with torch.enable_grad():
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            (-log_f(h).sum()).backward()
            opt.step()
            if on_step is not None:
                on_step()
    return h.detach()


# Default acceptance targets for the step-size warm-up. Not the mixing optima (0.574 for MALA, Roberts & Rosenthal
# 1998; 0.234 for the random walk, Roberts, Gelman & Gilks 1997): a run whose first move away from h* is rejected
# estimates p(x) = 0 and the others are inflated by 1 / a(h*), so a run's relative variance is at least
# (1 - a) / a, and with R runs an example is -inf with probability about (1 - a)^R. Measured on linear-Gaussian
# nets (posterior SDs 0.5-1, S = 40, 10 runs): at 0.57 / 0.234, 52-57% / 86-93% of runs were 0 and up to 13 of 40
# examples had every run 0; Langevin at 0.8 gave 10-19% zero runs and the smallest relative variance of the
# run estimates (0.33-0.40, against 1.1-1.5 at 0.57); the random walk did best at 0.5 (above it, mixing suffers).
CHIB_TARGET_ACCEPT = {"langevin": 0.8, "random_walk": 0.5}



class ChibMH(PerExample):
    """``estimator=chib_mh``: the Fig. 1 construction for continuous latents, with Metropolis-Hastings transitions.

    Murray & Salakhutdinov 2009, appendix: ``proposal=langevin`` (HMC with one leapfrog step) or
    ``random_walk``. h* is a prior sample hill-climbed to a local mode of log p(x, s) (``hill_climb_steps`` Adam
    steps at ``hill_climb_lr``, ``climb_to_mode``). It serves the Gaussian nets (in the sampler's ``form``,
    ``nvil.estimators.model_paths.ContinuousLatent``) and a user's continuous-latent model with ``sample_prior``.
    ``estimate`` is ``PerExample``'s (``nvil.estimators.per_example``); the defaults are
    configs/estimator/chib_mh.yaml's.

    Step size. With ``adapt=true`` (default) each chain (example x run) first runs ``adapt_steps`` MH
    transitions of its own from h*, a warm-up whose states are discarded, in which dual averaging (Hoffman &
    Gelman 2014, Alg. 5) moves its step size from ``step_size`` towards an acceptance rate of ``target_accept``
    (default 0.8 for Langevin, 0.5 for the random walk: higher than the mixing optima because a rejection at h*
    zeroes the run; see ``CHIB_TARGET_ACCEPT``).
    The averaged step size is then FIXED for the S transitions of Fig. 1, so every transition there is one
    fixed MH kernel, reversible with respect to p(s | x). Fig. 1 is unbiased for p(x) for any h* and any such
    kernel chosen before its own random numbers are drawn (their Eq. 15 holds conditionally on (h*, eps)), so
    exp(estimate) stays unbiased for p(x). Adaptation matters for the variance, hence for the bias of the log:
    a step much smaller than the posterior's scale makes T(h* <- h^(s)) vanish except for rare h^(s) near h*
    (log p(x) far too low), a much larger one rejects the step away from h* (the run estimates 0). With
    ``adapt=false`` ``step_size`` is used as given.

    A run whose reverse step from h* is rejected (h^(s) = h*) meets T's point mass and estimates p(x) = 0
    (unbiased, the appendix's caveat). ``zero_runs`` counts such runs, ``zero_run_examples`` the examples all
    of whose runs are 0 (their log p(x) is -inf); ``zero_example_mask`` keeps, per batch, which examples.
    ``step_sizes``, ``accept`` and ``adapt_accept`` keep, per batch, each chain's fixed step size and mean
    acceptance probabilities in Fig. 1 and in the warm-up (summarised in ``settings``).

    Parameters
    ----------
    num_steps : int, default 40
        S, the MH transitions of Fig. 1 around h*.
    num_runs : int, default 10
        Independent runs per example.
    proposal : str, default "langevin"
        ``langevin`` (HMC with one leapfrog step) | ``random_walk``.
    step_size : float, default 0.1
        The warm-up's initial per-chain step size (``adapt``), or the step size itself.
    adapt : bool, default True
        Tune each chain's step size in a warm-up run from h*, then fix it for the S transitions.
    adapt_steps : int, default 100
        MH transitions of the warm-up.
    target_accept : float or None, default None
        The warm-up's target acceptance rate, in (0, 1); None gives 0.8 for langevin, 0.5 for random_walk
        (``CHIB_TARGET_ACCEPT``).
    hill_climb_steps : int, default 200
        Adam steps that take a prior sample to h*.
    hill_climb_lr : float, default 0.05
        Their learning rate.
    form : str, default "auxiliary"
        The Gaussian nets' parameterisation the chains move in: ``auxiliary`` (eps) | ``centred`` (z).
    batch_size : int, default 100
        Examples per batch (chains = batch_size x num_runs).

    Raises
    ------
    ConfigError
        (``nvil.core.errors``) If ``proposal`` is not one of ``PROPOSALS`` (``nvil.mcmc.mh``), ``target_accept``
        is not in (0, 1), or another setting is out of range, in one line naming ``estimator.KEY``.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import GaussianBeliefNet
    >>> from nvil.estimators import ChibMH
    >>> gbn = GaussianBeliefNet(6, [2])
    >>> x = (torch.rand(4, 6) < 0.5).float()
    >>> chib = ChibMH(num_steps=5, num_runs=2, adapt_steps=10, hill_climb_steps=10)
    >>> result = chib.estimate(gbn, x)
    >>> result.log_p.shape, result.extras["proposal"], result.extras["target_accept"]
    (torch.Size([4]), 'langevin', 0.8)
    >>> chib.zero_run_examples == result.extras["zero_run_examples"]
    True
    >>> ChibMH(proposal="nuts")
    Traceback (most recent call last):
        ...
    nvil.core.errors.ConfigError: estimator.proposal must be one of ['langevin', 'random_walk'], got 'nuts'
    """

    name = "chib_mh"

    def __init__(self, *, num_steps: int = 40, num_runs: int = 10, proposal: str = "langevin", step_size: float = 0.1,
                 adapt: bool = True, adapt_steps: int = 100, target_accept: float | None = None,
                 hill_climb_steps: int = 200, hill_climb_lr: float = 0.05, form: str = "auxiliary",
                 batch_size: int = 100) -> None:
        super().__init__(num_runs=num_runs, batch_size=batch_size)
        self.num_steps = positive_int(num_steps, "estimator.num_steps")
        self.step_size = positive_float(step_size, "estimator.step_size")
        self.proposal = proposal
        if self.proposal not in PROPOSALS:
            raise ConfigError(f"estimator.proposal must be one of {list(PROPOSALS)}, got {self.proposal!r}")
        self.adapt = bool(adapt)
        self.adapt_steps = positive_int(adapt_steps, "estimator.adapt_steps")
        self.target_accept = (CHIB_TARGET_ACCEPT[self.proposal] if target_accept is None
                              else positive_float(target_accept, "estimator.target_accept"))
        if not self.target_accept < 1:
            raise ConfigError(f"estimator.target_accept must be in (0, 1), got {self.target_accept}")
        self.climb_steps = positive_int(hill_climb_steps, "estimator.hill_climb_steps")
        self.climb_lr = positive_float(hill_climb_lr, "estimator.hill_climb_lr")
        self.form = form
        self.zero_runs = 0
        self.zero_example_mask: list[torch.Tensor] = []  # per batch: [examples] bool, every run estimated 0
        self.step_sizes: list[torch.Tensor] = []  # per batch: [chains], the fixed step of the Fig. 1 run
        self.accept: list[torch.Tensor] = []  # per batch: [chains], mean acceptance probability in Fig. 1
        self.adapt_accept: list[torch.Tensor] = []  # per batch: [chains], mean acceptance in the warm-up

    serves_protocol = True  # a user's continuous-latent model too: its own log p(x, z) and sample_prior

    def latent_model(self, model, inference):
        """What ``run_batch`` works with: a user's model through the protocol, or a Gaussian net in ``form``.

        Parameters
        ----------
        model : nn.Module or object
            A Gaussian net (``model=gbn`` or ``dbn_dynamic``) or a user's model that follows the protocol with
            continuous latents and ``sample_prior(n, generator)``.
        inference : nn.Module or None
            Not used.

        Returns
        -------
        ProtocolModel or ContinuousLatent
            (``nvil.models.protocol``, ``nvil.estimators.model_paths``) with ``log_joint(x, s)`` and
            ``sample_prior(n, generator)``.

        Raises
        ------
        ConfigError
            (``nvil.core.errors``) If a user's model has binary latents or no ``sample_prior``, or a built-in model
            has no continuous latents, or ``form`` is unknown.
        """
        if protocol_only(model) and follows_protocol(model):
            pm = ProtocolModel(model)
            if pm.binary:
                raise ConfigError("estimator=chib_mh moves continuous latents; this model's are binary "
                                  "(Latent.binary): use estimator=chib, ais_posterior or exact")
            if not callable(getattr(model, "sample_prior", None)):
                raise ConfigError("estimator=chib_mh climbs to h* from a prior draw: define sample_prior(n, generator) "
                                  "on the model")
            return pm
        return ContinuousLatent(model, self.name, self.form)

    @property
    def zero_run_examples(self) -> int:
        """The examples, over all batches so far, every one of whose runs estimated p(x) = 0 (log p(x) = -inf)."""
        return int(sum(int(m.sum()) for m in self.zero_example_mask))

    def settings(self) -> dict:
        """The settings and the run's diagnostics that the result's JSON line records.

        Returns
        -------
        dict
            ``num_steps``, ``proposal``, ``step_size``, ``form``, ``adapt``, ``zero_runs``, ``zero_run_examples``;
            with ``adapt``, ``adapt_steps`` and ``target_accept``; after a batch, ``accept_rate`` (mean acceptance
            probability in Fig. 1), ``step_size_q10_q50_q90`` (quantiles of the chains' fixed step sizes) and,
            with ``adapt``, ``adapt_accept_rate`` (the warm-up's).
        """
        out = {"num_steps": self.num_steps, "proposal": self.proposal, "step_size": self.step_size, "form": self.form,
               "adapt": self.adapt, "zero_runs": self.zero_runs, "zero_run_examples": self.zero_run_examples}
        if self.adapt:
            out.update({"adapt_steps": self.adapt_steps, "target_accept": self.target_accept})
        if self.step_sizes:
            steps = torch.cat(self.step_sizes).double()
            q = torch.quantile(steps, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
            out.update({"accept_rate": round(torch.cat(self.accept).double().mean().item(), 4),
                        "step_size_q10_q50_q90": [round(v, 5) for v in q]})
            if self.adapt:
                out["adapt_accept_rate"] = round(torch.cat(self.adapt_accept).double().mean().item(), 4)
        return out

    def run_batch(self, lm, x: torch.Tensor, generator, progress: BatchProgress = NO_PROGRESS) -> torch.Tensor:
        """The Fig. 1 estimate of log p(x) per chain: climb to h*, adapt the step size, then S fixed MH transitions.

        Records the batch's zero runs, step sizes and acceptance rates on the estimator (the class docstring).
        Progress: one unit per gradient evaluation, about what each climb step, warm-up transition and Fig. 1
        step costs (a Fig. 1 step is a transition and its T(h* <- h), counted as two).

        Parameters
        ----------
        lm : ProtocolModel or ContinuousLatent
            What ``latent_model`` returned: ``log_joint(x, s)`` and ``sample_prior(n, generator)``.
        x : torch.Tensor
            ``(chains, ...)`` rows, each example repeated once per run (example-major).
        generator : torch.Generator
            The batch's generator, seeded by (seed, first row): the prior draw, the warm-up, each chain's s and the
            transitions.
        progress : BatchProgress, default NO_PROGRESS
            (``nvil.estimators.base``) the batch's share of the progress bar.

        Returns
        -------
        torch.Tensor
            ``(chains,)`` float64 estimates log p(x, h*) - log p_hat; -inf for a run that estimated p(x) = 0.
        """
        progress.plan(self.climb_steps + (self.adapt_steps if self.adapt else 0) + 2 * self.num_steps)
        log_f = lambda s: lm.log_joint(x, s)  # noqa: E731
        h_star = climb_to_mode(log_f, lm.sample_prior(x.shape[0], generator), self.climb_steps, self.climb_lr,
                               on_step=progress.advance)
        step = torch.full((x.shape[0],), self.step_size, dtype=h_star.dtype, device=h_star.device)
        if self.adapt:  # a separate warm-up run from h*; its states are discarded, only the step sizes are kept
            step, warm_accept = adapt_step_size(log_f, h_star, step, self.target_accept, self.proposal,
                                                self.adapt_steps, generator)
            self.adapt_accept.append(warm_accept.cpu())
            progress.advance(self.adapt_steps)
        op = MetropolisHastings(log_f, step, self.proposal)  # a fixed kernel from here on
        accept_sum = torch.zeros_like(step)

        def counted(info: dict) -> None:  # each chain's acceptance probabilities over the S transitions
            accept_sum.add_(torch.nan_to_num(info["accept_prob"], nan=0.0))
            progress.advance(2)

        log_p = chib_log_p(op, h_star, self.num_steps, generator, on_step=counted)
        zero = torch.isneginf(log_p)
        self.zero_runs += int(zero.sum())
        self.zero_example_mask.append(zero.view(-1, self.num_runs).all(1).cpu())
        self.step_sizes.append(step.cpu())
        self.accept.append((accept_sum / self.num_steps).cpu())
        return log_p
