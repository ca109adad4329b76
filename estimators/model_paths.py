"""AIS paths over the latent variable of a user's model (``nvil.models.protocol``), one chain per row of x:

    log f_beta(z) = (1 - beta) log f_0(z) + beta log p(x, z),

from the normalised base f_0 (the prior p(z), or the proposal q(z | x)) at beta = 0 to the unnormalised posterior
p(x, z) at beta = 1, whose normaliser is p(x) (Neal 2001; with the prior as f_0 this is p(z) p(x | z)^beta, the path
of Wu et al. 2017). The moves leave each f_beta invariant:

- continuous z: one HMC transition (Neal 2011, Sec. 5.3.2), gradients by autograd through the user's code (or,
  from the prior, the model's own closed-form gradient where it declares ``closed_form_gradient``: the Gaussian
  nets), with a step size per chain and beta. They come from a pilot run (``pilot_steps``): chains of their own whose step size is
  multiplied by 1.02 or 0.98 after each move towards an acceptance of ``target_accept`` (Wu et al. 2017, Sec. 5),
  the geometric mean over each example's pilot chains then fixed for that example's chains at that beta. A step size
  adapted on the chain it moves depends on the state the move starts from, and the weights lose their
  unbiasedness (on a linear-Gaussian model, E[w] / p(x) = 1.09 +- 0.01 at 1,000 betas); fixed in advance, every
  move is a kernel leaving f_beta invariant, chosen independently of the chain, in either direction;
- binary z: ``gibbs``, a systematic scan of single-site heat-bath updates, P(flip) = sigmoid(log f(z') - log f(z))
  with z' the state with that unit flipped; or ``mh``, ``num_moves`` Metropolis proposals per beta, each flipping
  ``num_flips`` units chosen at random per chain, accepted with min(1, f(z') / f(z)). Both use only differences
  of log f, so the user's model needs no conditional of its own.

Every step evaluates the user's functions once per site (gibbs), move (mh) or leapfrog step (HMC) on all chains
at once.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from nvil.backend.accel import accelerate, check_mode, compiled
from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.estimators.annealing import ais, pilot_step_sizes
from nvil.mcmc.adapt import multiplicative_adapt
from nvil.mcmc.hmc import HMC
from nvil.models.gaussian import FORMS
from nvil.models.protocol import (
    CLOSED_FORM_GRADIENT,
    CONTINUOUS_LATENTS,
    Latent,
    PriorBase,
    ProtocolModel,
    capable,
)

BINARY_MOVES = ("gibbs", "mh")


class ModelState(NamedTuple):
    z: torch.Tensor           # [chains, D]
    log_base: torch.Tensor    # log f_0(z)
    log_joint: torch.Tensor   # log p(x, z)
    step_size: torch.Tensor   # [chains] (HMC; unused for binary z)
    accept_sum: torch.Tensor  # [chains], the acceptance probabilities summed over the moves so far

    @property
    def position(self) -> torch.Tensor:  # the name the HMC paths use
        return self.z


class ModelPath:
    """The AIS path log f_beta(z) = (1 - beta) log f_0(z) + beta log p(x, z) for the chains of one batch.

    One chain per row of ``x``, from the normalised base f_0 (the prior or the proposal) at beta = 0 to the
    unnormalised posterior p(x, z) at beta = 1 (the module docstring). ``transition`` leaves f_beta invariant: one
    HMC transition for continuous z (``hmc``), a Gibbs scan (``gibbs``) or ``num_moves`` Metropolis flips (``mh``)
    for binary z. The path is what ``nvil.estimators.annealing.ais`` walks, in either direction: it has
    ``log_f``, ``log_ratio`` and ``transition``, and ``start`` draws the chains from f_0.

    HMC's target: with the prior as base, f_beta(z) = p(z) p(x | z)^beta, and a model that declares
    ``closed_form_gradient`` gives it with its gradient (``model.posterior(x).tempered(beta)``); otherwise
    log f_beta by autograd, compiled once per path where ``accel`` (``nvil.backend.accel``) says, beta a tensor
    argument so that a new beta is not a new graph.

    Parameters
    ----------
    model : ProtocolModel
        (``nvil.models.protocol``) the checked model whose ``log_joint(x, z)`` is log p(x, z).
    x : torch.Tensor
        ``(chains, ...)`` rows of data, one per chain.
    base : BaseDensity
        (``nvil.models.protocol``) f_0 over those rows: ``model.base("prior" | "proposal", x)``.
    num_leapfrog : int, default 10
        Leapfrog steps per HMC transition (continuous z).
    target_accept : float, default 0.65
        The acceptance rate the adapted HMC step sizes aim for (Wu et al. 2017, Sec. 5).
    adapt : bool, default True
        Without ``steps``: multiply each chain's own step size by 1.02 or 0.98 after each move towards
        ``target_accept`` (the pilot run itself; ``pilot_steps``).
    max_step_size : float or None, default 10.0
        Upper clamp of the adapted step size; None: no clamp.
    moves : str, default "gibbs"
        Binary z: ``gibbs`` (a systematic scan of heat-bath flips) | ``mh`` (Metropolis proposals).
    num_moves : int or None, default None
        Metropolis proposals per beta for ``moves="mh"``; None: the number of latent units D.
    num_flips : int, default 1
        Units flipped by each Metropolis proposal, chosen at random per chain.
    steps : dict or None, default None
        beta -> ``(chains,)`` HMC step sizes fixed in advance (``pilot_steps``); None: each chain's own, adapted
        after each move where ``adapt``.
    accel : str, default "none"
        How log f_beta is evaluated for autograd HMC (``nvil.backend.accel``: none | compile | ...); a compiled
        path does not use a closed-form gradient.

    Raises
    ------
    ConfigError
        (``nvil.core.errors``) If ``moves`` is not ``gibbs`` or ``mh``, or ``accel`` is not a mode.

    Examples
    --------
    A user's model with three binary latent units, uniform prior, annealed by AIS from the prior:

    >>> import math
    >>> import types
    >>> import torch
    >>> import torch.nn.functional as F
    >>> import nvil
    >>> from nvil.estimators.annealing import ais
    >>> from nvil.estimators.model_paths import ModelPath
    >>> from nvil.models.protocol import ProtocolModel
    >>> W = torch.randn(6, 3)
    >>> user = types.SimpleNamespace(
    ...     latent=nvil.Latent.binary(3),
    ...     log_prior=lambda z: torch.full(z.shape[:1], -3 * math.log(2)),
    ...     sample_prior=lambda n, g: torch.randint(0, 2, (n, 3), generator=g).float(),
    ...     log_likelihood=lambda x, z: -F.binary_cross_entropy_with_logits(z @ W.T, x, reduction="none").sum(-1))
    >>> pm = ProtocolModel(user)
    >>> x = (torch.rand(4, 6) < 0.5).float()
    >>> g = torch.Generator().manual_seed(0)
    >>> path = ModelPath(pm, x, pm.base("prior", x))
    >>> state = path.start(g, 0.1)
    >>> state.z.shape, path.transition(state, 0.5, g).z.shape
    (torch.Size([4, 3]), torch.Size([4, 3]))
    >>> log_w, end = ais(path, state, torch.linspace(0, 1, 11, dtype=torch.float64), g)
    >>> log_w.shape, log_w.dtype
    (torch.Size([4]), torch.float64)

    A continuous latent (a VAE) moves by HMC:

    >>> from nvil.models import VAE
    >>> vae = ProtocolModel(VAE(6, [2], [[4]]))
    >>> hmc_path = ModelPath(vae, x, vae.base("prior", x), num_leapfrog=3)
    >>> hmc_path.transition(hmc_path.start(g, 0.1), 0.5, g).step_size.shape
    torch.Size([4])
    """

    def __init__(self, model, x, base, *, num_leapfrog: int = 10, target_accept: float = 0.65, adapt: bool = True,
                 max_step_size: float | None = 10.0, moves: str = "gibbs", num_moves: int | None = None,
                 num_flips: int = 1, steps: dict | None = None, accel: str = "none") -> None:
        if moves not in BINARY_MOVES:
            raise ConfigError(f"moves must be one of {list(BINARY_MOVES)}, got {moves!r}")
        self.model, self.x, self.base = model, x, base
        self.num_leapfrog, self.target_accept, self.adapt = num_leapfrog, target_accept, adapt
        self.max_step_size = max_step_size
        self.moves, self.num_flips = moves, num_flips
        self.num_moves = model.n_latent if num_moves is None else num_moves
        self.steps = steps
        self._log_f_beta = accelerate(self._log_density, accel, x.device, "estimator.accel")
        self._closed = None
        if (not model.binary and isinstance(base, PriorBase) and capable(model.obj, CLOSED_FORM_GRADIENT)
                and not compiled(accel)):
            self._closed = model.obj.posterior(x)

    def _log_density(self, z: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        return (1 - beta) * self.base.log_prob(z) + beta * self.model.log_joint(self.x, z)

    def start(self, generator, step_size: float) -> ModelState:
        """An exact draw of f_0 per chain, each with ``step_size``.

        Parameters
        ----------
        generator : torch.Generator or None
            Source of randomness for the draw.
        step_size : float
            Every chain's initial HMC step size (unused for binary z, and where the base gives its own
            ``unit_step``, as ``LaplaceBase`` does with its mass matrix).

        Returns
        -------
        ModelState
            The chains at beta = 0, with their log f_0 and log p(x, z) and no acceptances yet.
        """
        z = self.base.sample(1, generator)[0]
        unit = getattr(self.base, "unit_step", None)  # a base scaled to the posterior gives its own (LaplaceBase)
        steps = unit.clone() if unit is not None else torch.full((z.shape[0],), float(step_size), device=z.device)
        return self.state(z, steps)

    def state(self, z: torch.Tensor, step_size: torch.Tensor | None = None,
              accept_sum: torch.Tensor | None = None) -> ModelState:
        """The state of chains at ``z``, with log f_0(z) and log p(x, z) evaluated once.

        Parameters
        ----------
        z : torch.Tensor
            ``(chains, D)`` latent values, one row per row of ``x``.
        step_size : torch.Tensor or None, default None
            ``(chains,)`` HMC step sizes; None: zeros.
        accept_sum : torch.Tensor or None, default None
            ``(chains,)`` acceptance probabilities summed over the moves so far; None: zeros.

        Returns
        -------
        ModelState
            ``(z, log_base, log_joint, step_size, accept_sum)``.
        """
        n = z.shape[0]
        zeros = torch.zeros(n, device=z.device, dtype=z.dtype if z.is_floating_point() else torch.float32)
        return ModelState(z, self.base.log_prob(z), self.model.log_joint(self.x, z),
                          zeros if step_size is None else step_size, zeros if accept_sum is None else accept_sum)

    def log_f(self, state: ModelState, beta: float) -> torch.Tensor:
        """log f_beta(z) = (1 - beta) log f_0(z) + beta log p(x, z) of each chain, from the state's stored terms.

        Parameters
        ----------
        state : ModelState
            The chains' state: ``z`` ``(chains, D)``, ``log_base`` = log f_0(z), ``log_joint`` = log p(x, z),
            ``step_size`` and ``accept_sum`` ``(chains,)``.
        beta : float
            The inverse temperature, in [0, 1].

        Returns
        -------
        torch.Tensor
            ``(chains,)`` log f_beta(z), in the state's dtype.
        """
        return (1 - beta) * state.log_base + beta * state.log_joint

    def log_ratio(self, state: ModelState, beta_prev: float, beta: float) -> torch.Tensor:
        """The AIS weight increment log f_beta - log f_beta_prev = (beta - beta_prev) (log p(x, z) - log f_0(z)).

        Parameters
        ----------
        state : ModelState
            The chains' state: ``z`` ``(chains, D)``, ``log_base`` = log f_0(z), ``log_joint`` = log p(x, z),
            ``step_size`` and ``accept_sum`` ``(chains,)``.
        beta_prev : float
            The previous inverse temperature.
        beta : float
            The next one.

        Returns
        -------
        torch.Tensor
            ``(chains,)`` float64 increments.
        """
        return (beta - beta_prev) * (state.log_joint.double() - state.log_base.double())

    def transition(self, state: ModelState, beta: float, generator=None) -> ModelState:
        """One move of every chain that leaves f_beta invariant: ``gibbs`` or ``mh`` for binary z, ``hmc`` otherwise.

        Parameters
        ----------
        state : ModelState
            The chains' state: ``z`` ``(chains, D)``, ``log_base`` = log f_0(z), ``log_joint`` = log p(x, z),
            ``step_size`` and ``accept_sum`` ``(chains,)``.
        beta : float
            The inverse temperature of the target f_beta.
        generator : torch.Generator or None, default None
            Source of randomness for the move.

        Returns
        -------
        ModelState
            The chains after the move.
        """
        if self.model.binary:
            return self.gibbs(state, beta, generator) if self.moves == "gibbs" else self.mh(state, beta, generator)
        return self.hmc(state, beta, generator)

    # ---- continuous z ------------------------------------------------------------------------------------------

    def hmc(self, state: ModelState, beta: float, generator) -> ModelState:
        """One HMC transition (Neal 2011, Sec. 5.3.2) of ``num_leapfrog`` leapfrog steps at each chain's step size.

        The step size is ``steps[beta]`` where the path has fixed ones, else the state's own, adapted after the move
        (1.02 or 0.98 towards ``target_accept``, at most ``max_step_size``) where ``adapt``.

        Parameters
        ----------
        state : ModelState
            The chains' state: ``z`` ``(chains, D)``, ``log_base`` = log f_0(z), ``log_joint`` = log p(x, z),
            ``step_size`` and ``accept_sum`` ``(chains,)``.
        beta : float
            The inverse temperature of the target f_beta; with ``steps``, one of its keys.
        generator : torch.Generator or None
            Source of randomness for the momenta and the accept step.

        Returns
        -------
        ModelState
            The chains after the transition, with the step sizes used (or adapted) and this move's acceptance
            probabilities added to ``accept_sum``.
        """
        beta_t = torch.tensor(beta, dtype=state.z.dtype, device=state.z.device)
        if self._closed is not None:
            target = self._closed.tempered(beta_t)
        else:
            target = lambda z: self._log_f_beta(z, beta_t)  # noqa: E731
        kernel = HMC(target, self.num_leapfrog, inv_mass=getattr(self.base, "inv_mass", None))
        step = state.step_size if self.steps is None else self.steps[beta]
        new, info = kernel.step(kernel.init(state.z), generator=generator, step_size=step)
        if self.steps is None and self.adapt:
            step = multiplicative_adapt(step, info.accept_prob, self.target_accept, max_step=self.max_step_size)
        return self.state(new.position, step, state.accept_sum + info.accept_prob)

    # ---- binary z ----------------------------------------------------------------------------------------------

    def _propose(self, state: ModelState, z_new: torch.Tensor, beta: float, accept_prob, generator) -> ModelState:
        proposal = self.state(z_new, state.step_size)
        delta = (self.log_f(proposal, beta) - self.log_f(state, beta)).double()
        p = accept_prob(delta).nan_to_num(0.0)
        u = torch.rand(p.shape, generator=generator, device=p.device, dtype=p.dtype)
        keep = u < p
        pick = lambda new, old: torch.where(keep.view(-1, *[1] * (new.dim() - 1)), new, old)  # noqa: E731
        return ModelState(pick(z_new, state.z), pick(proposal.log_base, state.log_base),
                          pick(proposal.log_joint, state.log_joint), state.step_size,
                          state.accept_sum + p.to(state.accept_sum.dtype))

    def gibbs(self, state: ModelState, beta: float, generator) -> ModelState:
        """One systematic scan: unit i set to its other value with the heat-bath probability sigmoid(delta).

        delta = log f_beta(z') - log f_beta(z), z' the state with unit i flipped; the user's model needs no
        conditional of its own.

        Parameters
        ----------
        state : ModelState
            The chains' state: ``z`` ``(chains, D)``, ``log_base`` = log f_0(z), ``log_joint`` = log p(x, z),
            ``step_size`` and ``accept_sum`` ``(chains,)``.
        beta : float
            The inverse temperature of the target f_beta.
        generator : torch.Generator or None
            Source of the uniforms of each flip.

        Returns
        -------
        ModelState
            The chains after the scan; ``accept_sum`` grows by the scan's mean flip probability.
        """
        d = state.z.shape[1]
        accept = state.accept_sum
        for i in range(d):
            z_new = state.z.clone()
            z_new[:, i] = 1 - z_new[:, i]
            state = self._propose(state, z_new, beta, torch.sigmoid, generator)
        return state._replace(accept_sum=accept + (state.accept_sum - accept) / d)

    def mh(self, state: ModelState, beta: float, generator) -> ModelState:
        """``num_moves`` Metropolis proposals, each flipping ``num_flips`` distinct units chosen per chain.

        Each is accepted with min(1, f_beta(z') / f_beta(z)).

        Parameters
        ----------
        state : ModelState
            The chains' state: ``z`` ``(chains, D)``, ``log_base`` = log f_0(z), ``log_joint`` = log p(x, z),
            ``step_size`` and ``accept_sum`` ``(chains,)``.
        beta : float
            The inverse temperature of the target f_beta.
        generator : torch.Generator or None
            Source of the units chosen and of the accept steps.

        Returns
        -------
        ModelState
            The chains after the proposals; ``accept_sum`` grows by their mean acceptance probability.
        """
        n, d = state.z.shape
        accept = state.accept_sum
        metropolis = lambda delta: delta.clamp(max=0.0).exp()  # noqa: E731
        for _ in range(self.num_moves):
            keys = torch.rand(n, d, generator=generator, device=state.z.device)
            sites = keys.topk(self.num_flips, dim=1).indices
            flip = torch.zeros_like(state.z).scatter_(1, sites, 1.0)
            state = self._propose(state, (state.z + flip) % 2, beta, metropolis, generator)
        return state._replace(accept_sum=accept + (state.accept_sum - accept) / self.num_moves)


def pilot_steps(model, x, base_kind: str, betas: torch.Tensor, pilot_chains: int, step_size: float, chains: int,
                generator, on_step=None, **settings) -> dict:
    """beta -> [examples x ``chains``] step sizes for the rows of ``x`` (one per example): a pilot AIS run of
    ``pilot_chains`` chains per example adapting its own step sizes from ``step_size`` (Wu et al. 2017, Sec. 5),
    each example's geometric mean over its pilot chains at each beta, repeated for its ``chains`` chains
    (example-major). Its chains are then thrown away. ``on_step(k, increment)``: each of the pilot's steps."""
    xp = x.repeat_interleave(pilot_chains, 0)
    path = ModelPath(model, xp, model.base(base_kind, xp), **{**settings, "adapt": True})
    return pilot_step_sizes(path, path.start(generator, step_size), betas, pilot_chains, chains, generator, on_step)


# ---- the Gaussian nets in a sampler's form, on this path ------------------------------------------------------

CONTINUOUS_HINT = "model=gbn or dbn_dynamic"
# Upper clamp of the adapted step size: large enough not to bind (in auxiliary form the posterior's scale is at
# most the prior's, 1), only a guard against runaway growth where a direction is flat.
MAX_STEP_SIZE = 10.0


class ContinuousLatent:
    """A Gaussian net in the sampler's ``form``, as the model protocol sees it (``nvil.models.protocol``): its
    densities, draws and closed-form gradient in that form, so the one AIS path (``ModelPath``) runs on it."""

    needs_log_z = False  # the prior is normalised: exp(log w) estimates p(x) itself
    default_start = "prior"  # estimator=ais_hmc anneals from the prior (Wu et al. 2017), and BDMC certifies that run

    def __init__(self, model, estimator: str, form: str) -> None:
        if not capable(model, CONTINUOUS_LATENTS):
            raise ConfigError(f"estimator={estimator} integrates over continuous latent variables ({CONTINUOUS_HINT}); "
                              f"this checkpoint holds a {type(model).__name__}: use chib, ais_posterior, harmonic or "
                              "iwae for binary latents, ais or raise for Boltzmann machines")
        if form not in FORMS:
            raise ConfigError(f"estimator.form must be one of {list(FORMS)}, got {form!r}")
        self.model, self.form = model, form
        self.latent = Latent.continuous(model.n_latent)
        self.capabilities = model.capabilities

    def log_prior(self, state):
        return self.model.log_prior(state, self.form)

    def log_likelihood(self, x, state):
        return self.model.log_likelihood(x, state, self.form)

    def log_joint(self, x, state):
        return self.model.log_joint(x, state, self.form)

    def posterior(self, x):
        """log p(s) + log p(x | s) with its closed-form gradient (``GaussianNet.posterior``); ``tempered(beta)``."""
        return self.model.posterior(x, self.form)

    def sample_prior(self, n: int, generator, device=None):
        return self.model.sample_prior(n, generator, device or generator.device, self.form)

    def sample_likelihood(self, state, generator):
        if self.form != self.model.form:
            state = self.model.to_centred(state) if self.form == "auxiliary" else self.model.to_auxiliary(state)
        return self.model.sample_likelihood(state, generator)


def path_settings(*, num_leapfrog: int, step_size: float, target_accept: float, adapt: bool,
                  max_step_size: float | None, pilot_chains: int, moves: str, num_moves: int | None, num_flips: int,
                  accel: str) -> dict:
    """``fixed_kernel_path``'s keywords, checked, each refusal one line naming ``estimator.KEY``."""
    if moves not in BINARY_MOVES:
        raise ConfigError(f"estimator.moves must be one of {list(BINARY_MOVES)}, got {moves!r}")
    return {"num_leapfrog": positive_int(num_leapfrog, "estimator.num_leapfrog"),
            "step_size": positive_float(step_size, "estimator.step_size"),
            "target_accept": positive_float(target_accept, "estimator.target_accept"), "adapt": bool(adapt),
            "max_step_size": None if max_step_size is None else positive_float(max_step_size, "estimator.max_step_size"),
            "pilot_chains": positive_int(pilot_chains, "estimator.pilot_chains"), "moves": moves,
            "num_moves": positive_int(num_moves, "estimator.num_moves", allow_none=True),
            "num_flips": positive_int(num_flips, "estimator.num_flips"),
            "accel": check_mode(accel, what="estimator.accel")}


def fixed_kernel_path(lm, x: torch.Tensor, betas: torch.Tensor, *, start: str = "prior", chains: int = 1,
                      pilot_chains: int = 2, num_leapfrog: int = 10, step_size: float = 0.05,
                      target_accept: float = 0.65, adapt: bool = True, generator=None, accel: str = "none",
                      max_step_size: float | None = MAX_STEP_SIZE, moves: str = "gibbs", num_moves: int | None = None,
                      num_flips: int = 1, on_step=None) -> ModelPath:
    """The path from the base ``start`` (prior | proposal) to the posterior for ``x`` (``chains`` rows per example,
    example-major) along ``ModelPath``, whose every move is a fixed f_beta-invariant kernel: for continuous z, HMC
    with step sizes from a pilot run (``pilot_steps``) where ``adapt``, else ``step_size`` throughout; for binary
    z, the Gibbs or Metropolis flips ``moves``. ``lm``: a ``ProtocolModel`` or what one wraps (a user's model, a
    ``ContinuousLatent``). Used in either direction (forward AIS, and reverse AIS in ``nvil.estimators.bdmc``)."""
    if x.shape[0] % chains:
        raise ValueError(f"{x.shape[0]} rows are not whole examples of {chains} chains each")
    pm = lm if isinstance(lm, ProtocolModel) else ProtocolModel(lm, "the Gaussian net")
    settings = {"num_leapfrog": num_leapfrog, "target_accept": target_accept, "max_step_size": max_step_size,
                "moves": moves, "num_moves": num_moves, "num_flips": num_flips, "accel": accel}
    steps = None
    if not pm.binary and adapt:
        steps = pilot_steps(pm, x[::chains], start, betas, pilot_chains, step_size, chains, generator, on_step,
                            **settings)
    elif not pm.binary:
        constant = torch.full((x.shape[0],), float(step_size), device=x.device)
        steps = {beta: constant for beta in betas.tolist()}
    return ModelPath(pm, x, pm.base(start, x), adapt=False, steps=steps, **settings)


def ais_hmc_log_w(lm: ContinuousLatent, x: torch.Tensor, betas: torch.Tensor, *, chains: int = 1,
                  pilot_chains: int = 2, num_leapfrog: int = 10, step_size: float = 0.05, target_accept: float = 0.65,
                  adapt: bool = True, generator=None, accel: str = "none",
                  max_step_size: float | None = MAX_STEP_SIZE, on_step=None):
    """One AIS run per row of x (``chains`` rows per example, example-major; each row its own example by
    default), its step sizes from ``fixed_kernel_path``: (log w [rows] float64, final ``ModelState``).
    ``on_step(k, increment)``: as in ``nvil.estimators.annealing.ais`` (progress), over the pilot's steps, then
    the run's."""
    path = fixed_kernel_path(lm, x, betas, chains=chains, pilot_chains=pilot_chains, num_leapfrog=num_leapfrog,
                             step_size=step_size, target_accept=target_accept, adapt=adapt, generator=generator,
                             accel=accel, max_step_size=max_step_size, on_step=on_step)
    return ais(path, path.start(generator, step_size), betas, generator, on_step=on_step)
