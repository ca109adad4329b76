"""Adaptive tempered SMC, ours (nvil/estimators/smc.py) against BlackJAX's ``adaptive_tempered_smc``: the error of
log Z at equal numbers of log-density evaluations, on two targets whose log Z is known exactly.

    python bench/smc_vs_blackjax.py                          # 10 seeds x 16, 64, 256 particles, 1 thread (minutes)
    python bench/smc_vs_blackjax.py --quick                  # 4 seeds x 16, 128 particles (under a minute)
    python bench/smc_vs_blackjax.py --seeds 20 --particles 16,64,256,1024 --cess 0.5 --figure /tmp/smc.png

The targets. (a) A linear-Gaussian model, z ~ N(0, I_d), x | z ~ N(W z + b, sigma^2 I_v) (the form of
tests/test_user_model.py's ``LinearGaussianVAE``, here d = 10, v = 20, sigma = 0.5, W ~ 0.8 N(0, 1)), one x drawn
from it; log Z = log p(x) = log N(x; b, W W' + sigma^2 I) in closed form. Both samplers walk the geometric path
from the prior, f_beta(z) = p(z) p(x | z)^beta, and move by HMC with an identity mass matrix, ``--leapfrog`` L
steps of a fixed ``--step-size`` (the same at every beta, on both sides). (b) A binary RBM, 30 visibles x 10
hidden units, W ~ N(0, 3^2), b ~ N(-1, 1), c ~ N(0, 1) (tests/test_certificate.py's ``random_rbm(4, 30, 10,
3.0)``, the sharp machine of tests/test_smc.py), log Z enumerated over the 2^10 hidden states (``log_z_exact``); the base is the base-rate model A
(``base_rate`` of 300 random rows with pixel probability 0.3, smoothing 0.05).

The samplers, one independent run per seed and particle count N:
- ``ours``: ``adaptive_betas`` (a pilot of its own N particles, each next beta by bisection so that the conditional
  ESS share of the step is ``--cess``), then ``smc`` with N fresh particles along that ladder (systematic
  resampling where the ESS falls below N / 2, one move per beta), log Z = ``group_log_z`` (+ log Z_0 where the base
  is not normalised). (a): ``ModelPath`` on ``ProtocolModel(model)`` from its prior, HMC with the step size fixed
  for every beta (``adapt=False``, ``steps``). (b) ``block Gibbs``: ``RBMPath`` (Salakhutdinov & Murray's path
  from A with h summed out in the weights; one block-Gibbs sweep per move). (b) ``heat bath``: ``ModelPath``
  on the RBM written as a protocol model over v (prior A, "likelihood" log p*(v) - log A(v)), moves=gibbs: a
  systematic scan of single-site heat-bath flips, the very path and kernel of the BlackJAX side.
- ``BlackJAX``: ``blackjax.adaptive_tempered_smc(logprior, loglikelihood, kernel, init, params, systematic,
  target_ess=--target-ess, num_mcmc_steps=1)``, stepped in a ``jax.lax.while_loop`` until the tempering parameter
  reaches 1, the whole run one ``jax.jit`` program (compiled once per N, before timing); log Z = the sum of
  ``info.log_likelihood_increment``. Each step resamples every particle (by the previous weights), moves at the
  previous temperature, then weights by the new one; the next temperature solves ESS(delta log L) = target x N
  by bisection on the current particles. (a): ``blackjax.hmc`` with the same step size, L and unit mass, the
  log densities a jax.numpy port of the model's. (b): a JAX kernel of our own in the form the tempered SMC wants
  (``init(position, logdensity_fn)``, ``step(key, state, logdensity_fn)``), a systematic scan of single-site
  heat-bath flips of the 30 visibles on the black-box tempered log density, log p*(v) = b'v + sum_j softplus(c_j +
  (W'v)_j) with h summed out, between the same base-rate A (logprior) and log p*(v) - log A(v) (loglikelihood).

Counting. One unit = one evaluation of the log density of one particle, a value or a value-and-gradient alike
(a gradient costs a few values; the two sides compute the same number of gradients per move). Ours is counted
by instrumentation: every row through the model's ``log_likelihood`` ((a), (b) heat bath; a gradient is one row),
and, for ``RBMPath``, every row through ``path.state`` (log f at a new state: c + W'v, E_vis, E_A) plus one per
row of each block-Gibbs sweep (h | v reuses the cached c + W'v, v | h is one pass through W: counted as one).
The pilot is charged in full. The weight increments and the bisection reuse each particle's cached log f (0).
Per particle: (a) 1 + (L + 2) per move, HMC re-evaluating value-and-gradient at its start (``ModelPath.hmc`` keeps
no gradient between moves) and log f at its end; (b) 1 + 2 per move (block Gibbs) or 1 + V per move (heat
bath), moves at every beta but 0 and 1, in the pilot and in the main run. BlackJAX is counted from its source
(blackjax/smc/{adaptive_tempered,tempered,base,ess}.py of the installed version): per step and particle, one
log-likelihood for the ESS solver (its bisection reuses it), ``mcmc_init_fn`` (HMC: value-and-gradient; the
heat bath: one value), the move (HMC: L value-and-gradients; the heat bath: V values, one per flip), and one
log-likelihood for the new weights: (a) L + 3, (b) V + 3 per step; one step per temperature, the first moving
exact draws of the prior. ``--check-counts`` counts BlackJAX's evaluations at run time instead (a host callback
in each log density: slow, so only for a check) and asserts they equal the formula.

Thread and core: ``--threads N`` (default 1) sets torch.set_num_threads(N), OMP/MKL/OPENBLAS_NUM_THREADS=N and,
for N = 1, XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" before jax is imported.
Seconds are wall seconds per run (mean over seeds); BlackJAX's exclude its compilation (printed apart). At these
sizes ours is Python-bound (one eager torch call per evaluation batch), BlackJAX one compiled program.

Output: a markdown table (model, sampler, particles, temperatures, evaluations, mean |error|, mean error, sd of
the estimate, seconds), each sampler's error ratio at the smallest and largest N (both must fall: flagged
otherwise), the log-log interpolated error of each sampler at BlackJAX's evaluation counts, and a figure
(``--figure``, default docs/figures/smc_vs_blackjax.png): evaluations against mean |error|, one panel per model.
"""

from __future__ import annotations

import argparse
import os
import sys


def _set_threads(argv: list[str]) -> int:
    """Thread counts for torch's and XLA's pools, before either is imported (the module docstring)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--threads", type=int, default=1)
    n = p.parse_known_args(argv)[0].threads
    if n < 1:
        sys.exit(f"--threads must be positive, got {n}")
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(n)
    if n == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
    return n


if __name__ == "__main__":
    THREADS = _set_threads(sys.argv[1:])

import math  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import NamedTuple  # noqa: E402

from certificate_power import random_rbm  # noqa: E402  (W ~ N(0, scale^2), b ~ N(-1, 1), c ~ N(0, 1))
from common import ROOT, cpu_name, markdown_table  # noqa: E402,I001

import numpy as np  # noqa: E402
import torch  # noqa: E402

import blackjax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from blackjax.smc import resampling  # noqa: E402
from blackjax.smc.base import extend_params  # noqa: E402

from nvil.estimators.ais_rbm import RBMPath, base_rate  # noqa: E402
from nvil.estimators.model_paths import ModelPath  # noqa: E402
from nvil.estimators.smc import adaptive_betas, group_log_z, smc  # noqa: E402
from nvil.models.protocol import Latent, ProtocolModel, gaussian_log_prob  # noqa: E402
from nvil.models.rbm import BoltzmannMachine  # noqa: E402

DEFAULT_FIGURE = ROOT / "docs" / "figures" / "smc_vs_blackjax.png"
LOG_2PI = math.log(2 * math.pi)
MAX_STEPS = 10_000  # BlackJAX's while_loop stops here whatever the tempering parameter (never reached here)


# ---- the targets ------------------------------------------------------------------------------------------

class Counted:
    """Rows through ``log_likelihood``, split into values and value-and-gradients (autograd: z requires grad)."""

    def reset(self) -> None:
        self.values, self.grads = 0, 0

    def count(self, z: torch.Tensor) -> None:
        if z.requires_grad:
            self.grads += z.shape[0]
        else:
            self.values += z.shape[0]


class LinearGaussian(Counted):
    """z ~ N(0, I_d), x | z ~ N(W z + b, sigma^2 I_v): tests/test_user_model.py's ``LinearGaussianVAE`` with any d,
    a protocol model (``nvil.models.protocol``) whose log p(x) is closed-form (``exact_log_p``)."""

    def __init__(self, d: int = 10, v: int = 20, sigma: float = 0.5, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.latent = Latent.continuous(d)
        self.W = 0.8 * torch.randn(v, d, generator=g)
        self.b = torch.randn(v, generator=g)
        self.sigma = sigma
        self.reset()

    def log_prior(self, z):
        return gaussian_log_prob(z)

    def log_likelihood(self, x, z):
        self.count(z)
        mu = z @ self.W.T + self.b
        return (-0.5 * ((x - mu) / self.sigma).square() - math.log(self.sigma) - 0.5 * LOG_2PI).sum(-1)

    def sample_prior(self, n, generator):
        return torch.randn(n, self.W.shape[1], generator=generator)

    def sample_likelihood(self, z, generator):
        mu = z @ self.W.T + self.b
        return mu + self.sigma * torch.randn(mu.shape, generator=generator)

    def exact_log_p(self, x) -> float:
        w, b = self.W.double(), self.b.double()
        cov = w @ w.T + self.sigma**2 * torch.eye(w.shape[0], dtype=torch.float64)
        return torch.distributions.MultivariateNormal(b, cov).log_prob(x.double()).item()


class RBMOverVisibles(Counted):
    """The RBM as a protocol model over z = v (binary, V units): log_prior the base-rate model A(v) (normalised),
    log_likelihood log p*(v) - log A(v), so that log p(x, z) = log p*(v) and the path from the prior is the geometric
    path A^(1 - beta) p*^beta whose normaliser at beta = 1 is Z. x is a dummy (one row per chain)."""

    def __init__(self, m: BoltzmannMachine, b_a: torch.Tensor) -> None:
        self.m, self.b_a = m, b_a.detach()
        self.latent = Latent.binary(m.n_pixels)
        self.reset()

    def log_prior(self, z):
        return z @ self.b_a - torch.nn.functional.softplus(self.b_a).sum()

    def log_likelihood(self, x, z):
        self.count(z)
        return -self.m.free_energy(z) - self.log_prior(z)

    def sample_prior(self, n, generator):
        return (torch.rand(n, self.b_a.numel(), generator=generator) < torch.sigmoid(self.b_a)).float()

    def sample_likelihood(self, z, generator):  # the protocol asks for both samplers; x is a dummy here
        return torch.zeros(z.shape[0], 1)


class Targets(NamedTuple):
    lg: LinearGaussian
    x: torch.Tensor           # [v], the one example of (a)
    lg_exact: float
    rbm: BoltzmannMachine
    rbm_path: RBMPath
    rbm_exact: float


def build_targets() -> Targets:
    lg = LinearGaussian()
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        x = lg.sample_likelihood(lg.sample_prior(1, g), g)[0]
        m = random_rbm(4, 30, 10, 3.0)
        data = (torch.rand(300, m.n_pixels, generator=torch.Generator().manual_seed(5)) < 0.3).float()
        path = RBMPath(m, base_rate(m, data, 0.05))
        exact = m.log_z_exact().double().item()
    return Targets(lg, x, lg.exact_log_p(x), m, path, exact)


# ---- ours ---------------------------------------------------------------------------------------------------

class Constant(dict):
    """beta -> the one step-size tensor, for any beta (the pilot's betas are not known in advance)."""

    def __init__(self, step: torch.Tensor) -> None:
        super().__init__()
        self.step = step

    def __missing__(self, beta):
        return self.step


class Run(NamedTuple):
    log_z: float
    temperatures: int
    evaluations: int   # per run, all particles, pilot included
    grads: int         # of which value-and-gradients
    seconds: float


@torch.no_grad()
def ours_linear_gaussian(t: Targets, n: int, seed: int, cess: float, step_size: float, L: int) -> Run:
    pm = ProtocolModel(t.lg, "the linear-Gaussian model")
    rows = t.x.expand(n, -1).contiguous()
    g = torch.Generator().manual_seed(seed)
    t.lg.reset()
    t0 = time.perf_counter()
    step = torch.full((n,), step_size)
    pilot = ModelPath(pm, rows, pm.base("prior", rows), adapt=False, steps=Constant(step), num_leapfrog=L)
    betas = adaptive_betas(pilot, pilot.start(g, step_size), 1, target=cess, generator=g)
    path = ModelPath(pm, rows, pm.base("prior", rows), adapt=False, steps={b: step for b in betas.tolist()},
                     num_leapfrog=L)
    log_w, _, _ = smc(path, path.start(g, step_size), betas, 1, generator=g)
    log_z = group_log_z(log_w, 1).item()  # the prior is normalised: no log Z_0
    sec = time.perf_counter() - t0
    return Run(log_z, len(betas) - 1, t.lg.values + t.lg.grads, t.lg.grads, sec)


class CountedRBMPath:
    """``RBMPath`` with every row through ``state`` (log f at a new state) and each sweep's rows counted."""

    def __init__(self, path: RBMPath) -> None:
        self.path, self.evaluations = path, 0
        self.state_fn = path.state
        path.state = self._state  # transition() calls self.state: the instance attribute is what it finds

    def _state(self, x):
        self.evaluations += x.shape[0]
        return self.state_fn(x)

    def log_f(self, state, beta):
        return self.path.log_f(state, beta)

    def log_ratio(self, state, beta_prev, beta):
        return self.path.log_ratio(state, beta_prev, beta)

    def transition(self, state, beta, generator=None):
        self.evaluations += state.x.shape[0]  # the sweep: one pass through W (v | h); h | v reuses c + W'v
        return self.path.transition(state, beta, generator)

    def sample_base(self, n, generator=None):
        return self.path.sample_base(n, generator)

    def log_z0(self):
        return self.path.log_z0()


@torch.no_grad()
def ours_rbm_block_gibbs(t: Targets, n: int, seed: int, cess: float) -> Run:
    path = CountedRBMPath(t.rbm_path)
    g = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    betas = adaptive_betas(path, path.sample_base(n, g), 1, target=cess, generator=g)
    log_w, _, _ = smc(path, path.sample_base(n, g), betas, 1, generator=g)
    log_z = group_log_z(log_w, 1).item() + path.log_z0()
    sec = time.perf_counter() - t0
    t.rbm_path.state = path.state_fn
    return Run(log_z, len(betas) - 1, path.evaluations, 0, sec)


@torch.no_grad()
def ours_rbm_heat_bath(t: Targets, n: int, seed: int, cess: float) -> Run:
    model = RBMOverVisibles(t.rbm, t.rbm_path.base.b)
    pm = ProtocolModel(model, "the RBM over its visibles")
    rows = torch.zeros(n, 1)
    g = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    path = ModelPath(pm, rows, pm.base("prior", rows), moves="gibbs")
    betas = adaptive_betas(path, path.start(g, 0.0), 1, target=cess, generator=g)
    log_w, _, _ = smc(path, path.start(g, 0.0), betas, 1, generator=g)
    log_z = group_log_z(log_w, 1).item()  # A is normalised and log p(x, z) = log p*(v): this is log Z itself
    sec = time.perf_counter() - t0
    return Run(log_z, len(betas) - 1, model.values + model.grads, 0, sec)


# ---- BlackJAX ---------------------------------------------------------------------------------------------

class CallbackCounter:
    """Particles evaluated, from a host callback in a log density (``--check-counts`` only)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, *_):
        self.n += 1

    def hook(self, value):
        jax.debug.callback(self, value)
        return value


def jax_linear_gaussian(t: Targets, counter: CallbackCounter | None = None):
    """(logprior, loglikelihood) of (a) for one particle z [d], a port of ``LinearGaussian``."""
    W, b, x = (jnp.asarray(a.numpy()) for a in (t.lg.W, t.lg.b, t.x))
    sigma, d = t.lg.sigma, t.lg.W.shape[1]

    def logprior(z):
        return -0.5 * jnp.sum(z * z) - 0.5 * d * LOG_2PI

    def loglik(z):
        mu = W @ z + b
        out = jnp.sum(-0.5 * ((x - mu) / sigma) ** 2 - math.log(sigma) - 0.5 * LOG_2PI)
        return out if counter is None else counter.hook(out)

    return logprior, loglik


def jax_rbm(t: Targets, counter: CallbackCounter | None = None):
    """(logprior, loglikelihood) of (b) for one particle v [V] (floats 0./1.): A(v) and log p*(v) - log A(v)."""
    m = t.rbm
    W, bv, c = (jnp.asarray(a.detach().numpy()) for a in (m.W, m.b, m.c))
    b_a = jnp.asarray(t.rbm_path.base.b.detach().numpy())
    log_z_a = jnp.sum(jax.nn.softplus(b_a))

    def logprior(v):
        return v @ b_a - log_z_a

    def loglik(v):
        out = v @ bv + jnp.sum(jax.nn.softplus(c + v @ W)) - logprior(v)
        return out if counter is None else counter.hook(out)

    return logprior, loglik


class FlipState(NamedTuple):
    position: jax.Array   # [V] of 0. / 1.
    logdensity: jax.Array


class FlipInfo(NamedTuple):
    flips: jax.Array      # units changed in the sweep


def heat_bath_init(position, logdensity_fn):
    return FlipState(position, logdensity_fn(position))


def heat_bath_step(rng_key, state: FlipState, logdensity_fn):
    """One systematic scan of single-site heat-bath updates: unit i set to its other value with probability
    sigmoid(log f(v') - log f(v)), v' = v with unit i flipped (one evaluation of log f per unit)."""
    u = jax.random.uniform(rng_key, state.position.shape)

    def body(i, carry):
        v, lp, flips = carry
        v_new = v.at[i].set(1.0 - v[i])
        lp_new = logdensity_fn(v_new)
        take = u[i] < jax.nn.sigmoid(lp_new - lp)
        return jnp.where(take, v_new, v), jnp.where(take, lp_new, lp), flips + take

    v, lp, flips = jax.lax.fori_loop(0, state.position.shape[0], body, (state.position, state.logdensity, 0))
    return FlipState(v, lp), FlipInfo(flips)


def blackjax_program(logprior, loglik, kernel, init, params, target_ess: float):
    """A jitted run(key, particles0) -> (log Z, steps): adaptive tempered SMC from ``particles0`` (exact draws
    of the prior) until the tempering parameter is 1."""
    sampler = blackjax.adaptive_tempered_smc(logprior, loglik, kernel, init, params, resampling.systematic,
                                             target_ess, num_mcmc_steps=1)

    def run(key, particles):
        state = sampler.init(particles)
        state = state._replace(tempering_param=jnp.zeros((), particles.dtype))

        def cond(carry):
            i, s, _, _ = carry
            return (s.tempering_param < 1.0) & (i < MAX_STEPS)

        def body(carry):
            i, s, k, log_z = carry
            k, sub = jax.random.split(k)
            s, info = sampler.step(sub, s)
            return i + 1, s, k, log_z + info.log_likelihood_increment

        steps, _, _, log_z = jax.lax.while_loop(cond, body, (0, state, key, jnp.zeros((), particles.dtype)))
        return log_z, steps

    return jax.jit(run)


class BlackJAXSide:
    """BlackJAX on one model: ``draw(key, n)`` the prior's exact draws, the program per n (compiled on first use),
    evaluations per particle and step."""

    def __init__(self, which: str, t: Targets, step_size: float, L: int, target_ess: float,
                 counter: CallbackCounter | None = None) -> None:
        self.which, self.target_ess, self.programs, self.compile_s = which, target_ess, {}, {}
        if which == "linear-Gaussian":
            d = t.lg.W.shape[1]
            logprior, loglik = jax_linear_gaussian(t, counter)
            params = extend_params({"step_size": step_size, "inverse_mass_matrix": jnp.ones(d),
                                    "num_integration_steps": L})
            self.kernel = (blackjax.hmc.build_kernel(), blackjax.hmc.init, params)
            self.draw = lambda key, n: jax.random.normal(key, (n, d))
            self.per_step, self.grads_per_step = L + 3, L + 1
        else:
            V = t.rbm.n_pixels
            logprior, loglik = jax_rbm(t, counter)
            p_a = jax.nn.sigmoid(jnp.asarray(t.rbm_path.base.b.detach().numpy()))
            self.kernel = (heat_bath_step, heat_bath_init, {})
            self.draw = lambda key, n: (jax.random.uniform(key, (n, V)) < p_a).astype(jnp.float32)
            self.per_step, self.grads_per_step = V + 3, 0
        self.log_densities = (logprior, loglik)

    def program(self, n: int):
        if n not in self.programs:
            prog = blackjax_program(*self.log_densities, *self.kernel, self.target_ess)
            key = jax.random.key(0)
            t0 = time.perf_counter()
            self.programs[n] = prog.lower(key, self.draw(key, n)).compile()
            self.compile_s[n] = time.perf_counter() - t0
        return self.programs[n]

    def run(self, n: int, seed: int) -> Run:
        prog = self.program(n)
        k_init, k_run = jax.random.split(jax.random.key(seed))
        particles = jax.block_until_ready(self.draw(k_init, n))
        t0 = time.perf_counter()
        log_z, steps = jax.block_until_ready(prog(k_run, particles))
        sec = time.perf_counter() - t0
        steps = int(steps)
        return Run(float(log_z), steps, steps * n * self.per_step, steps * n * self.grads_per_step, sec)


def check_counts(t: Targets, step_size: float, L: int, target_ess: float, n: int = 8) -> None:
    """BlackJAX's evaluations counted at run time (host callbacks in both log-likelihoods; the log-prior is called
    with each log-likelihood, except where the ESS solver and the new weights call the log-likelihood alone) against
    the formula (per step and particle: (a) L + 3, (b) V + 3)."""
    for which in ("linear-Gaussian", "RBM"):
        counter = CallbackCounter()
        side = BlackJAXSide(which, t, step_size, L, target_ess, counter)
        run = side.run(n, seed=0)
        seen = counter.n
        print(f"--check-counts {which}: {run.temperatures} steps x {n} particles, callbacks saw {seen} "
              f"log-likelihood evaluations, the formula says {run.evaluations}", flush=True)
        assert seen == run.evaluations, (which, seen, run.evaluations)


# ---- the benchmark ----------------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=10, help="independent runs per sampler and N (default 10)")
    p.add_argument("--particles", default="16,64,256", help="particle counts N, a comma list (default 16,64,256)")
    p.add_argument("--threads", type=int, default=1, help="torch and XLA threads (default 1)")
    p.add_argument("--figure", default=str(DEFAULT_FIGURE), help="PNG path (default docs/figures/smc_vs_blackjax.png)")
    p.add_argument("--quick", action="store_true", help="4 seeds x N = 16, 128 (under a minute)")
    p.add_argument("--cess", default="0.5,0.9",
                   help="ours: conditional-ESS shares of the adaptive ladder, a comma list (default 0.5,0.9: 0.5 "
                        "matches BlackJAX's target, 0.9 is estimator=smc's default)")
    p.add_argument("--target-ess", type=float, default=0.5, help="BlackJAX's target_ess (default 0.5)")
    p.add_argument("--step-size", type=float, default=0.1, help="HMC step size on (a), both sides (default 0.1)")
    p.add_argument("--leapfrog", type=int, default=10, help="HMC leapfrog steps L on (a), both sides (default 10)")
    p.add_argument("--models", default="linear-Gaussian,RBM", help="which targets (default both)")
    p.add_argument("--check-counts", action="store_true",
                   help="first count BlackJAX's evaluations by host callbacks and assert the formula")
    args = p.parse_args()
    if args.quick:
        args.seeds, args.particles = 4, "16,128"
    args.particles = [int(s) for s in args.particles.split(",") if s.strip()]
    args.cess = [float(s) for s in args.cess.split(",") if s.strip()]
    args.models = [s.strip() for s in args.models.split(",") if s.strip()]
    if args.seeds < 2 or any(n < 2 for n in args.particles) or not args.particles:
        p.error("--seeds and every --particles value must be at least 2")
    if any(not 0 < c < 1 for c in args.cess) or not 0 < args.target_ess < 1:
        p.error("--cess and --target-ess must lie strictly between 0 and 1")
    if set(args.models) - {"linear-Gaussian", "RBM"}:
        p.error("--models takes linear-Gaussian and/or RBM")
    return args


def summarise(runs: list[Run], exact: float) -> dict:
    est = np.array([r.log_z for r in runs])
    err = est - exact
    return {"temperatures": float(np.mean([r.temperatures for r in runs])),
            "evaluations": float(np.mean([r.evaluations for r in runs])),
            "grads": float(np.mean([r.grads for r in runs])),
            "abs_error": float(np.mean(np.abs(err))), "error": float(err.mean()),
            "sd": float(est.std(ddof=1)), "seconds": float(np.mean([r.seconds for r in runs]))}


def at_budget(curve: list[tuple[float, float]], evals: float) -> float | None:
    """Mean |error| at ``evals`` evaluations, interpolated log-log along a sampler's points (None outside them)."""
    xs, ys = np.log([c[0] for c in curve]), np.log([max(c[1], 1e-300) for c in curve])
    order = np.argsort(xs)
    xs, ys = xs[order], ys[order]
    x = math.log(evals)
    if x < xs[0] - 1e-9 or x > xs[-1] + 1e-9:
        return None
    return float(math.exp(np.interp(x, xs, ys)))


def plot(results: dict, path: Path, args) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(results)
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        for sampler, points in results[model]["samplers"].items():
            xs = [p["evaluations"] for p in points]
            ys = [p["abs_error"] for p in points]
            style = "--" if sampler.startswith("BlackJAX") else "-"
            ax.loglog(xs, ys, style, marker="o", label=sampler)
            for p, x, y in zip(points, xs, ys):
                ax.annotate(f"N={p['particles']}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_title(f"{model} (exact log Z = {results[model]['exact']:.3f})")
        ax.set_xlabel("log-density evaluations per run (pilot included)")
        ax.set_ylabel(f"mean |log Z error| over {args.seeds} seeds")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Adaptive tempered SMC: ours (nvil) vs BlackJAX adaptive_tempered_smc")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(THREADS)
    t = build_targets()
    L, eps = args.leapfrog, args.step_size
    print(f"# Adaptive tempered SMC: ours (nvil, torch) vs BlackJAX adaptive_tempered_smc\n"
          f"machine: {cpu_name()}, {os.cpu_count()} cores; {platform.system()} {platform.release()}; python "
          f"{platform.python_version()}; threads {THREADS} (torch {torch.get_num_threads()}, "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}); load average {os.getloadavg()[0]:.1f}\n"
          f"versions: torch {torch.__version__}, jax {jax.__version__}, blackjax {blackjax.__version__}\n"
          f"(a) linear-Gaussian d={t.lg.W.shape[1]}, v={t.lg.W.shape[0]}, sigma={t.lg.sigma}: exact log p(x) = "
          f"{t.lg_exact:.4f}; HMC step {eps}, L={L}, unit mass, on both sides\n"
          f"(b) RBM {t.rbm.n_pixels}x{t.rbm.n_hidden}: exact log Z = {t.rbm_exact:.4f} (enumerated); log Z_A + H log 2"
          f" = {t.rbm_path.log_z0():.4f}\n"
          f"ours: CESS share {args.cess}, resampling at ESS < N/2, pilot of N particles charged; BlackJAX: target_ess "
          f"{args.target_ess}, resampling every step; {args.seeds} seeds x N in {args.particles}", flush=True)
    if args.check_counts:
        check_counts(t, eps, L, args.target_ess)

    results = {}
    for model in args.models:
        exact = t.lg_exact if model == "linear-Gaussian" else t.rbm_exact
        samplers = {}
        if model == "linear-Gaussian":
            for c in args.cess:
                samplers[f"ours HMC (CESS {c})"] = lambda n, s, c=c: ours_linear_gaussian(t, n, s, c, eps, L)
            name = "BlackJAX HMC"
        else:
            for c in args.cess:
                samplers[f"ours block Gibbs (CESS {c})"] = lambda n, s, c=c: ours_rbm_block_gibbs(t, n, s, c)
            for c in args.cess:
                samplers[f"ours heat bath (CESS {c})"] = lambda n, s, c=c: ours_rbm_heat_bath(t, n, s, c)
            name = "BlackJAX heat bath"
        bj = BlackJAXSide(model, t, eps, L, args.target_ess)
        samplers[f"{name} (ESS {args.target_ess})"] = bj.run
        out = {}
        for sampler, fn in samplers.items():
            points = []
            for n in args.particles:
                fn(n, 10_000 + n)  # warm-up (BlackJAX: compiles its program for this N), not recorded
                summary = summarise([fn(n, seed) for seed in range(args.seeds)], exact)
                points.append({"particles": n, **summary})
                print(f"  {model}, {sampler}, N={n}: mean |error| {summary['abs_error']:.4f}, "
                      f"{summary['temperatures']:.1f} temperatures, {summary['seconds']:.3f} s/run", flush=True)
            out[sampler] = points
        results[model] = {"exact": exact, "samplers": out, "compile_s": dict(bj.compile_s)}

    rows = []
    for model, res in results.items():
        for sampler, points in res["samplers"].items():
            for p in points:
                rows.append([model, sampler, str(p["particles"]), f"{p['temperatures']:.1f}",
                             f"{p['evaluations']:,.0f}", f"{p['abs_error']:.4f}", f"{p['error']:+.4f}",
                             f"{p['sd']:.4f}", f"{p['seconds']:.3f}"])
    print(f"\nlog Z error over {args.seeds} seeds per row (error = estimate - exact); evaluations: mean per run, "
          "pilot included (module docstring); seconds: mean wall per run, BlackJAX's compilation excluded")
    print(markdown_table(["model", "sampler", "particles", "temperatures", "log-density evaluations",
                          "mean abs error", "mean error", "sd of estimate", "seconds"], rows))
    for model, res in results.items():
        print(f"BlackJAX compile seconds, {model}: "
              + ", ".join(f"N={n}: {s:.1f}" for n, s in sorted(res["compile_s"].items())))

    print("\nsanity: mean |error| from the smallest to the largest N (must fall for a consistent estimator)")
    for model, res in results.items():
        for sampler, points in res["samplers"].items():
            first, last = points[0]["abs_error"], points[-1]["abs_error"]
            flag = "" if last < first else "  <-- does not fall"
            print(f"  {model}, {sampler}: {first:.4f} (N={points[0]['particles']}) -> {last:.4f} "
                  f"(N={points[-1]['particles']}), x{last / max(first, 1e-300):.2f}{flag}")

    print("\nat equal evaluations: each sampler's mean |error| interpolated (log-log) at BlackJAX's evaluation counts")
    for model, res in results.items():
        samplers = res["samplers"]
        bj_name = next(s for s in samplers if s.startswith("BlackJAX"))
        for p in samplers[bj_name]:
            cells = []
            for sampler, points in samplers.items():
                if sampler == bj_name:
                    continue
                e = at_budget([(q["evaluations"], q["abs_error"]) for q in points], p["evaluations"])
                cells.append(f"{sampler} {'outside its range' if e is None else f'{e:.4f}'}")
            print(f"  {model}, {p['evaluations']:,.0f} evaluations: {bj_name} {p['abs_error']:.4f}; " + "; ".join(cells))

    figure = Path(args.figure)
    plot(results, figure, args)
    print(f"\nfigure: {figure}")


if __name__ == "__main__":
    main()
