"""AIS for a Boltzmann machine's partition function (Salakhutdinov & Murray 2008, Sec. 4.1-4.2): the path from
a base-rate model A, and the log Z runs that ``estimator=ais`` / ``raise`` and the DBN estimators make on it.

The intermediate distributions (their Eq. 13-15) mix A into the model,

    p_k(x, h) proportional to exp(-(1 - beta_k) E_A(x) - beta_k E(x, h)),   E_A(x) = -b_A'v - d_A'y (binary v),

so that beta = 0 is A with free hidden units (Z_0 = Z_A 2^H) and beta = 1 the model. ``TemperedRBM`` is that
family seen as a Boltzmann machine, with the methods ``nvil.mcmc.BlockGibbs`` calls on its model, so each AIS
move is one block-Gibbs sweep at beta_k (the compiled kernel with ``accel``, b_A its visible-bias offset);
``RBMPath`` weighs the states with h summed out, log f_beta(x) = -F_beta(x) - (1 - beta) E_A(x).

What depends on the kind of pixel (the base rate's biases, log Z_A, its exact samples) is asked of the model's
visible layer (``nvil.models.visible``).
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

import torch

from nvil.backend import gemm
from nvil.backend.accel import accelerate, check_mode, compiled
from nvil.core.errors import ConfigError
from nvil.core.ops import chunks
from nvil.data import take_rows
from nvil.estimators.annealing import LogZ, ais
from nvil.mcmc.gibbs import BlockGibbs, forward_sweep, forward_sweep_eager, sweep_uniforms
from nvil.models.protocol import CONTINUOUS_LATENTS, FREE_ENERGY, capable
from nvil.models.rbm import BaseRate, BoltzmannMachine, State, as_beta

# ---- the base-rate model A: every switch on the kind of pixel -------------------------------------------------


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
    b = model.visible_layer.base_rate_bias(v_mean, smoothing)
    d = None
    if model.n_labels:
        freq = (mean[model.n_pixels:] + smoothing) / (1 + smoothing)
        d = torch.log(freq / freq.sum())
    return BaseRate(b, d)


class TemperedRBM:
    """p_beta(x, h) proportional to exp(-(1 - beta) E_A(x) - beta E(x, h)): a Boltzmann machine with the base-rate
    model ``base`` mixed in, as ``BlockGibbs`` sees a model (its conditionals at inverse temperature beta, its
    parameters for the compiled kernel, ``visible_offset`` = b_A), with the base-rate side of the AIS path."""

    def __init__(self, model: BoltzmannMachine, base: BaseRate) -> None:
        self.model, self.base = model, base
        self.W, self.b, self.c = model.W, model.b, model.c
        self.n_pixels, self.n_hidden = model.n_pixels, model.n_hidden
        self.fused_gibbs = model.fused_gibbs
        self.visible_offset = base.b  # (1 - beta) b_A joins the tempered visible logits beta (b + W h)

    # ---- what BlockGibbs calls: the hidden side is the model's, the visible side has A mixed in ----------------
    def hidden_input(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.hidden_input(x)

    def sample_h(self, x: torch.Tensor, beta=1.0, generator=None,
                 hidden_input: torch.Tensor | None = None) -> torch.Tensor:
        return self.model.sample_h(x, beta, generator, hidden_input)

    def sample_x_given_h(self, h: torch.Tensor, beta=1.0, generator=None, x: torch.Tensor | None = None,
                         reverse: bool = False) -> torch.Tensor:
        return self.model.sample_x_given_h(h, beta, generator, x=x, reverse=reverse, base=self.base)

    def init_chains(self, x: torch.Tensor, generator=None) -> State:
        return self.model.init_chains(x, generator)  # at beta = 1 the base rate has no weight

    # ---- the base-rate side ------------------------------------------------------------------------------------
    def base_energy(self, x: torch.Tensor) -> torch.Tensor:
        """E_A(x)."""
        v, y = self.model.split(x)
        e = self.model.visible_layer.energy(v, self.base.b)
        return e - y @ self.base.d if y is not None else e

    def base_log_z(self) -> float:
        """log Z_A + H log 2: at beta = 0 the hidden units are free."""
        m, base = self.model, self.base
        log_z = m.visible_layer.base_log_z(base.b)
        if m.n_labels:
            log_z += torch.logsumexp(base.d.double(), 0).item()
        return log_z + m.n_hidden * math.log(2.0)

    def sample_base(self, n: int, generator=None) -> torch.Tensor:
        """n exact samples of x from A."""
        m, base = self.model, self.base
        v = m.visible_layer.sample_base(base.b, n, generator)
        if m.n_labels:
            y = torch.nn.functional.one_hot(torch.multinomial(torch.softmax(base.d, -1).expand(n, -1), 1, generator=generator)
                                            .squeeze(-1), m.n_labels).to(v.dtype)
            v = torch.cat([v, y], -1)
        return v

    def log_f(self, x: torch.Tensor, beta, hidden_input: torch.Tensor | None = None,
              visible_energy: torch.Tensor | None = None, base_energy: torch.Tensor | None = None) -> torch.Tensor:
        """log f_beta(x) = log sum_h p*_beta(x, h) = -F_beta(x) - (1 - beta) E_A(x); a(x), E_vis(x) and E_A(x)
        passed where the caller has them (AIS weighs each state at two betas)."""
        b = as_beta(beta, x)
        beta_per_chain = b.squeeze(-1) if b.dim() else b
        f = self.model.free_energy(x, beta, hidden_input=hidden_input, visible_energy=visible_energy)
        return -(f + (1 - beta_per_chain) * (self.base_energy(x) if base_energy is None else base_energy))


# ---- the path ----------------------------------------------------------------------------------------------


class RBMState(NamedTuple):
    x: torch.Tensor
    a: torch.Tensor  # hidden input c + x'W, shared by log f and the next h | x draw
    e_vis: torch.Tensor | None = None   # E_vis(x), shared by the two log f of the weight increment
    e_base: torch.Tensor | None = None  # E_A(x), likewise


def softplus_difference(a: torch.Tensor, beta_lo, beta_hi) -> torch.Tensor:
    """sum_j softplus(beta_hi a_j) - softplus(beta_lo a_j), 0 <= beta_lo <= beta_hi, term by term: with softplus(x)
    = max(x, 0) + log1p(exp(-|x|)) and d = beta_hi - beta_lo, each term is
    d max(a, 0) + log1p(expm1(-d |a|) sigmoid(-beta_lo |a|)): no overflow, and accurate to a few ulp of itself for
    tiny d and large |a| (the difference of two float32 sums of softplus loses ~1e-4 a step at 784-500).
    sum_j max(a_j, 0) is taken as (sum_j a_j + sum_j |a_j|) / 2, which saves a pass over a."""
    t, d = a.abs(), beta_hi - beta_lo
    log_terms = torch.mul(t, -d).expm1_().mul_(torch.mul(t, -beta_lo).sigmoid_()).log1p_()
    return log_terms.sum(-1) + 0.5 * d * (a.sum(-1) + t.sum(-1))


def log_ratio(a, e_vis, e_base, beta_lo, beta_hi, sign):
    """log f_beta(x) - log f_beta_prev(x) in float64 from a(x), E_vis(x), E_A(x), given the betas in order and
    sign = +1 if beta = beta_hi (forward), -1 if beta = beta_lo: with log f_beta = -beta E_vis
    + sum_j softplus(beta a_j) - (1 - beta) E_A, it is sign (``softplus_difference`` - (beta_hi - beta_lo)
    (E_vis - E_A))."""
    d_energy = ((beta_hi - beta_lo) * (e_vis - e_base)).double()
    return sign * (softplus_difference(a, beta_lo, beta_hi).double() - d_energy)


class RBMPath:
    """The Boltzmann machine annealed from a base-rate model, h summed out in the weights; block Gibbs on
    ``TemperedRBM`` at each beta.

    The weight increment is ``log_ratio`` (one pass over a(x)). For binary RBMs without labels or lateral
    weights (``fused_gibbs``) each move is ``nvil.mcmc.gibbs.forward_sweep`` from ``sweep_uniforms`` (parallel
    streams on the CPU), eager or, with ``accel`` (``compile``, ``cudagraphs``), inside ``fused_step``: one
    compiled kernel for the increment, the sweep and the new state's a(x), E_vis(x), E_A(x). The uniforms are
    drawn outside the kernels, so the random stream is the same in every mode. Other machines move with
    ``BlockGibbs`` on ``TemperedRBM`` (the model's own conditionals)."""

    def __init__(self, model: BoltzmannMachine, base: BaseRate, accel: str = "none") -> None:
        self.model, self.base = model, base
        self.accel = check_mode(accel, model.W.device, "estimator.accel")
        if self.accel != "none":  # a semi-RBM's pixel sweep follows (auto: C on a CPU, Triton on CUDA); none keeps
            model.visible_layer.accelerate(self.accel, model.W.device)  # the layer's mode (e.g. the trainer's)
        self.tempered = TemperedRBM(model, base)
        self.gibbs = BlockGibbs(self.tempered, accel=self.accel)
        self.fused_step = None
        if compiled(accel) and model.fused_gibbs:
            self._kernel = accelerate(self._step_kernel, accel, model.W.device, "estimator.accel")
            self.fused_step = self._fused_step

    def log_z0(self) -> float:
        return self.tempered.base_log_z()

    def sample_base(self, n: int, generator=None) -> RBMState:
        return self.state(self.tempered.sample_base(n, generator))

    def state(self, x: torch.Tensor) -> RBMState:
        m = self.model
        a = gemm.addmm(m.c, x, m.W) if m.fused_gibbs else m.hidden_input(x)  # c + x'W with the bias in the matmul
        return RBMState(x, a, m.visible_energy(x), self.tempered.base_energy(x))

    def log_f(self, state: RBMState, beta: float) -> torch.Tensor:
        return self.tempered.log_f(state.x, beta, state.a, state.e_vis, state.e_base)

    def log_ratio(self, state: RBMState, beta_prev: float, beta: float) -> torch.Tensor:
        """log f_beta(x) - log f_beta_prev(x) (Salakhutdinov & Murray 2008, Eq. 15 over Eq. 14) in one pass over
        a(x) (``log_ratio``), for every kind of visible layer."""
        return log_ratio(state.a, state.e_vis, state.e_base, *ordered(beta_prev, beta))

    def uniforms(self, n: int, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
        """u_h [n, H] and u_x [n, V] for one sweep (``sweep_uniforms``)."""
        m = self.model
        return sweep_uniforms(n, (m.n_hidden, m.n_pixels), generator, m.W.device, m.W.dtype)

    def transition(self, state: RBMState, beta: float, generator=None) -> RBMState:
        """Block Gibbs at beta: h ~ p_beta(h | x), then x ~ p_beta(x | h) (the sweep draws h afresh from x)."""
        if self.model.fused_gibbs:
            t = self.tempered
            u_h, u_x = self.uniforms(state.x.shape[0], generator)
            x, _ = forward_sweep_eager(state.x, state.a, u_h, u_x, beta, t.W, t.b, t.c, t.visible_offset)
            return self.state(x)
        new, _ = self.gibbs.step(State(state.x, None), beta, generator, hidden_input=state.a)
        return self.state(new.x)

    def _step_kernel(self, x, a, e_vis, e_base, u_h, u_x, beta_lo, beta_hi, sign, beta):
        """One AIS step from uniforms u_h, u_x: the increment (``log_ratio``), the sweep at beta, and the new
        state's tensors (a function of tensors only, so it compiles to one kernel)."""
        t = self.tempered
        step = log_ratio(a, e_vis, e_base, beta_lo, beta_hi, sign)
        x, _ = forward_sweep(x, a, u_h, u_x, beta, t.W, t.b, t.c, t.visible_offset)
        return (step, *self.state(x))

    def _fused_step(self, state: RBMState, beta_prev: float, beta: float, generator=None):
        """(the weight increment, the state after the move at beta), from the eager transition's uniforms."""
        x = state.x
        betas = [as_beta(v, x) for v in (*ordered(beta_prev, beta), beta)]
        step, *new = self._kernel(x, state.a, state.e_vis, state.e_base, *self.uniforms(x.shape[0], generator), *betas)
        return step, RBMState(*new)


def ordered(beta_prev: float, beta: float) -> tuple[float, float, float]:
    """(beta_lo, beta_hi, sign) for ``log_ratio``: forward AIS has beta > beta_prev, reverse AIS beta < beta_prev."""
    return (beta_prev, beta, 1.0) if beta >= beta_prev else (beta, beta_prev, -1.0)


# ---- log Z ---------------------------------------------------------------------------------------------------


class ForwardRun(NamedTuple):
    """A forward AIS run: its estimate, its chains' end states and their final log-weights
    log w = sum_k log f_k(x_k) - log f_{k-1}(x_k) (Salakhutdinov & Murray 2008, Sec. 4.1)."""

    estimate: LogZ
    end: RBMState
    log_w: torch.Tensor


def forward_run(path: RBMPath, num_chains: int, betas: torch.Tensor, generator=None,
                progress: bool = False) -> ForwardRun:
    """Forward AIS along ``path`` from the base-rate model over the ladder ``betas``: log Z_hat (an under-estimate in
    expectation), the end states and their log-weights (the weighted end states approximate the model)."""
    t0 = time.perf_counter()
    log_w, end = ais(path, path.sample_base(num_chains, generator), betas, generator, progress, "AIS log Z")
    estimate = LogZ.from_log_w(log_w, path.log_z0(), "forward", len(betas) - 1, time.perf_counter() - t0)
    return ForwardRun(estimate, end, log_w)


def forward_log_z(path: RBMPath, num_chains: int, betas: torch.Tensor, generator=None,
                  progress: bool = False) -> tuple[LogZ, RBMState]:
    """Forward AIS along ``path`` from the base-rate model over the ladder ``betas``: (log Z_hat, an under-estimate
    in expectation; the chains' end states)."""
    run = forward_run(path, num_chains, betas, generator, progress)
    return run.estimate, run.end


def reverse_log_z(path: RBMPath, x_init: torch.Tensor, betas: torch.Tensor, generator=None,
                  progress: bool = False) -> LogZ:
    """Reverse AIS (Grosse, Ghahramani & Adams 2015; Burda, Grosse & Salakhutdinov 2015) from chains at ``x_init``
    (beta = 1) back to the base-rate model, down the ladder ``betas`` (given increasing). From exact samples of the
    RBM exp(log w) is unbiased for Z_0 / Z, so log Z_hat over-estimates log Z in expectation."""
    t0 = time.perf_counter()
    log_w, _ = ais(path, path.state(x_init), betas.flip(0), generator, progress, "reverse AIS log Z")
    return LogZ.from_log_w(log_w, path.log_z0(), "reverse", len(betas) - 1, time.perf_counter() - t0)


def rbm_log_z(model: BoltzmannMachine, base: BaseRate, num_chains: int, betas: torch.Tensor, generator=None,
              progress: bool = False, accel: str = "none") -> LogZ:
    """Forward AIS from the base-rate model: log Z_hat, an under-estimate in expectation."""
    return forward_log_z(RBMPath(model, base, accel), num_chains, betas, generator, progress)[0]


def rbm_log_z_reverse(model: BoltzmannMachine, base: BaseRate, x_init: torch.Tensor, betas: torch.Tensor,
                      generator=None, progress: bool = False, accel: str = "none") -> LogZ:
    """Reverse AIS from ``x_init`` (``reverse_log_z``), an over-estimate in expectation from exact samples."""
    return reverse_log_z(RBMPath(model, base, accel), x_init, betas, generator, progress)


# ---- what estimator=ais needs beside log Z ----------------------------------------------------------------------


def free_energy_log_p(model, data, log_z: float, batch_size: int, progress=None, log_p_star=None) -> torch.Tensor:
    """log p(x) = -F(x) - log Z for every row; ``log_p_star``: another per-row log p*(x) in place of -F(x) (a DBM's
    mean-field bound, ``DBM.variational_bound``)."""
    log_p_star = log_p_star or (lambda x: -model.free_energy(x))
    out = []
    for s0, s1 in chunks(data.shape[0], batch_size):
        out.append((log_p_star(take_rows(data, s0, s1)) - log_z).double().cpu())
        if progress is not None:
            progress.update(s1 - s0)
    return torch.cat(out)


def check_boltzmann(model, name: str) -> None:
    if not capable(model, FREE_ENERGY):
        use = ("ais_hmc, chib_mh or iwae" if capable(model, CONTINUOUS_LATENTS)
               else "ais_posterior, chib, harmonic or iwae (dbn: also dbn_bound)")
        raise ConfigError(f"estimator={name} estimates the partition function of a Boltzmann machine (model=rbm or "
                          f"srbm); this checkpoint holds a {type(model).__name__}: use {use}")
