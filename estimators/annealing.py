"""Annealed importance sampling (Neal 2001): the machinery every AIS estimate here shares (the ladder of inverse
temperatures, the one loop over a path, the summary of its log-weights), whatever the path.

A path is a sequence of unnormalised log densities log f_beta, beta_0 = 0 < ... < beta_K = 1, with a
transition operator T_beta leaving f_beta / Z_beta invariant. From x_0 ~ f_0 / Z_0,

    log w = sum_{k=1}^{K} [log f_{beta_k}(x_{k-1}) - log f_{beta_{k-1}}(x_{k-1})],   x_k ~ T_{beta_k}(. <- x_{k-1}),

so each weight increment is taken *before* the move, at the state the previous operator left (Neal 2001,
Eq. 3; the ordering several public ports get wrong), and E[exp(log w)] = Z_K / Z_0. Run with the betas in
decreasing order from exact samples of f_1 / Z_1 (reverse AIS), exp(log w) is unbiased for Z_0 / Z_K instead.
Log-weights accumulate in float64; averages are log-sum-exps.

A path is any object with ``log_f(state, beta) -> [chains]`` and ``transition(state, beta, generator) -> state``;
it may add ``log_ratio(state, beta_prev, beta)``, the increment log f_beta - log f_beta_prev in one pass, and
``fused_step(state, beta_prev, beta, generator) -> (increment, state)``, the increment and the move in one call.
The paths: ``nvil.estimators.ais_rbm.RBMPath`` (a Boltzmann machine from its base-rate model), ``nvil.estimators.ais.
PosteriorPath`` (Q(h | v) to the posterior), ``nvil.estimators.model_paths.ModelPath`` (a model's prior or proposal to its posterior: HMC, Gibbs or Metropolis flips).

The ladder is built once per estimate (``make_ladder``, then ``Ladder.betas``) and passed down to every run
that walks it: forward, reverse (the same betas backwards) and the pilot of an adaptive ladder.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from nvil.core.config import positive_int
from nvil.core.errors import ConfigError
from nvil.core.ops import log_mean_exp
from nvil.estimators.base import progress_interval

SCHEDULES = ("adaptive", "paper", "linear", "sigmoid")
FIXED_SCHEDULES = ("paper", "linear", "sigmoid")
PAPER_SEGMENTS = ((0.0, 0.5, 500), (0.5, 0.9, 4000), (0.9, 1.0, 10000))  # 14,500 steps in all


def check_schedule(kind: str, num_betas: int, prefix: str = "estimator.") -> None:
    """Refuse a ladder ``kind`` or a ``num_betas`` the fixed ladders cannot make, naming the keys under ``prefix``
    (``estimator.``, or ``estimator.log_z.`` for a DBN's or a DBM's top-machine log Z)."""
    positive_int(num_betas, f"{prefix}num_betas")
    if kind not in SCHEDULES:
        raise ConfigError(f"{prefix}schedule must be one of {list(SCHEDULES)}, got {kind!r}")
    if kind == "paper" and num_betas < 3:
        raise ConfigError(f"{prefix}schedule=paper needs num_betas >= 3, got {num_betas}")


def schedule(kind: str, num_betas: int) -> torch.Tensor:
    """num_betas + 1 inverse temperatures from 0 to 1 (num_betas steps, as the papers count them), for the fixed
    ladders (``adaptive`` needs a pilot run: ``adaptive_ladder``).

    ``paper``: Salakhutdinov & Murray 2008's spacing, uniform within [0, 0.5], [0.5, 0.9] and [0.9, 1]
    with 500 : 4,000 : 10,000 of the steps (exactly those numbers at num_betas = 14,500);
    ``linear``: uniform in [0, 1]; ``sigmoid``: beta_t proportional to sigmoid(4 (2t/T - 1)), rescaled to [0, 1]
    (Grosse et al. 2013; the schedule of Wu et al. 2017's AIS for decoder-based models)."""
    check_schedule(kind, num_betas)
    if kind == "linear":
        return torch.linspace(0.0, 1.0, num_betas + 1, dtype=torch.float64)
    if kind == "sigmoid":
        s = torch.sigmoid(torch.linspace(-4.0, 4.0, num_betas + 1, dtype=torch.float64))
        return (s - s[0]) / (s[-1] - s[0])
    if kind != "paper":
        raise ConfigError(f"estimator.schedule={kind} is not a fixed ladder (one of {list(FIXED_SCHEDULES)})")
    total = sum(n for *_, n in PAPER_SEGMENTS)
    counts = [max(1, round(num_betas * n / total)) for *_, n in PAPER_SEGMENTS[:-1]]
    counts.append(num_betas - sum(counts))
    parts = [torch.linspace(lo, hi, n + 1, dtype=torch.float64)[:-1] for (lo, hi, _), n in zip(PAPER_SEGMENTS, counts)]
    return torch.cat(parts + [torch.ones(1, dtype=torch.float64)])


@torch.no_grad()
def ais(path, state, betas: torch.Tensor, generator=None, progress: bool = False, desc: str = "AIS", on_step=None,
        resample=None):
    """Run AIS along ``path`` from ``state`` through ``betas``; returns (log w [chains] float64, final state).
    ``on_step(k, increment)`` sees each step's weight increments (the pilot run of ``adaptive_ladder``; the
    per-example estimators' progress). ``progress``: an inner bar named ``desc``.

    ``resample``: where a resampling step goes, None (plain AIS, the default everywhere here). Given,
    ``resample(state, log_w, generator) -> (state, log_w)`` runs after each weight increment and before the move at
    that beta (sequential Monte Carlo samplers, Del Moral, Doucet & Jasra 2006: resample the chains by their
    weights, then reset the weights to their mean), and the path's ``fused_step`` is not used, so that the hook
    sits between the two halves of each step."""
    b = betas.tolist()
    log_w = None
    fused = getattr(path, "fused_step", None) if resample is None else None
    ratio = getattr(path, "log_ratio", None) or (lambda s, b0, b1: (path.log_f(s, b1) - path.log_f(s, b0)).double())
    for k in tqdm(range(1, len(b)), disable=not progress, desc=desc, leave=False, unit="beta",
                  mininterval=max(1.0, progress_interval())):
        moves = k < len(b) - 1
        if fused is not None and moves:
            step, state = fused(state, b[k - 1], b[k], generator)
        else:
            step = ratio(state, b[k - 1], b[k])
        if on_step is not None:
            on_step(k, step)
        log_w = step if log_w is None else log_w + step
        if fused is None and moves:
            if resample is not None:
                state, log_w = resample(state, log_w, generator)
            state = path.transition(state, b[k], generator)
    return log_w, state


# ---- step sizes fixed in advance by a pilot run ----------------------------------------------------------------


class StepTape:
    """A path whose moves record the step size each chain used at each beta (``state.step_size``): the pilot run
    of ``pilot_step_sizes``."""

    def __init__(self, path) -> None:
        self.path, self.tape = path, {}
        ratio = getattr(path, "log_ratio", None)
        if ratio is not None:
            self.log_ratio = ratio

    def log_f(self, state, beta: float) -> torch.Tensor:
        return self.path.log_f(state, beta)

    def transition(self, state, beta: float, generator=None):
        self.tape[beta] = state.step_size
        return self.path.transition(state, beta, generator)


@torch.no_grad()
def pilot_step_sizes(path, start, betas: torch.Tensor, pilot_chains: int, chains: int, generator=None,
                     on_step=None) -> dict:
    """beta -> step sizes for ``chains`` chains per example (example-major): a pilot AIS run along ``path`` from
    ``start``, ``pilot_chains`` chains per example, each adapting its own step size after every move (the path's
    transition does); per example and beta the geometric mean over its pilot chains, repeated for its ``chains``
    chains. The pilot's chains are thrown away, so the kernels the main run uses are chosen independently of it."""
    pilot = StepTape(path)
    ais(pilot, start, betas, generator, on_step=on_step)
    return {beta: step.log().view(-1, pilot_chains).mean(1).exp().repeat_interleave(chains, 0)
            for beta, step in pilot.tape.items()}


# ---- the adaptive ladder ----------------------------------------------------------------------------------


def pilot_betas(num_betas: int, pilot_fraction: float = 0.05) -> torch.Tensor:
    """The betas of the pilot run of ``adaptive_ladder`` for a main run of ``num_betas`` steps."""
    return pilot_grid(max(4, round(pilot_fraction * num_betas)))


def pilot_grid(num_steps: int) -> torch.Tensor:
    """The pilot's betas: half uniform in [0, 1], half log-spaced from 1e-4, so the pilot resolves both the
    low-beta stretch (where an RBM's chains leave the base-rate model) and the rest."""
    n_log = num_steps // 2
    lin = torch.linspace(0.0, 1.0, num_steps - n_log + 1, dtype=torch.float64)
    log = torch.logspace(-4, 0, n_log + 1, dtype=torch.float64) if n_log else torch.zeros(0, dtype=torch.float64)
    grid = torch.unique(torch.cat([lin, log]))
    return grid


@dataclass
class Ladder:
    """A beta ladder and, for an adaptive one, the density it was drawn from: ``knots`` (the pilot's betas) and
    ``rate`` (estimated d sd(log w) / d beta on each pilot interval), so that ``betas(K)`` can place any number
    of steps with the same spacing (reverse AIS uses fewer)."""

    kind: str
    knots: torch.Tensor | None = None
    rate: torch.Tensor | None = None
    pilot_steps: int = 0
    pilot_log_w_sd: float | None = None  # sd of the pilot's log-weights

    def betas(self, num_betas: int) -> torch.Tensor:
        if self.kind != "adaptive":
            return schedule(self.kind, num_betas)
        positive_int(num_betas, "estimator.num_betas")
        # Lambda(beta) = int_0^beta rate: piecewise linear through the knots; beta_k = Lambda^-1(k Lambda(1) / K).
        cum = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(self.rate * self.knots.diff(), 0)])
        targets = torch.linspace(0.0, cum[-1].item(), num_betas + 1, dtype=torch.float64)
        idx = torch.searchsorted(cum, targets, right=True).clamp(1, len(cum) - 1)
        lo, hi = cum[idx - 1], cum[idx]
        frac = ((targets - lo) / (hi - lo).clamp(min=1e-300)).clamp(0.0, 1.0)
        betas = self.knots[idx - 1] + frac * (self.knots[idx] - self.knots[idx - 1])
        betas[0], betas[-1] = 0.0, 1.0
        return torch.maximum(betas, torch.cummax(betas, 0).values)  # monotone despite rounding

    def extras(self) -> dict:
        if self.kind != "adaptive":
            return {"schedule": self.kind}
        return {"schedule": "adaptive", "pilot_steps": self.pilot_steps,
                "pilot_log_w_sd": None if self.pilot_log_w_sd is None else round(self.pilot_log_w_sd, 4)}


@torch.no_grad()
def adaptive_ladder(path, state, num_betas: int, generator=None, groups: int = 1, pilot_fraction: float = 0.05,
                    floor: float = 0.05, on_step=None) -> Ladder:
    """An AIS ladder whose every step adds about the same log-weight variance (the rule Murray & Salakhutdinov
    2009, Sec. 4, applied by hand; the "thermodynamic length" schedule of Gelman & Meng 1998 / Grosse et al. 2013).

    A pilot run with ``pilot_fraction`` of the main run's steps (on the grid of ``pilot_grid``) records, for each
    step k, the standard deviation over chains of its weight increment, sd_k (within each of ``groups``
    example-major groups of chains, averaged: per-example AIS shares one ladder over a batch). For small steps
    sd_k ~ (beta_k - beta_{k-1}) sigma(beta), so the rate sigma_k = sd_k / (beta_k - beta_{k-1}) is the density in
    which equal steps add equal variance: the main ladder spaces its betas uniformly in Lambda(beta) = int rate,
    with ``floor`` of the mass spread uniformly so that no stretch is left without betas where the pilot saw none
    of the variance. The pilot's chains are thrown away, so the main run's weights stay unbiased.
    ``on_step(k, increment)``: as in ``ais``, for each pilot step (progress)."""
    grid = pilot_betas(num_betas, pilot_fraction)
    sds = []

    def record(k, inc):
        sds.append(inc.view(groups, -1).std(1, unbiased=True).nan_to_num(0.0).mean())
        if on_step is not None:
            on_step(k, inc)

    log_w, _ = ais(path, state, grid, generator, on_step=record)
    rate = (torch.stack(sds).cpu().double() / grid.diff()).clamp(min=0.0)
    total = (rate * grid.diff()).sum()
    rate = (1 - floor) * rate + floor * (total if total > 0 else torch.ones((), dtype=torch.float64))
    pilot_sd = log_w.view(groups, -1).std(1).nan_to_num(0.0).mean().item()
    return Ladder("adaptive", grid, rate, len(grid) - 1, pilot_sd)


def make_ladder(kind: str, num_betas: int, pilot=None, **kwargs) -> Ladder:
    """A ``Ladder``: a fixed one, or (``adaptive``) one from a pilot run; ``pilot()`` returns (path, start state)
    and is called only for an adaptive ladder."""
    check_schedule(kind, num_betas)
    if kind != "adaptive":
        return Ladder(kind)
    path, state = pilot()
    return adaptive_ladder(path, state, num_betas, **kwargs)


# ---- summaries of a set of log-weights -----------------------------------------------------------------


@dataclass
class LogZ:
    """An AIS estimate of log Z with its uncertainty."""

    log_z: float
    stderr: float  # delta method: std(w) / (mean(w) sqrt(n))
    log_z_3sd: tuple[float | None, float | None]  # log(Z_hat -/+ 3 sigma_hat); None where Z_hat - 3 sigma <= 0
    ess: float  # (sum w)^2 / sum w^2
    num_chains: int
    num_betas: int
    direction: str  # forward (AIS, under-estimates log Z in expectation) | reverse (over-estimates)
    seconds: float = 0.0
    log_w_sd: float = 0.0  # standard deviation of the log-weights: far above 1 means a few chains carry the estimate

    @classmethod
    def from_log_w(cls, log_w: torch.Tensor, log_z0: float, direction: str, num_betas: int, seconds: float = 0.0):
        log_w = log_w.double().cpu()
        n = log_w.numel()
        w = torch.exp(log_w - log_w.max())  # relative weights
        mean = w.mean().item()
        rel_sd = (w.std().item() / (mean * math.sqrt(n))) if n > 1 else 0.0  # sigma_hat / estimate
        lme = log_mean_exp(log_w, 0).item()
        ess = (w.sum() ** 2 / (w**2).sum()).item()
        if direction == "forward":  # Z_hat = Z_0 mean(w)
            log_z = log_z0 + lme
            band = (log_z + math.log(1 - 3 * rel_sd) if rel_sd < 1 / 3 else None, log_z + math.log1p(3 * rel_sd))
        else:  # 1 / Z_hat = mean(w) / Z_0
            log_z = log_z0 - lme
            band = (log_z - math.log1p(3 * rel_sd), log_z - math.log(1 - 3 * rel_sd) if rel_sd < 1 / 3 else None)
        log_w_sd = log_w.std().item() if n > 1 else 0.0
        return cls(log_z, rel_sd, band, ess, n, num_betas, direction, seconds, log_w_sd)

    def extras(self, prefix: str = "log_z") -> dict:
        r = lambda v: None if v is None else round(v, 4)  # noqa: E731
        return {prefix: r(self.log_z), f"{prefix}_stderr": r(self.stderr), f"{prefix}_3sd": [r(v) for v in self.log_z_3sd],
                f"{prefix}_ess": round(self.ess, 2), f"{prefix}_num_chains": self.num_chains,
                f"{prefix}_log_w_sd": round(self.log_w_sd, 4), f"{prefix}_num_betas": self.num_betas}

    def to_dict(self) -> dict:
        return asdict(self)
