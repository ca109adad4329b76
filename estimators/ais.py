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

from estimators.base import Result, batch_generator, chunks, combine_runs
from models.rbm import BaseRate, BoltzmannMachine, as_beta
from nvil.accel import accelerate, check_mode
from nvil.config import positive_float, positive_int
from nvil.errors import ConfigError
from nvil.mcmc.sequential_gibbs import SequentialGibbs
from nvil.ops import log_mean_exp

SCHEDULES = ("paper", "linear", "sigmoid")
PAPER_SEGMENTS = ((0.0, 0.5, 500), (0.5, 0.9, 4000), (0.9, 1.0, 10000))  # 14,500 steps in all


def schedule(kind: str, num_betas: int) -> torch.Tensor:
    """num_betas + 1 inverse temperatures from 0 to 1 (num_betas steps, as the papers count them).

    ``paper``: Salakhutdinov & Murray 2008's spacing, uniform within [0, 0.5], [0.5, 0.9] and [0.9, 1]
    with 500 : 4,000 : 10,000 of the steps (exactly those numbers at num_betas = 14,500);
    ``linear``: uniform in [0, 1]; ``sigmoid``: beta_t proportional to sigmoid(4 (2t/T - 1)), rescaled to [0, 1]
    (Grosse et al. 2013; the schedule of Wu et al. 2017's AIS for decoder-based models)."""
    positive_int(num_betas, "estimator.num_betas")
    if kind == "linear":
        return torch.linspace(0.0, 1.0, num_betas + 1, dtype=torch.float64)
    if kind == "sigmoid":
        s = torch.sigmoid(torch.linspace(-4.0, 4.0, num_betas + 1, dtype=torch.float64))
        return (s - s[0]) / (s[-1] - s[0])
    if kind != "paper":
        raise ConfigError(f"estimator.schedule must be one of {list(SCHEDULES)}, got {kind!r}")
    total = sum(n for *_, n in PAPER_SEGMENTS)
    counts = [max(1, round(num_betas * n / total)) for *_, n in PAPER_SEGMENTS[:-1]]
    counts.append(num_betas - sum(counts))
    if counts[-1] < 1:
        raise ConfigError(f"estimator.schedule=paper needs num_betas >= 3, got {num_betas}")
    parts = [torch.linspace(lo, hi, n + 1, dtype=torch.float64)[:-1] for (lo, hi, _), n in zip(PAPER_SEGMENTS, counts)]
    return torch.cat(parts + [torch.ones(1, dtype=torch.float64)])


@torch.no_grad()
def ais(path, state, betas: torch.Tensor, generator=None, progress: bool = False, desc: str = "AIS"):
    """Run AIS along ``path`` from ``state`` through ``betas``; returns (log w [chains] float64, final state)."""
    b = betas.tolist()
    log_w = None
    fused = getattr(path, "fused_step", None)  # weight increment and move in one call (RBMPath with accel)
    for k in tqdm(range(1, len(b)), disable=not progress, desc=desc, leave=False, unit="beta", mininterval=1.0):
        if fused is not None and k < len(b) - 1:
            step, state = fused(state, b[k - 1], b[k], generator)
        else:
            step = (path.log_f(state, b[k]) - path.log_f(state, b[k - 1])).double()
            if k < len(b) - 1:
                state = path.transition(state, b[k], generator)
        log_w = step if log_w is None else log_w + step
    return log_w, state


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
        return cls(log_z, rel_sd, band, ess, n, num_betas, direction, seconds)

    def extras(self, prefix: str = "log_z") -> dict:
        r = lambda v: None if v is None else round(v, 4)  # noqa: E731
        return {prefix: r(self.log_z), f"{prefix}_stderr": r(self.stderr), f"{prefix}_3sd": [r(v) for v in self.log_z_3sd],
                f"{prefix}_ess": round(self.ess, 2), f"{prefix}_num_chains": self.num_chains}

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


def ais_settings(cfg) -> dict:
    """The validated AIS settings of an estimator config (or its ``log_z`` block)."""
    kind = cfg.get("schedule", "paper")
    num_betas = positive_int(cfg.get("num_betas"), "num_betas")
    schedule(kind, num_betas)
    return {"num_chains": positive_int(cfg.get("num_chains"), "num_chains"), "schedule": kind, "num_betas": num_betas,
            "base_smoothing": positive_float(cfg.get("base_smoothing", 0.05), "base_smoothing")}


class AIS:
    """``estimator=ais``: log Z of an RBM or semi-RBM by AIS, and the per-example log p(v) = -F(v) - log Z."""

    name = "ais"

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.settings = ais_settings(cfg)
        self.batch_size = positive_int(cfg.get("batch_size", 1000), "estimator.batch_size")
        self.accel = check_mode(cfg.get("accel", "none"), what="estimator.accel")

    def check(self, model, inference) -> None:
        check_boltzmann(model, self.name)

    def dataset_inputs(self, model, data, split, rows, **_) -> dict:
        return {"train": data.split("train")}

    def log_z(self, model, train, generator, progress) -> LogZ:
        s = self.settings
        base = base_rate(model, train, s["base_smoothing"])
        return rbm_log_z(model, base, s["num_chains"], schedule(s["schedule"], s["num_betas"]), generator, progress,
                         self.accel)

    @torch.no_grad()
    def estimate(self, model, data, *, inference=None, generator, seed: int, progress=None, train=None) -> Result:
        self.check(model, inference)
        t0 = time.perf_counter()
        est = self.log_z(model, train, generator, progress is not None and not progress.disable)
        log_p = free_energy_log_p(model, data, est.log_z, self.batch_size, progress)
        return Result(self.name, log_p, time.perf_counter() - t0, seed,
                      {**est.extras(), "num_betas": est.num_betas, "schedule": self.settings["schedule"]},
                      shared_stderr=est.stderr)


def free_energy_log_p(model, data, log_z: float, batch_size: int, progress=None) -> torch.Tensor:
    """log p(x) = -F(x) - log Z for every row."""
    from nvil.data import take_rows

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
