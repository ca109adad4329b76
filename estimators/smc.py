"""Adaptive tempered sequential Monte Carlo (Del Moral, Doucet & Jasra 2006; adaptive tempering as in Jasra et al.
2011 and Zhou, Johansen & Aston 2016; BlackJAX's ``adaptive_tempered_smc``) along any AIS path of
``nvil.estimators.annealing``: ``log_f(state, beta)``, ``log_ratio(state, beta_prev, beta)`` and a transition
leaving f_beta invariant.

Particles come in ``groups`` of N, group-major (one group per independent run, or per example and run). At each
step the particles are weighted by the increment log f_{beta_k} - log f_{beta_{k-1}} at their current state; a
group whose ESS falls below ``resample_ess`` x N is resampled (systematic resampling within the group) and its
weights reset to their mean; then every particle moves by ``num_moves`` transitions at beta_k. The estimate of
Z_1 / Z_0 of a group is the product over the resampling epochs of its mean weights (Del Moral et al. 2006, Sec.
3.2.1), unbiased for a ladder fixed before the particles are drawn.

The ladder is adaptive: ``adaptive_betas`` runs a pilot system of its own particles and picks each next beta by
bisection so that the conditional ESS of the increment (Zhou et al. 2016, Eq. 3.4),
CESS(beta') = N (sum_i W_i u_i)^2 / sum_i W_i u_i^2 with u_i = f_{beta'}(x_i) / f_beta(x_i) and W the normalised
weights, is ``cess`` x N in the group that needs the smallest step. The pilot's particles are thrown away, and the
main system (``smc``) walks the pilot's ladder with fresh ones: choosing the betas from the very particles that
are then weighted along them would bias Z_hat.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import ClassVar

import torch

from nvil.core.config import positive_int
from nvil.core.errors import ConfigError
from nvil.estimators.ais_rbm import ForwardRun
from nvil.estimators.annealing import Ladder, LogZ, ais

BISECTION_STEPS = 50


def take(state, idx: torch.Tensor):
    """``state`` at the particles ``idx``: each per-particle field indexed, the others kept as they are.

    Parameters
    ----------
    state : NamedTuple
        The particles' state; a field that is a tensor whose first dimension has ``idx.numel()`` entries is a
        per-particle field, any other field is shared.
    idx : torch.Tensor
        ``(particles,)`` int64 indices into the particles (a resampling's ancestors: as many as there are
        particles).

    Returns
    -------
    NamedTuple
        A state of the same type, each per-particle field ``field.index_select(0, idx)``.

    Examples
    --------
    >>> import collections
    >>> import torch
    >>> from nvil.estimators.smc import take
    >>> State = collections.namedtuple("State", "x energy beta")
    >>> state = State(torch.arange(8.).view(4, 2), torch.tensor([0., 1., 2., 3.]), 0.5)
    >>> take(state, torch.tensor([3, 3, 0, 1]))
    State(x=tensor([[6., 7.], [6., 7.], [0., 1.], [2., 3.]]), energy=tensor([3., 3., 0., 1.]), beta=0.5)
    """
    n = idx.numel()
    return type(state)(*(f.index_select(0, idx) if torch.is_tensor(f) and f.dim() >= 1 and f.shape[0] == n else f
                         for f in state))


def group_ess(log_w: torch.Tensor, groups: int) -> torch.Tensor:
    """The effective sample size (sum w)^2 / sum w^2 within each of ``groups`` contiguous groups of weights.

    Parameters
    ----------
    log_w : torch.Tensor
        ``(groups x N,)`` log-weights, group-major.
    groups : int
        The number of groups G (each of N = ``log_w.numel() / groups`` particles).

    Returns
    -------
    torch.Tensor
        ``(groups,)`` float64 ESS, in [1, N].

    Examples
    --------
    >>> import torch
    >>> from nvil.estimators.smc import group_ess
    >>> group_ess(torch.tensor([0., -float("inf"), -float("inf"), 0., 0., 0.]), 2)
    tensor([1.0000, 3.0000], dtype=torch.float64)
    """
    lw = log_w.double().view(groups, -1)
    return torch.exp(2 * torch.logsumexp(lw, 1) - torch.logsumexp(2 * lw, 1))


def systematic(log_w: torch.Tensor, generator=None) -> torch.Tensor:
    """Systematic resampling (Kitagawa 1996) within each row of ``log_w``: N ancestor indices per row.

    One uniform per row, so each particle is kept floor(N W_i) or ceil(N W_i) times, W the row's normalised
    weights.

    Parameters
    ----------
    log_w : torch.Tensor
        ``(G, N)`` log-weights, one row per group.
    generator : torch.Generator or None, default None
        Source of the G uniforms.

    Returns
    -------
    torch.Tensor
        ``(G, N)`` int64 indices into each row, in increasing order.

    Examples
    --------
    >>> import torch
    >>> from nvil.estimators.smc import systematic
    >>> w = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    >>> idx = systematic(w.log(), torch.Generator().manual_seed(0))
    >>> idx.shape, torch.bincount(idx[0], minlength=4).tolist()
    (torch.Size([1, 4]), [2, 1, 0, 1])
    """
    g, n = log_w.shape
    w = torch.softmax(log_w.double(), 1)
    cdf = torch.cumsum(w, 1)
    cdf[:, -1] = 1.0
    u = torch.rand(g, 1, generator=generator, dtype=torch.float64, device=log_w.device)
    positions = (u + torch.arange(n, dtype=torch.float64, device=log_w.device)) / n
    return torch.searchsorted(cdf, positions).clamp_(max=n - 1)


class Resampler:
    """The resampling step of ``ais(..., resample=...)``: resample each group whose ESS is below ``threshold`` x N.

    Called as ``resampler(state, log_w, generator) -> (state, log_w)``: each group whose ESS is below
    ``threshold`` x N is resampled (``systematic``, within the group) and its log-weights set to their log-mean,
    so the group's estimate of Z_1 / Z_0 is unchanged (Del Moral et al. 2006, Sec. 3.2.1); the other groups are
    left alone. ``events`` counts the groups resampled.

    Parameters
    ----------
    groups : int
        G, the contiguous groups of N particles (group-major), each resampled on its own.
    threshold : float
        The ESS share of N below which a group is resampled (``resample_ess``).
    renormalise : bool, default True
        False keeps the old weights of the resampled particles: the broken variant the tests must catch.

    Examples
    --------
    >>> import collections
    >>> import torch
    >>> from nvil.estimators.smc import Resampler
    >>> State = collections.namedtuple("State", "x")
    >>> resample = Resampler(groups=2, threshold=0.5)
    >>> log_w = torch.tensor([0., -10., -10., -10., 0., 0., 0., 0.])  # group 0 rests on one particle
    >>> state, log_w = resample(State(torch.arange(8.)), log_w, torch.Generator().manual_seed(0))
    >>> state.x, resample.events
    (tensor([0., 0., 0., 0., 4., 5., 6., 7.]), 1)
    >>> log_w
    tensor([-1.3862, -1.3862, -1.3862, -1.3862,  0.0000,  0.0000,  0.0000,  0.0000], dtype=torch.float64)
    """

    def __init__(self, groups: int, threshold: float, renormalise: bool = True) -> None:
        self.groups, self.threshold, self.renormalise = groups, threshold, renormalise
        self.events = 0

    def __call__(self, state, log_w: torch.Tensor, generator=None):
        g = self.groups
        lw = log_w.double().view(g, -1)
        n = lw.shape[1]
        low = group_ess(log_w, g) < self.threshold * n
        if not bool(low.any()):
            return state, log_w
        self.events += int(low.sum())
        local = torch.arange(n, device=lw.device).expand(g, n).clone()
        local[low] = systematic(lw[low], generator)
        idx = (local + n * torch.arange(g, device=lw.device).unsqueeze(1)).reshape(-1)
        if self.renormalise:
            mean = torch.logsumexp(lw, 1, keepdim=True) - math.log(n)
            lw = torch.where(low.unsqueeze(1), mean.expand(g, n), lw)
        else:
            lw = lw.reshape(-1)[idx].view(g, n)
        return take(state, idx), lw.reshape(-1)


class Rejuvenated:
    """``path`` with ``num_moves`` transitions per beta: the rejuvenation moves of SMC.

    It has the path's ``log_f`` and ``log_ratio`` (the difference of ``log_f``, in float64, where the path has no
    ``log_ratio``), so ``ais`` walks it as it would the path.

    Parameters
    ----------
    path : object
        An AIS path (``nvil.estimators.annealing``): ``log_f(state, beta)``, optionally ``log_ratio(state,
        beta_prev, beta)``, and ``transition(state, beta, generator)`` leaving f_beta invariant (``RBMPath``,
        ``ModelPath``, ...).
    num_moves : int, default 1
        Transitions at each beta.
    lag : bool, default False
        True moves at the previous beta instead: the broken variant the tests must catch.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import RBM
    >>> from nvil.estimators.ais_rbm import RBMPath, base_rate
    >>> from nvil.estimators.smc import Rejuvenated
    >>> rbm = RBM(6, 4)
    >>> x = (torch.rand(20, 6) < 0.5).float()
    >>> path = RBMPath(rbm, base_rate(rbm, x))
    >>> g = torch.Generator().manual_seed(0)
    >>> mover = Rejuvenated(path, num_moves=2)
    >>> state = mover.transition(path.sample_base(8, g), 0.5, g)
    >>> state.x.shape, mover.previous
    (torch.Size([8, 6]), 0.5)
    """

    def __init__(self, path, num_moves: int = 1, lag: bool = False) -> None:
        self.path, self.num_moves, self.lag = path, num_moves, lag
        self.previous = 0.0
        self.log_f = path.log_f
        self.log_ratio = getattr(path, "log_ratio", None) or (
            lambda s, b0, b1: (path.log_f(s, b1) - path.log_f(s, b0)).double())

    def transition(self, state, beta: float, generator=None):
        """``num_moves`` transitions of the path at ``beta`` (at the previous call's beta where ``lag``).

        Parameters
        ----------
        state : object
            The particles' state, the path's kind.
        beta : float
            The inverse temperature just reached.
        generator : torch.Generator or None, default None
            Source of randomness for the moves.

        Returns
        -------
        object
            The particles after the moves.
        """
        at = self.previous if self.lag else beta
        for _ in range(self.num_moves):
            state = self.path.transition(state, at, generator)
        self.previous = beta
        return state


def cess(log_w: torch.Tensor, increment: torch.Tensor, groups: int) -> torch.Tensor:
    """The conditional ESS share CESS / N of each group for log-weights ``log_w`` and the next step's increments.

    CESS = N (sum_i W_i u_i)^2 / sum_i W_i u_i^2 with u_i = exp(``increment``_i) and W the normalised weights
    (Zhou et al. 2016, Eq. 3.4; the module docstring).

    Parameters
    ----------
    log_w : torch.Tensor
        ``(groups x N,)`` the particles' log-weights, group-major.
    increment : torch.Tensor
        ``(groups x N,)`` the next step's increments log f_beta'(x_i) - log f_beta(x_i).
    groups : int
        The number of groups.

    Returns
    -------
    torch.Tensor
        ``(groups,)`` float64 shares, in (0, 1]; 1 where the increment is the same for every particle.

    Examples
    --------
    >>> import torch
    >>> from nvil.estimators.smc import cess
    >>> increment = torch.tensor([0., 0., 0., 0., 0., 0., 0., 3.])
    >>> cess(torch.zeros(8), increment, 2)
    tensor([1.0000, 0.3278], dtype=torch.float64)
    """
    lw = log_w.double().view(groups, -1)
    inc = increment.double().view(groups, -1)
    log_w_norm = lw - torch.logsumexp(lw, 1, keepdim=True)
    return torch.exp(2 * torch.logsumexp(log_w_norm + inc, 1) - torch.logsumexp(log_w_norm + 2 * inc, 1))


def next_beta(ratio, state, log_w: torch.Tensor, beta: float, groups: int, target: float) -> float:
    """The largest beta' in (beta, 1] whose increment keeps every group's conditional ESS share at least ``target``.

    By bisection (at most ``BISECTION_STEPS`` halvings) on ``cess(log_w, ratio(state, beta, beta'), groups)``; 1
    where beta' = 1 already does.

    Parameters
    ----------
    ratio : callable
        ``ratio(state, beta, beta')`` -> ``(particles,)`` increments log f_beta' - log f_beta (a path's
        ``log_ratio``).
    state : object
        The particles' state.
    log_w : torch.Tensor
        ``(particles,)`` their log-weights.
    beta : float
        The current inverse temperature.
    groups : int
        The number of groups (group-major); the step is the one the neediest group allows.
    target : float
        The conditional ESS share to keep, ``cess``.

    Returns
    -------
    float
        beta', always above ``beta`` (at least one representable step).

    Examples
    --------
    >>> import torch
    >>> from nvil.models import RBM
    >>> from nvil.estimators.ais_rbm import RBMPath, base_rate
    >>> from nvil.estimators.smc import cess, next_beta
    >>> rbm = RBM(6, 4)
    >>> x = (torch.rand(20, 6) < 0.5).float()
    >>> path = RBMPath(rbm, base_rate(rbm, x))
    >>> g = torch.Generator().manual_seed(0)
    >>> state, log_w = path.sample_base(8, g), torch.zeros(8, dtype=torch.float64)
    >>> b = next_beta(path.log_ratio, state, log_w, 0.0, 1, 0.9)
    >>> 0 < b < 1, abs(cess(log_w, path.log_ratio(state, 0.0, b), 1).item() - 0.9) < 1e-6
    (True, True)
    """
    ok = lambda b: bool((cess(log_w, ratio(state, beta, b), groups) >= target).all())  # noqa: E731
    if ok(1.0):
        return 1.0
    lo, hi = beta, 1.0
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return lo if lo > beta else hi  # at least one representable step


@torch.no_grad()
def adaptive_betas(path, state, groups: int, *, target: float = 0.9, resample_ess: float = 0.5,
                   num_moves: int = 1, max_betas: int = 100_000, generator=None, on_step=None) -> torch.Tensor:
    """The ladder of a pilot SMC run from ``state``: each next beta at the conditional ESS share ``target``.

    The pilot's particles (exact draws of f_0) are thrown away after: the main run (``smc``) walks the ladder with
    fresh ones. Each next beta is ``next_beta``'s; after each step below 1 the groups are resampled
    (``Resampler``) and moved (``Rejuvenated``). More than ``max_betas`` steps is refused in one line (the path is
    too long for this target).

    Parameters
    ----------
    path : object
        An AIS path (``nvil.estimators.annealing``): ``log_f(state, beta)``, optionally ``log_ratio(state,
        beta_prev, beta)``, and ``transition(state, beta, generator)`` leaving f_beta invariant (``RBMPath``,
        ``ModelPath``, ...).
    state : object
        The pilot's particles, exact draws of f_0 (``path.sample_base``), ``groups`` x N of them, group-major.
    groups : int
        The pilot's independent runs.
    target : float, default 0.9
        The conditional ESS share of each step (``cess``).
    resample_ess : float, default 0.5
        A group whose ESS falls below this share of N is resampled.
    num_moves : int, default 1
        Transitions per beta.
    max_betas : int, default 100000
        The most steps before the run is refused.
    generator : torch.Generator or None, default None
        Source of randomness for the resampling and the moves.
    on_step : callable or None, default None
        ``on_step(k, increment)`` after each step k (progress, diagnostics).

    Returns
    -------
    torch.Tensor
        ``(K + 1,)`` float64 betas, increasing from 0 to 1.

    Raises
    ------
    ConfigError
        (``nvil.core.errors``) If reaching beta = 1 takes more than ``max_betas`` steps.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import RBM
    >>> from nvil.estimators.ais_rbm import RBMPath, base_rate
    >>> from nvil.estimators.smc import adaptive_betas
    >>> rbm = RBM(6, 4)
    >>> x = (torch.rand(20, 6) < 0.5).float()
    >>> path = RBMPath(rbm, base_rate(rbm, x))
    >>> g = torch.Generator().manual_seed(0)
    >>> betas = adaptive_betas(path, path.sample_base(32, g), 2, generator=g)
    >>> betas[0].item(), betas[-1].item(), bool((betas.diff() > 0).all()), betas.dtype
    (0.0, 1.0, True, torch.float64)
    >>> adaptive_betas(path, path.sample_base(32, g), 2, target=0.99, max_betas=2, generator=g)
    Traceback (most recent call last):
        ...
    nvil.core.errors.ConfigError: adaptive SMC needed more than estimator.max_betas=2 temperatures to reach beta = 1 ...
    """
    mover = Rejuvenated(path, num_moves)
    resampler = Resampler(groups, resample_ess)
    betas, log_w = [0.0], torch.zeros(state[0].shape[0], dtype=torch.float64, device=state[0].device)
    while betas[-1] < 1.0:
        if len(betas) > max_betas:
            raise ConfigError(f"adaptive SMC needed more than estimator.max_betas={max_betas} temperatures to reach "
                              f"beta = 1 (it stood at beta = {betas[-1]:.3g}); raise max_betas or lower estimator.cess")
        b = next_beta(mover.log_ratio, state, log_w, betas[-1], groups, target)
        step = mover.log_ratio(state, betas[-1], b)
        log_w = log_w + step
        betas.append(b)
        if on_step is not None:
            on_step(len(betas) - 1, step)
        if b < 1.0:
            state, log_w = resampler(state, log_w, generator)
            state = mover.transition(state, b, generator)
    return torch.tensor(betas, dtype=torch.float64)


@torch.no_grad()
def smc(path, state, betas: torch.Tensor, groups: int, *, resample_ess: float = 0.5, num_moves: int = 1,
        generator=None, on_step=None, renormalise: bool = True, lag: bool = False):
    """SMC along the fixed ladder ``betas`` from ``state``: weight, resample the groups that need it, move.

    ``nvil.estimators.annealing.ais`` with a ``Resampler`` between each weight increment and the ``num_moves``
    transitions of ``Rejuvenated``. Each group's Z_1 / Z_0 estimate (``group_log_z``) is unbiased for a ladder
    fixed before the particles are drawn.

    Parameters
    ----------
    path : object
        An AIS path (``nvil.estimators.annealing``): ``log_f(state, beta)``, optionally ``log_ratio(state,
        beta_prev, beta)``, and ``transition(state, beta, generator)`` leaving f_beta invariant (``RBMPath``,
        ``ModelPath``, ...).
    state : object
        The particles, exact draws of f_0, ``groups`` x N of them, group-major.
    betas : torch.Tensor
        ``(K + 1,)`` the ladder from 0 to 1 (``adaptive_betas``'s, from other particles).
    groups : int
        The independent runs (or examples x runs).
    resample_ess : float, default 0.5
        A group whose ESS falls below this share of N is resampled.
    num_moves : int, default 1
        Transitions per beta.
    generator : torch.Generator or None, default None
        Source of randomness for the resampling and the moves.
    on_step : callable or None, default None
        ``on_step(k, increment)`` after each step k.
    renormalise : bool, default True
        False: the broken variant of ``Resampler``.
    lag : bool, default False
        True: the broken variant of ``Rejuvenated``.

    Returns
    -------
    tuple
        ``(log_w, state, events)``: ``(particles,)`` float64 log-weights whose log-mean within each group is that
        group's log Z_1 / Z_0 estimate, the final state, and the number of group resampling events.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import RBM
    >>> from nvil.estimators.ais_rbm import RBMPath, base_rate
    >>> from nvil.estimators.smc import adaptive_betas, group_log_z, smc
    >>> rbm = RBM(6, 4)
    >>> x = (torch.rand(20, 6) < 0.5).float()
    >>> path = RBMPath(rbm, base_rate(rbm, x))
    >>> g = torch.Generator().manual_seed(0)
    >>> betas = adaptive_betas(path, path.sample_base(32, g), 2, generator=g)
    >>> log_w, end, events = smc(path, path.sample_base(4 * 16, g), betas, 4, generator=g)
    >>> log_z = group_log_z(log_w, 4) + path.log_z0()  # each run's log Z
    >>> log_w.shape, end.x.shape, log_z.shape
    (torch.Size([64]), torch.Size([64, 6]), torch.Size([4]))
    >>> bool(abs(torch.logsumexp(log_z, 0) - torch.log(torch.tensor(4.)) - rbm.log_z_exact()) < 0.3)
    True
    """
    resampler = Resampler(groups, resample_ess, renormalise)
    log_w, end = ais(Rejuvenated(path, num_moves, lag), state, betas, generator, on_step=on_step, resample=resampler)
    return log_w, end, resampler.events


def group_log_z(log_w: torch.Tensor, groups: int) -> torch.Tensor:
    """Each group's log Z_1 / Z_0 estimate: the log-mean of its final log-weights (their product of epoch means).

    Parameters
    ----------
    log_w : torch.Tensor
        ``(groups x N,)`` final log-weights of ``smc``, group-major.
    groups : int
        The number of groups.

    Returns
    -------
    torch.Tensor
        ``(groups,)`` float64 log (1/N) sum_i w_i per group.

    Examples
    --------
    >>> import math
    >>> import torch
    >>> from nvil.estimators.smc import group_log_z
    >>> group_log_z(torch.tensor([0., 0., 0., math.log(3)]), 2)
    tensor([0.0000, 0.6931], dtype=torch.float64)
    """
    lw = log_w.double().view(groups, -1)
    return torch.logsumexp(lw, 1) - math.log(lw.shape[1])


@dataclass
class SMCLadder(Ladder):
    """The ladder an adaptive SMC pilot chose, with what the runs did on it.

    ``knots`` are the pilot's betas, with one unit of ``rate`` mass per step, so ``betas(K)`` spaces any number
    of steps as the pilot did (the reverse run's); ``extras`` is the result's ``log_z_schedule``. Build one with
    ``SMCLadder.of(betas, ...)``.

    Attributes
    ----------
    kind : str
        ``"adaptive"`` (``Ladder``'s kind: its betas come from ``knots`` and ``rate``).
    knots : torch.Tensor or None, default None
        ``(K + 1,)`` float64 betas the pilot chose.
    rate : torch.Tensor or None, default None
        ``(K,)`` the density of steps on each interval: 1 / (beta_k - beta_{k-1}).
    pilot_steps : int, default 0
        K, the pilot's steps (the result's ``num_betas``).
    pilot_log_w_sd : float or None, default None
        Not used by SMC (``Ladder``'s).

    Parameters
    ----------
    cess : float, default 0.9
        The conditional ESS share the pilot kept.
    num_particles : int, default 0
        N, particles per run.
    num_runs : int, default 0
        The forward SMC runs.
    resampling_events : int, default 0
        Group resampling events in the forward runs.

    Examples
    --------
    >>> import torch
    >>> from nvil.estimators.smc import SMCLadder
    >>> ladder = SMCLadder.of(torch.tensor([0., 0.25, 1.], dtype=torch.float64), cess=0.9, num_particles=16,
    ...                       num_runs=4)
    >>> ladder.betas(4)
    tensor([0.0000, 0.1250, 0.2500, 0.6250, 1.0000], dtype=torch.float64)
    >>> ladder.extras()
    {'schedule': 'smc', 'num_betas': 2, 'cess': 0.9, 'num_particles': 16, 'num_runs': 4, 'resampling_events': 0}
    """

    cess: float = 0.9
    num_particles: int = 0
    num_runs: int = 0
    resampling_events: int = 0

    @classmethod
    def of(cls, betas: torch.Tensor, **what) -> "SMCLadder":
        """The ladder of the betas ``betas``, one unit of rate mass per step.

        Parameters
        ----------
        betas : torch.Tensor
            ``(K + 1,)`` float64 betas from 0 to 1, increasing (``adaptive_betas``'s).
        **what : object
            The other fields: ``cess``, ``num_particles``, ``num_runs``, ``resampling_events``.

        Returns
        -------
        SMCLadder
            ``kind="adaptive"``, ``knots=betas``, ``rate`` 1 / diff(betas), ``pilot_steps=K``.
        """
        return cls("adaptive", betas, 1.0 / betas.diff().clamp(min=1e-300), len(betas) - 1, None, **what)

    def extras(self) -> dict:
        """The ladder as the result reports it (``log_z_schedule``).

        Returns
        -------
        dict
            ``schedule`` (``"smc"``), ``num_betas`` (K), ``cess``, ``num_particles``, ``num_runs`` and
            ``resampling_events``.
        """
        return {"schedule": "smc", "num_betas": self.pilot_steps, "cess": self.cess,
                "num_particles": self.num_particles, "num_runs": self.num_runs,
                "resampling_events": self.resampling_events}


@dataclass(frozen=True)
class SMCSampler:
    """The forward side of ``certified_log_z`` by SMC (the module docstring): a pilot chooses the ladder, runs walk it.

    ``nvil.estimators.certify.certified_log_z(..., sampler=...)`` calls ``run`` in place of its ladder and forward
    AIS, and ``reverse`` for the size of its reverse AIS run; ``steps`` names the phases ``run`` announces. The
    settings are ``estimator=smc``'s (``nvil.estimators.smc_log_z.SMC``), checked here.

    Parameters
    ----------
    num_particles : int
        N, particles per run (at least 2).
    num_runs : int
        Independent forward runs; the estimate is the mean of their Z_r.
    cess : float
        The conditional ESS share of each step of the pilot's ladder, in (0, 1).
    resample_ess : float
        A run whose ESS falls below this share of N is resampled, in (0, 1).
    num_moves : int
        Transitions per beta.
    max_betas : int
        The most steps the pilot may take.
    pilot_runs : int
        The pilot's runs of N particles each, thrown away after.

    Raises
    ------
    ConfigError
        (``nvil.core.errors``) If a count is not a positive integer, ``cess`` or ``resample_ess`` is not strictly
        between 0 and 1, or ``num_particles`` is below 2, in one line naming ``estimator.KEY``.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import RBM
    >>> from nvil.estimators.ais_rbm import RBMPath, base_rate
    >>> from nvil.estimators.settings import CertifySettings
    >>> from nvil.estimators.smc import SMCSampler
    >>> rbm = RBM(6, 4)
    >>> x = (torch.rand(20, 6) < 0.5).float()
    >>> path = RBMPath(rbm, base_rate(rbm, x))
    >>> g = torch.Generator().manual_seed(0)
    >>> sampler = SMCSampler(num_particles=16, num_runs=4, cess=0.9, resample_ess=0.5, num_moves=1,
    ...                      max_betas=1000, pilot_runs=2)
    >>> forward, ladder = sampler.run(path, g, False, print)
    pilot SMC
    forward SMC
    >>> forward.estimate.num_chains, forward.log_w.shape, ladder.num_runs
    (4, torch.Size([64]), 4)
    >>> sampler.reverse(10, CertifySettings())
    (8, 40)
    >>> SMCSampler(1, 4, 0.9, 0.5, 1, 1000, 2)
    Traceback (most recent call last):
        ...
    nvil.core.errors.ConfigError: estimator.num_particles must be at least 2 (resampling needs a choice)
    """

    num_particles: int
    num_runs: int
    cess: float
    resample_ess: float
    num_moves: int
    max_betas: int
    pilot_runs: int
    steps: ClassVar[list[str]] = ["pilot SMC", "forward SMC"]

    def __post_init__(self) -> None:
        for key in ("num_particles", "num_runs", "pilot_runs", "num_moves", "max_betas"):
            object.__setattr__(self, key, positive_int(getattr(self, key), f"estimator.{key}"))
        for key in ("cess", "resample_ess"):
            value = float(getattr(self, key))
            if not 0.0 < value < 1.0:
                raise ConfigError(f"estimator.{key} must lie strictly between 0 and 1, got {value}")
            object.__setattr__(self, key, value)
        if self.num_particles < 2:
            raise ConfigError("estimator.num_particles must be at least 2 (resampling needs a choice)")

    def reverse(self, num_betas: int, cert) -> tuple[int, int]:
        """The size (chains, steps) of the reverse AIS run on this ladder of ``num_betas`` steps.

        2 x ``num_runs`` chains on ``reverse_fraction`` x ``num_betas`` x ``num_particles`` / 2 steps, so it costs
        ``reverse_fraction`` of the forward runs as in ``estimator=ais``, spent on longer chains: the resampling
        that lets SMC take large steps is not open to reverse AIS, whose bound needs small ones.

        Parameters
        ----------
        num_betas : int
            K, the forward ladder's steps.
        cert : CertifySettings
            (``nvil.estimators.settings``) the certificate's settings; ``reverse_fraction`` is used.

        Returns
        -------
        tuple of int
            ``(chains, steps)``, steps at least 1.
        """
        chains = 2 * self.num_runs
        return chains, max(1, round(cert.reverse_fraction * num_betas * self.num_particles * self.num_runs / chains))

    def settings(self) -> dict:
        """The sampler's settings, for the log Z cache key and the result (``SMC.cache_extra``).

        Returns
        -------
        dict
            ``num_particles``, ``num_runs``, ``cess``, ``resample_ess``, ``num_moves`` and ``pilot_runs``.
        """
        return {"num_particles": self.num_particles, "num_runs": self.num_runs, "cess": self.cess,
                "resample_ess": self.resample_ess, "num_moves": self.num_moves, "pilot_runs": self.pilot_runs}

    def run(self, path, generator, progress, announce) -> tuple[ForwardRun, SMCLadder]:
        """The pilot run (``adaptive_betas``), then ``num_runs`` forward SMC runs on its ladder with fresh particles.

        Parameters
        ----------
        path : RBMPath
            (``nvil.estimators.ais_rbm``) the Boltzmann machine's path from its base-rate model, with
            ``sample_base`` and ``log_z0``.
        generator : torch.Generator or None
            Source of randomness for both runs.
        progress : bool
            Inner progress bars (not used: the SMC runs show none).
        announce : callable
            ``announce(step)`` is called with ``"pilot SMC"``, then ``"forward SMC"`` (the names in ``steps``).

        Returns
        -------
        tuple
            ``(ForwardRun, SMCLadder)``: the forward estimate (a ``LogZ`` over the runs' log Z_r, one "chain" per
            run), the particles' end states and final log-weights; and the ladder with what the runs did on it.
        """
        n = self.num_particles
        announce("pilot SMC")
        betas = adaptive_betas(path, path.sample_base(self.pilot_runs * n, generator), self.pilot_runs,
                               target=self.cess, resample_ess=self.resample_ess, num_moves=self.num_moves,
                               max_betas=self.max_betas, generator=generator)
        announce("forward SMC")
        t0 = time.perf_counter()
        log_w, end, events = smc(path, path.sample_base(self.num_runs * n, generator), betas, self.num_runs,
                                 resample_ess=self.resample_ess, num_moves=self.num_moves, generator=generator)
        estimate = LogZ.from_log_w(group_log_z(log_w, self.num_runs), path.log_z0(), "forward", len(betas) - 1,
                                   time.perf_counter() - t0)
        ladder = SMCLadder.of(betas, cess=self.cess, num_particles=n, num_runs=self.num_runs,
                              resampling_events=events)
        return ForwardRun(estimate, end, log_w), ladder
