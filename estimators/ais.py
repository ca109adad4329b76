"""Annealed importance sampling (Neal 2001): one loop, used for an RBM's partition function, for reverse
AIS (estimators/bdmc.py) and for per-example posterior sums (estimator=ais_posterior).

A path is a sequence of unnormalised log densities log f_beta, beta_0 = 0 < ... < beta_K = 1, with a
transition operator T_beta leaving f_beta / Z_beta invariant. From x_0 ~ f_0 / Z_0,

    log w = sum_{k=1}^{K} [log f_{beta_k}(x_{k-1}) - log f_{beta_{k-1}}(x_{k-1})],   x_k ~ T_{beta_k}(. <- x_{k-1}),

so each weight increment is taken *before* the move, at the state the previous operator left (Neal 2001,
Eq. 3; the ordering several public ports get wrong), and E[exp(log w)] = Z_K / Z_0. Run with the betas in
decreasing order from exact samples of f_1 / Z_1 (reverse AIS), exp(log w) is unbiased for Z_0 / Z_K instead.
Log-weights accumulate in float64; averages are log-sum-exps.

Uses here:
- ``RBMPath``: log f_beta(x) = -F_beta(x) - (1 - beta) E_A(x), the RBM annealed from a base-rate model
  with visible biases from smoothed training marginals (Salakhutdinov & Murray 2008, Sec. 4.2), by block
  Gibbs at each beta.
- ``PosteriorPath``: log f_beta(h) = (1 - beta) log Q(h | v) + beta log P*(v, h), from the inference
  network's Q to the posterior, by sequential Gibbs (Murray & Salakhutdinov 2009, Sec. 2.3);
  Z_0 = 1, so exp(log w) is unbiased for sum_h P*(v, h).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
from tqdm import tqdm

from estimators.base import Result, batch_generator, chunks, combine_runs, progress_interval
from models.rbm import BaseRate, BoltzmannMachine, as_beta
from nvil.accel import accelerate, check_mode
from nvil.config import positive_float, positive_int
from nvil.data import take_rows
from nvil.errors import ConfigError
from nvil.mcmc.sequential_gibbs import SequentialGibbs
from nvil.ops import log_mean_exp

SCHEDULES = ("adaptive", "paper", "linear", "sigmoid")
FIXED_SCHEDULES = ("paper", "linear", "sigmoid")
PAPER_SEGMENTS = ((0.0, 0.5, 500), (0.5, 0.9, 4000), (0.9, 1.0, 10000))  # 14,500 steps in all


def check_schedule(kind: str, num_betas: int) -> None:
    positive_int(num_betas, "estimator.num_betas")
    if kind not in SCHEDULES:
        raise ConfigError(f"estimator.schedule must be one of {list(SCHEDULES)}, got {kind!r}")
    if kind == "paper" and num_betas < 3:
        raise ConfigError(f"estimator.schedule=paper needs num_betas >= 3, got {num_betas}")


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
def ais(path, state, betas: torch.Tensor, generator=None, progress: bool = False, desc: str = "AIS", on_step=None):
    """Run AIS along ``path`` from ``state`` through ``betas``; returns (log w [chains] float64, final state).
    ``on_step(k, increment)`` sees each step's weight increments (the pilot run of ``adaptive_ladder``; the
    per-example estimators' progress). ``progress``: an inner bar named ``desc``."""
    b = betas.tolist()
    log_w = None
    fused = getattr(path, "fused_step", None)  # weight increment and move in one call (RBMPath with accel)
    for k in tqdm(range(1, len(b)), disable=not progress, desc=desc, leave=False, unit="beta",
                  mininterval=max(1.0, progress_interval())):
        if fused is not None and k < len(b) - 1:
            step, state = fused(state, b[k - 1], b[k], generator)
        else:
            step = (path.log_f(state, b[k]) - path.log_f(state, b[k - 1])).double()
            if k < len(b) - 1:
                state = path.transition(state, b[k], generator)
        if on_step is not None:
            on_step(k, step)
        log_w = step if log_w is None else log_w + step
    return log_w, state


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


# ---- the RBM partition function --------------------------------------------------------------------------


class RBMState(NamedTuple):
    x: torch.Tensor
    a: torch.Tensor  # hidden input c + x'W, shared by log f and the next h | x draw
    e_vis: torch.Tensor | None = None   # E_vis(x), shared by the two log f of the weight increment
    e_base: torch.Tensor | None = None  # E_A(x), likewise


def base_rate(model: BoltzmannMachine, train: torch.Tensor, smoothing: float = 0.05, batch_size: int = 10000) -> BaseRate:
    """Base-rate model from training marginals: p = (mean + s) / (1 + 2 s) per binary pixel (a pseudo-count of
    s on each side, as in Salakhutdinov's AIS code, so p stays inside (0, 1) even for a pixel that is always on
    or always off), b = logit p; for Gaussian visibles b = the mean; label
    logits from the smoothed label frequencies."""
    mean = torch.zeros(train.shape[1], dtype=torch.float64, device=model.W.device)
    for s0, s1 in chunks(train.shape[0], batch_size):
        rows = train[s0:s1]
        rows = rows.to_dense() if rows.is_sparse else rows
        mean += rows.double().sum(0)
    mean = (mean / train.shape[0]).to(model.W.dtype)
    v_mean = mean[: model.n_pixels]
    if model.visible == "binary":
        p = (v_mean + smoothing) / (1 + 2 * smoothing)
        b = torch.log(p) - torch.log1p(-p)
    else:
        b = v_mean
    d = None
    if model.n_labels:
        freq = (mean[model.n_pixels:] + smoothing) / (1 + smoothing)
        d = torch.log(freq / freq.sum())
    return BaseRate(b, d)


def _fused_ais_kernel(x, a, e_vis, e_base, u_h, u_x, beta_prev, beta, W, b, c, base_b):
    """One AIS step of a binary RBM from uniforms u_h, u_x (drawn in that order): the weight increment
    log f_beta(x) - log f_beta_prev(x), then h ~ p_beta(h | x), x' ~ p_beta(x | h), and x' with its a, E_vis, E_A."""
    def log_f(t):
        return -(t * e_vis - torch.nn.functional.softplus(t * a).sum(-1) + (1 - t) * e_base)

    step = (log_f(beta) - log_f(beta_prev)).double()
    h = (u_h < torch.sigmoid(beta * a)).to(x.dtype)
    x = (u_x < torch.sigmoid(beta * (b + h @ W.T) + (1 - beta) * base_b)).to(x.dtype)
    return step, x, c + x @ W, -(x @ b), -(x @ base_b)


class RBMPath:
    """The Boltzmann machine annealed from a base-rate model: E_beta = (1 - beta) E_A + beta E, h summed out.

    ``accel`` (``nvil.accel``): with ``compile`` or ``cudagraphs``, binary RBMs without labels or lateral weights
    take each AIS step (weight increment and block-Gibbs move) as one compiled kernel, ``fused_step``; the
    uniforms are drawn outside it in the eager order, so the random stream is the same in every mode."""

    def __init__(self, model: BoltzmannMachine, base: BaseRate, accel: str = "none") -> None:
        self.model, self.base = model, base
        self.accel = check_mode(accel, model.W.device, "estimator.accel")
        self.fused_step = None
        if accel != "none" and model.fused_gibbs:
            self._kernel = accelerate(_fused_ais_kernel, accel, model.W.device, "estimator.accel")
            self.fused_step = self._fused_step

    def log_z0(self) -> float:
        """log Z_A + H log 2: at beta = 0 the hidden units are free."""
        m, base = self.model, self.base
        if m.visible == "binary":
            log_z = torch.nn.functional.softplus(base.b.double()).sum().item()
        else:
            log_z = 0.5 * m.n_pixels * math.log(2 * math.pi)
        if m.n_labels:
            log_z += torch.logsumexp(base.d.double(), 0).item()
        return log_z + m.n_hidden * math.log(2.0)

    def sample_base(self, n: int, generator=None) -> RBMState:
        m, base = self.model, self.base
        if m.visible == "binary":
            v = (torch.rand(n, m.n_pixels, generator=generator, device=base.b.device) < torch.sigmoid(base.b)).to(base.b.dtype)
        else:
            v = base.b + torch.randn(n, m.n_pixels, generator=generator, device=base.b.device, dtype=base.b.dtype)
        if m.n_labels:
            y = torch.nn.functional.one_hot(torch.multinomial(torch.softmax(base.d, -1).expand(n, -1), 1, generator=generator)
                                            .squeeze(-1), m.n_labels).to(v.dtype)
            v = torch.cat([v, y], -1)
        return self.state(v)

    def state(self, x: torch.Tensor) -> RBMState:
        m = self.model
        return RBMState(x, m.hidden_input(x), m.visible_energy(x), m.base_energy(x, self.base))

    def log_f(self, state: RBMState, beta: float) -> torch.Tensor:
        return -self.model.free_energy(state.x, beta, self.base, hidden_input=state.a, visible_energy=state.e_vis,
                                       base_energy=state.e_base)

    def _fused_step(self, state: RBMState, beta_prev: float, beta: float, generator=None):
        """(log f_beta(x) - log f_beta_prev(x) in float64, the state after the move at beta)."""
        m, x = self.model, state.x
        n, dev, dt = x.shape[0], x.device, x.dtype
        u_h = torch.rand((n, m.n_hidden), generator=generator, device=dev, dtype=dt)
        u_x = torch.rand((n, m.n_pixels), generator=generator, device=dev, dtype=dt)
        step, *new = self._kernel(x, state.a, state.e_vis, state.e_base, u_h, u_x, as_beta(beta_prev, x),
                                  as_beta(beta, x), m.W, m.b, m.c, self.base.b)
        return step, RBMState(*new)

    def transition(self, state: RBMState, beta: float, generator=None) -> RBMState:
        """Block Gibbs at beta: h ~ p_beta(h | x), then x ~ p_beta(x | h)."""
        m = self.model
        h = m.sample_h(state.x, beta, generator, hidden_input=state.a)
        return self.state(m.sample_x_given_h(h, beta, generator, x=state.x, base=self.base))


def rbm_log_z(model: BoltzmannMachine, base: BaseRate, num_chains: int, betas: torch.Tensor, generator=None,
              progress: bool = False, accel: str = "none") -> LogZ:
    """Forward AIS from the base-rate model: log Z_hat, an under-estimate in expectation."""
    t0 = time.perf_counter()
    path = RBMPath(model, base, accel)
    log_w, _ = ais(path, path.sample_base(num_chains, generator), betas, generator, progress, "AIS log Z")
    return LogZ.from_log_w(log_w, path.log_z0(), "forward", len(betas) - 1, time.perf_counter() - t0)


def rbm_log_z_reverse(model: BoltzmannMachine, base: BaseRate, x_init: torch.Tensor, betas: torch.Tensor,
                      generator=None, progress: bool = False, accel: str = "none") -> LogZ:
    """Reverse AIS (Grosse, Ghahramani & Adams 2015; Burda, Grosse & Salakhutdinov 2015) from chains at ``x_init``
    (beta = 1) back to the base-rate model, the betas in decreasing order. From exact samples of the RBM exp(log w)
    is unbiased for Z_0 / Z, so log Z_hat over-estimates log Z in expectation."""
    t0 = time.perf_counter()
    path = RBMPath(model, base, accel)
    log_w, _ = ais(path, path.state(x_init), betas.flip(0), generator, progress, "reverse AIS log Z")
    return LogZ.from_log_w(log_w, path.log_z0(), "reverse", len(betas) - 1, time.perf_counter() - t0)


def ais_settings(cfg) -> dict:
    """The validated AIS settings of an estimator config (or its ``log_z`` block)."""
    kind = cfg.get("schedule", "adaptive")
    num_betas = positive_int(cfg.get("num_betas"), "num_betas")
    check_schedule(kind, num_betas)
    return {"num_chains": positive_int(cfg.get("num_chains"), "num_chains"), "schedule": kind, "num_betas": num_betas,
            "base_smoothing": positive_float(cfg.get("base_smoothing", 0.05), "base_smoothing")}


def free_energy_log_p(model, data, log_z: float, batch_size: int, progress=None) -> torch.Tensor:
    """log p(x) = -F(x) - log Z for every row."""
    out = []
    for s0, s1 in chunks(data.shape[0], batch_size):
        out.append((-model.free_energy(take_rows(data, s0, s1)) - log_z).double().cpu())
        if progress is not None:
            progress.update(s1 - s0)
    return torch.cat(out)


def check_boltzmann(model, name: str) -> None:
    if not isinstance(model, BoltzmannMachine):
        use = ("ais_hmc, chib_mh or iwae" if getattr(model, "is_continuous_latent", False)
               else "ais_posterior, chib, harmonic or iwae (dbn: also dbn_bound)")
        raise ConfigError(f"estimator={name} estimates the partition function of a Boltzmann machine (model=rbm or "
                          f"srbm); this checkpoint holds a {type(model).__name__}: use {use}")


# ---- per-example AIS over the latent units ---------------------------------------------------------------


class PosteriorState(NamedTuple):
    h: torch.Tensor
    log_p: torch.Tensor  # log P*(v, h)
    log_q: torch.Tensor  # log Q(h | v)


class PosteriorPath:
    """f_beta(h) = Q(h | v)^(1 - beta) P*(v, h)^beta for each chain's own v; sequential Gibbs moves."""

    def __init__(self, joint, q) -> None:
        self.joint, self.q = joint, q

    def state(self, h: torch.Tensor) -> PosteriorState:
        return PosteriorState(h, self.joint.log_prob(h), self.q.log_prob(h))

    def log_f(self, state: PosteriorState, beta: float) -> torch.Tensor:
        return (1 - beta) * state.log_q + beta * state.log_p

    def transition(self, state: PosteriorState, beta: float, generator=None) -> PosteriorState:
        h, _ = SequentialGibbs([(1 - beta, self.q), (beta, self.joint)]).sweep(state.h, generator=generator)
        return self.state(h)
