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
    """``state`` (a NamedTuple of per-particle tensors, first dimension the particles) at the particles ``idx``."""
    n = idx.numel()
    return type(state)(*(f.index_select(0, idx) if torch.is_tensor(f) and f.dim() >= 1 and f.shape[0] == n else f
                         for f in state))


def group_ess(log_w: torch.Tensor, groups: int) -> torch.Tensor:
    """(sum w)^2 / sum w^2 within each of ``groups`` contiguous groups of ``log_w`` [groups x N]: [groups]."""
    lw = log_w.double().view(groups, -1)
    return torch.exp(2 * torch.logsumexp(lw, 1) - torch.logsumexp(2 * lw, 1))


def systematic(log_w: torch.Tensor, generator=None) -> torch.Tensor:
    """Systematic resampling (Kitagawa 1996) within each row of ``log_w`` [G, N]: indices [G, N] into each row, one
    uniform per row, so each particle is kept floor(N W_i) or ceil(N W_i) times."""
    g, n = log_w.shape
    w = torch.softmax(log_w.double(), 1)
    cdf = torch.cumsum(w, 1)
    cdf[:, -1] = 1.0
    u = torch.rand(g, 1, generator=generator, dtype=torch.float64, device=log_w.device)
    positions = (u + torch.arange(n, dtype=torch.float64, device=log_w.device)) / n
    return torch.searchsorted(cdf, positions).clamp_(max=n - 1)


class Resampler:
    """The resampling step of ``ais(..., resample=...)``: each group whose ESS is below ``threshold`` x N is
    resampled and its log-weights set to their log-mean (``renormalise=False`` keeps the old weights: the broken
    variant the tests must catch). ``events`` counts the groups resampled."""

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
    """``path`` with ``num_moves`` transitions per beta (``lag=True`` moves at the previous beta instead: the broken
    variant the tests must catch)."""

    def __init__(self, path, num_moves: int = 1, lag: bool = False) -> None:
        self.path, self.num_moves, self.lag = path, num_moves, lag
        self.previous = 0.0
        self.log_f = path.log_f
        self.log_ratio = getattr(path, "log_ratio", None) or (
            lambda s, b0, b1: (path.log_f(s, b1) - path.log_f(s, b0)).double())

    def transition(self, state, beta: float, generator=None):
        at = self.previous if self.lag else beta
        for _ in range(self.num_moves):
            state = self.path.transition(state, at, generator)
        self.previous = beta
        return state


def cess(log_w: torch.Tensor, increment: torch.Tensor, groups: int) -> torch.Tensor:
    """The conditional ESS share CESS / N of each group (the module docstring) for log-weights ``log_w`` and the
    next step's increments ``increment``: [groups], in (0, 1]."""
    lw = log_w.double().view(groups, -1)
    inc = increment.double().view(groups, -1)
    log_w_norm = lw - torch.logsumexp(lw, 1, keepdim=True)
    return torch.exp(2 * torch.logsumexp(log_w_norm + inc, 1) - torch.logsumexp(log_w_norm + 2 * inc, 1))


def next_beta(ratio, state, log_w: torch.Tensor, beta: float, groups: int, target: float) -> float:
    """The largest beta' in (beta, 1] whose increment ``ratio(state, beta, beta')`` keeps every group's conditional
    ESS share at least ``target``, by bisection (1 where beta' = 1 already does)."""
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
    """The ladder of a pilot SMC run from ``state`` (exact draws of f_0; thrown away after): each next beta by
    ``next_beta`` at the conditional ESS share ``target``; float64 betas from 0 to 1. More than ``max_betas`` steps
    is refused in one line (the path is too long for this target)."""
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
    """SMC along the fixed ladder ``betas`` from ``state``: (log-weights [particles] whose log-mean within each group
    is that group's log Z_1 / Z_0 estimate, the final state, the number of group resampling events).
    ``renormalise`` and ``lag``: the broken variants (``Resampler``, ``Rejuvenated``)."""
    resampler = Resampler(groups, resample_ess, renormalise)
    log_w, end = ais(Rejuvenated(path, num_moves, lag), state, betas, generator, on_step=on_step, resample=resampler)
    return log_w, end, resampler.events


def group_log_z(log_w: torch.Tensor, groups: int) -> torch.Tensor:
    """Each group's log Z_1 / Z_0 estimate: the log-mean of its final log-weights (their product of epoch means)."""
    lw = log_w.double().view(groups, -1)
    return torch.logsumexp(lw, 1) - math.log(lw.shape[1])


@dataclass
class SMCLadder(Ladder):
    """The ladder an adaptive SMC pilot chose (``knots``, one unit of ``rate`` mass per step, so ``betas(K)`` spaces
    any number of steps as the pilot did: the reverse run's), with what the runs did on it."""

    cess: float = 0.9
    num_particles: int = 0
    num_runs: int = 0
    resampling_events: int = 0

    @classmethod
    def of(cls, betas: torch.Tensor, **what) -> "SMCLadder":
        return cls("adaptive", betas, 1.0 / betas.diff().clamp(min=1e-300), len(betas) - 1, None, **what)

    def extras(self) -> dict:
        return {"schedule": "smc", "num_betas": self.pilot_steps, "cess": self.cess,
                "num_particles": self.num_particles, "num_runs": self.num_runs,
                "resampling_events": self.resampling_events}


@dataclass(frozen=True)
class SMCSampler:
    """The forward side of ``certified_log_z`` by SMC (the module docstring)."""

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
        """(chains, steps) of the reverse AIS run on this ladder of ``num_betas`` steps: 2 x ``num_runs`` chains
        on ``reverse_fraction`` x ``num_betas`` x ``num_particles`` / 2 steps, so it costs ``reverse_fraction``
        of the forward runs as in ``estimator=ais``, spent on longer chains: the resampling that lets SMC take
        large steps is not open to reverse AIS, whose bound needs small ones."""
        chains = 2 * self.num_runs
        return chains, max(1, round(cert.reverse_fraction * num_betas * self.num_particles * self.num_runs / chains))

    def settings(self) -> dict:
        return {"num_particles": self.num_particles, "num_runs": self.num_runs, "cess": self.cess,
                "resample_ess": self.resample_ess, "num_moves": self.num_moves, "pilot_runs": self.pilot_runs}

    def run(self, path, generator, progress, announce) -> tuple[ForwardRun, SMCLadder]:
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
