"""The fast sequential sweeps make the same chains as the per-unit loops they replace.

- The semi-RBM's pixel sweep (``nvil.models.visible.blocked_sweep``: one matmul per block, then the in-block
  updates with L's [B, B] block) against the per-pixel loop (one matvec per pixel), reproduced here as
  ``reference_pixel_sweep``: the same states from the same generator, forward and reverse, at beta != 1 and
  per-chain beta, with a block size that does not divide the pixels; the sweep with the in-block correction
  left out fails the same check.
- ``SequentialGibbs`` (running probabilities p, s of each softplus factor and pairwise log-products) against
  the running-softplus loop it replaced, reproduced as ``ReferenceSweep``: the same states and log T
  (Murray & Salakhutdinov 2009, Eq. 11) forward, reverse, per-chain directions, tempered, two weighted
  terms, forced and argmax; with the probabilities not moved after a flip it fails the same check.

All in float64 on small random models, where the two roundings cannot reach a different decision.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F


from conftest import make_cfg
from nvil.estimators.chib import Chib
from nvil.estimators.harmonic import Harmonic
from nvil.models.binary_density import DensityBuilder
from nvil.models.rbm import BoltzmannMachine
from nvil.models.visible import LateralBernoulli, blocked_sweep, lateral_block
from nvil.backend import native
from nvil.core.errors import ConfigError
from nvil.learners import build_learner
from nvil.mcmc import sequential_gibbs
from nvil.mcmc.sequential_gibbs import SequentialGibbs

DT = torch.float64


# ---- the per-unit loops (the definitions the fast sweeps are checked against) -----------------------------
def reference_pixel_sweep(field, start, u, lateral, beta, reverse=False):
    """One matvec per pixel: v_i = [u_i < sigmoid(field_i + beta v L[:, i])], in order or reversed."""
    v = start.clone()
    beta_col = beta if beta.dim() == 0 else beta[..., 0]
    n = field.shape[-1]
    for i in (range(n - 1, -1, -1) if reverse else range(n)):
        logit = field[..., i] + beta_col * (v @ lateral[:, i])
        v[..., i] = (u[..., i] < torch.sigmoid(logit)).to(v.dtype)
    return v


class ReferenceSweep:
    """The running-softplus sweep: a_f = h M_f + c_f and S_f = sum softplus(a_f), one softplus per element
    per unit; log T summed unit by unit."""

    def __init__(self, terms):
        self.terms = terms

    def sweep(self, h, *, reverse=False, generator=None, force=None, argmax=False, beta=1.0):
        h = h.clone()
        n = self.terms[0][1].n_units
        fields = []
        for scale, d in self.terms:
            r = d.u + h @ d.J_sym if d.J_sym is not None else d.u
            a = [h @ f.M + f.c for f in d.factors]
            fields.append((scale, d, r, a, [F.softplus(x).sum(-1) for x in a]))
        uniform = None if force is not None or argmax else torch.rand(h.shape, generator=generator, dtype=h.dtype)
        log_t = torch.zeros(h.shape[0], dtype=h.dtype)
        per_chain = torch.is_tensor(reverse)
        pick = lambda t, j: t.gather(1, j[:, None]).squeeze(1) if per_chain else t[:, j]  # noqa: E731
        for i in range(n):
            j = torch.where(reverse, n - 1 - i, i) if per_chain else (n - 1 - i if reverse else i)
            h_j = pick(h, j)
            sign_j = 2 * h_j - 1
            logit, moved = 0.0, []
            for scale, d, r, a, total in fields:
                delta = pick(r, j)
                for k, f in enumerate(d.factors):
                    flipped = F.softplus(a[k] - sign_j[:, None] * f.M[j]).sum(-1)
                    delta = delta + f.sign * sign_j * (total[k] - flipped)
                    moved.append((a, total, k, f.M[j], flipped))
                logit = logit + scale * delta
            logit = logit if not torch.is_tensor(beta) and beta == 1.0 else beta * logit
            if force is not None:
                new = pick(force, j)
            elif argmax:
                new = (logit > 0).to(h.dtype)
            else:
                new = (pick(uniform, j) < torch.sigmoid(logit)).to(h.dtype)
            log_t = log_t + torch.where(new > 0, F.logsigmoid(logit), F.logsigmoid(-logit))
            change = new - h_j
            for n_field, (scale, d, r, a, total) in enumerate(fields):
                if d.J_sym is not None:
                    fields[n_field] = (scale, d, r + change[:, None] * d.J_sym[j], a, total)
            for a, total, k, m, flipped in moved:
                a[k] = a[k] + change[:, None] * m
                total[k] = torch.where(change != 0, flipped, total[k])
            if per_chain:
                h.scatter_(1, j[:, None], new[:, None])
            else:
                h[:, j] = new
        return h, log_t


# ---- the semi-RBM's pixel sweep -----------------------------------------------------------------------------
def pixel_case(chains=12, n=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    lateral = torch.randn(n, n, generator=g, dtype=DT)
    lateral = 0.5 * (lateral + lateral.T)
    lateral.fill_diagonal_(0)
    field = 1.5 * torch.randn(chains, n, generator=g, dtype=DT)
    start = (torch.rand(chains, n, generator=g, dtype=DT) < 0.4).to(DT)
    return field, start, lateral


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("beta", [1.0, 0.35, "per_chain"])
def test_pixel_sweep_matches_the_per_pixel_loop(reverse, beta):
    field, start, lateral = pixel_case()
    beta = torch.linspace(0.1, 1, 12, dtype=DT)[:, None] if beta == "per_chain" else torch.tensor(beta, dtype=DT)
    layer = LateralBernoulli()
    fast = layer.sample_field(field, torch.Generator().manual_seed(5), beta=beta, lateral=lateral, start=start,
                              reverse=reverse)
    u = torch.rand(field.shape, generator=torch.Generator().manual_seed(5), dtype=DT)
    ref = reference_pixel_sweep(field, start, u, lateral, beta, reverse)
    assert torch.equal(fast, ref)
    assert 0.2 < fast.mean() < 0.8 and not torch.equal(fast, start)  # a real sweep: many units set, some moved


@pytest.mark.parametrize("size", [1, 5, 16, 64])
def test_any_block_size_gives_the_same_chain(size):
    field, start, lateral = pixel_case(seed=1)
    u = torch.rand(field.shape, generator=torch.Generator().manual_seed(2), dtype=DT)
    beta = torch.tensor(0.8, dtype=DT)
    fast = blocked_sweep(field, start.clone(), torch.log(u) - torch.log1p(-u), lateral, beta, size=size)
    assert torch.equal(fast, reference_pixel_sweep(field, start, u, lateral, beta))


def test_pixel_sweep_without_the_in_block_correction_fails(monkeypatch):
    def uncorrected(fields, thresholds, old, lateral, beta):
        return (fields > thresholds).to(fields.dtype)

    field, start, lateral = pixel_case()
    beta = torch.tensor(1.0, dtype=DT)
    layer = LateralBernoulli()
    layer.block = uncorrected
    broken = layer.sample_field(field, torch.Generator().manual_seed(5), beta=beta, lateral=lateral, start=start)
    u = torch.rand(field.shape, generator=torch.Generator().manual_seed(5), dtype=DT)
    assert not torch.equal(broken, reference_pixel_sweep(field, start, u, lateral, beta))


# ---- SequentialGibbs ------------------------------------------------------------------------------------------
def density(chains=10, seed=0, scale=1.5):
    """Two latent layers (7, 5) under 9 visibles: a -1 factor for the visibles, another for layer 1 given
    layer 2 (with the pairwise terms it brings), an autoregressive prior on layer 2 and a +1 factor (a summed-out
    RBM layer of 6 units), each example's visibles its own."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: scale * torch.randn(*s, generator=g, dtype=DT)  # noqa: E731
    x = (torch.rand(chains, 9, generator=g, dtype=DT) < 0.5).to(DT)
    d = DensityBuilder(12, chains, x)
    l1, l2 = slice(0, 7), slice(7, 12)
    d.bernoulli(x, r(9), [(l1, r(9, 7))])
    d.bernoulli(l1, r(7), [(l2, r(7, 5))])
    d.bernoulli(l2, r(5), [(l2, torch.tril(r(5, 5), -1))])
    d.softplus_factor(l2, r(5, 6), r(6), +1.0)
    return d.build()


def compare(terms, h, accel="none", **kw):
    """(fast, reference) sweeps from h with the same generator seed; ``accel``: the fast sweep's (none: the eager
    per-unit update, native: the C sweep)."""
    fast = SequentialGibbs(terms, accel=accel).sweep(h, generator=torch.Generator().manual_seed(11), **kw)
    ref = ReferenceSweep(terms).sweep(h, generator=torch.Generator().manual_seed(11), **kw)
    return fast, ref


def start(chains=10, seed=1):
    return (torch.rand(chains, 12, generator=torch.Generator().manual_seed(seed), dtype=DT) < 0.5).to(DT)


DIRECTIONS = {"forward": False, "reverse": True, "per_chain": torch.arange(10) % 3 == 0}


def sweep_case(mode: str, direction: str) -> tuple[list, dict]:
    """(terms, sweep keywords) of one case: ``mode`` sample, force, argmax, tempered (beta per chain) or two_terms
    (the per-example AIS target), in ``direction``."""
    terms = [(0.3, density(seed=4)), (0.7, density())] if mode == "two_terms" else [(1.0, density())]
    kw = {"reverse": DIRECTIONS[direction]}
    if mode == "force":
        kw["force"] = start(seed=2)
    elif mode == "argmax":
        kw["argmax"] = True
    elif mode == "tempered":
        kw["beta"] = torch.linspace(0.2, 1.0, 10, dtype=DT)
    return terms, kw


@pytest.mark.parametrize("accel", ["none", "native"])
@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize("mode", ["sample", "force", "argmax", "tempered", "two_terms"])
def test_sequential_gibbs_matches_the_running_softplus_loop(direction, mode, accel):
    h = start()
    terms, kw = sweep_case(mode, direction)
    (h_fast, t_fast), (h_ref, t_ref) = compare(terms, h, accel, **kw)
    assert torch.equal(h_fast, h_ref)
    torch.testing.assert_close(t_fast, t_ref, rtol=1e-10, atol=1e-10)
    assert mode == "argmax" or not torch.equal(h_fast, h)


def test_sequential_gibbs_with_saturated_and_wide_factors():
    """Inputs a far into the softplus tails (|a| ~ 40) and a factor whose weights leave float32's exp range
    (tables in float64, no pairwise products) still give the reference's chain."""
    d = density(scale=12.0)
    (h_fast, t_fast), (h_ref, t_ref) = compare([(1.0, d)], start(), force=start(seed=3))
    torch.testing.assert_close(t_fast, t_ref, rtol=1e-9, atol=1e-9)
    wide = density()
    wide.factors[0].M[0, 0] = 100.0
    assert wide.factors[0].flip_tables(torch.float32)[0].dtype == torch.float64
    assert wide.factors[0].flip_tables(torch.float32)[2] == 0 and density().factors[1].flip_tables(DT)[2] == 0


def test_sequential_gibbs_without_moving_the_probabilities_fails(monkeypatch):
    def unmoved(base, h_j, pick, mode, beta, coefs, ps, ss, *rest):
        kept_p, kept_s = [t.clone() for t in ps], [t.clone() for t in ss]
        new, logit, _, _ = sequential_gibbs.unit_update(base, h_j, pick, mode, beta, coefs, ps, ss, *rest)
        return new, logit, kept_p, kept_s

    monkeypatch.setitem(sequential_gibbs._UNIT_UPDATE, "none", unmoved)
    (h_fast, t_fast), (h_ref, t_ref) = compare([(1.0, density())], start(), force=start(seed=2))
    assert not torch.allclose(t_fast, t_ref, rtol=1e-6)


def test_the_acceleration_mode_follows_the_kernel():
    """``oriented`` / ``reverse`` keep the kernel's ``accel``; ``none`` is the eager ``unit_update`` itself."""
    gibbs = SequentialGibbs([(1.0, density())])
    assert gibbs.unit is sequential_gibbs.unit_update
    assert gibbs.reverse().accel == gibbs.oriented(torch.arange(10) % 2 == 0).accel == "none"


def test_trainer_and_estimator_accel_reach_the_sweeps():
    """``trainer.accel`` reaches a semi-RBM's pixel sweep through SAP's negative phase, and ``estimator.accel``
    reaches Chib's and the harmonic mean's sweeps; a wrong value is refused in one line."""
    srbm = BoltzmannMachine(6, 3, lateral=True)
    sap = build_learner(make_cfg("train", ["learner=sap"]).learner, srbm, None, torch.device("cpu"), 0)
    assert srbm.visible_layer.block is lateral_block
    sap.accelerate("compile")
    assert srbm.visible_layer.block is not lateral_block
    for estimator in (Chib, Harmonic):
        assert estimator(accel="compile").accel == "compile"
        with pytest.raises(ConfigError, match="estimator.accel"):
            estimator(accel="fast")


@pytest.mark.slow
def test_the_compiled_sweeps_make_the_same_chains():
    """``accel=compile``: the compiled per-unit update and in-block updates give the reference chains (about two
    minutes of compilation, hence slow)."""
    cases = ({}, {"force": start(seed=2)}, {"argmax": True}, {"reverse": torch.arange(10) % 3 == 0},
             {"beta": torch.linspace(0.2, 1, 10, dtype=DT)})
    for kw in cases:
        for terms in ([(1.0, density())], [(0.3, density(seed=4)), (0.7, density())]):
            h, log_t = SequentialGibbs(terms, accel="compile").sweep(start(), generator=torch.Generator().manual_seed(11), **kw)
            h_ref, log_t_ref = ReferenceSweep(terms).sweep(start(), generator=torch.Generator().manual_seed(11), **kw)
            assert torch.equal(h, h_ref), kw
            torch.testing.assert_close(log_t, log_t_ref, rtol=1e-10, atol=1e-10)
    field, s0, lateral = pixel_case()
    layer = LateralBernoulli().accelerate("compile")
    for reverse in (False, True):
        for beta in (torch.tensor(0.6, dtype=DT), torch.linspace(0.1, 1, 12, dtype=DT)[:, None]):
            v = layer.sample_field(field, torch.Generator().manual_seed(5), beta=beta, lateral=lateral, start=s0,
                                   reverse=reverse)
            u = torch.rand(field.shape, generator=torch.Generator().manual_seed(5), dtype=DT)
            assert torch.equal(v, reference_pixel_sweep(field, s0, u, lateral, beta, reverse))


# ---- accel=native: the whole sweep as one C call (nvil.backend.native) ---------------------------------------------------
def wide_density(chains=24, seed=0, scale=1.0):
    """Factors wider than the kernel's 16 lanes and not a multiple of them (K = 37 visibles, 21 + 19 units), with a
    summed-out layer; 2 latent layers (9, 6)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: scale * torch.randn(*s, generator=g, dtype=DT)  # noqa: E731
    x = (torch.rand(chains, 37, generator=g, dtype=DT) < 0.5).to(DT)
    d = DensityBuilder(15, chains, x)
    l1, l2 = slice(0, 9), slice(9, 15)
    d.bernoulli(x, r(37), [(l1, r(37, 9))])
    d.bernoulli(l1, r(9), [(l2, r(9, 6)), (l1, torch.tril(r(9, 9), -1))])
    d.softplus_factor(l2, r(6, 40), r(40), +1.0)
    return d.build()


def native_case(terms, h, accel="native", **kw):
    return SequentialGibbs(terms, accel=accel).sweep(h, generator=torch.Generator().manual_seed(11), **kw)


@pytest.mark.parametrize("products", [1, 3, 64])
def test_native_sweep_on_wide_factors_in_two_threads(products, monkeypatch):
    """K past the 16 lanes and not a multiple of them, products of 1, 3 or 64 terms per log, chains split over two
    threads, per-chain directions and tempering: the reference's chain and log T."""
    from nvil.models.binary_density import SoftplusFactor

    monkeypatch.setattr(SoftplusFactor, "products_per_log", lambda self, dtype, most=64: products)
    terms = [(0.4, wide_density(seed=3)), (0.6, wide_density())]
    h0 = (torch.rand(24, 15, generator=torch.Generator().manual_seed(1), dtype=DT) < 0.5).to(DT)
    kw = {"reverse": torch.arange(24) % 3 == 0, "beta": torch.linspace(0.3, 1.0, 24, dtype=DT)}
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        h_fast, t_fast = native_case(terms, h0, **kw)
    finally:
        torch.set_num_threads(threads)
    h_ref, t_ref = ReferenceSweep(terms).sweep(h0, generator=torch.Generator().manual_seed(11), **kw)
    assert torch.equal(h_fast, h_ref) and not torch.equal(h_fast, h0)
    torch.testing.assert_close(t_fast, t_ref, rtol=1e-10, atol=1e-10)


def test_native_sweep_in_float32_agrees_with_the_eager_sweep():
    """float32 (the default dtype): the same decisions as the eager sweep but for rounding ties, log T to float
    rounding."""
    d32 = wide_density(chains=200, scale=0.7)
    d32 = type(d32)(d32.n_units, d32.u.float(), d32.const.float(), d32.J.float(),
                    [type(f)(f.M.float(), f.c.float(), f.sign, f.lo, f.hi) for f in d32.factors])
    h0 = (torch.rand(200, 15, generator=torch.Generator().manual_seed(1)) < 0.5).float()
    h_fast, t_fast = native_case([(1.0, d32)], h0, force=h0.flip(0))
    h_ref, t_ref = SequentialGibbs([(1.0, d32)]).sweep(h0, force=h0.flip(0))
    assert torch.equal(h_fast, h_ref)
    torch.testing.assert_close(t_fast, t_ref, rtol=1e-5, atol=1e-4)
    h_fast, _ = native_case([(1.0, d32)], h0)
    h_ref, _ = SequentialGibbs([(1.0, d32)]).sweep(h0, generator=torch.Generator().manual_seed(11))
    assert (h_fast != h_ref).float().mean() < 1e-3


def test_native_sweep_with_a_wrong_sign_fails():
    """Power: the C sweep given the factors' coefficients with the wrong sign is not the reference's chain."""
    h0 = (torch.rand(24, 15, generator=torch.Generator().manual_seed(1), dtype=DT) < 0.5).to(DT)
    wrong = wide_density()
    for f in wrong.factors:
        f.sign = -f.sign
    h_bad, _ = native_case([(1.0, wrong)], h0)
    h_ref, _ = ReferenceSweep([(1.0, wide_density())]).sweep(h0, generator=torch.Generator().manual_seed(11))
    assert not torch.equal(h_bad, h_ref)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("beta", [1.0, 0.35, "per_chain"])
@pytest.mark.parametrize("mode", ["native", "auto"])
def test_native_pixel_sweep_matches_the_per_pixel_loop(reverse, beta, mode):
    field, s0, lateral = pixel_case()
    beta = torch.linspace(0.1, 1, 12, dtype=DT)[:, None] if beta == "per_chain" else torch.tensor(beta, dtype=DT)
    layer = LateralBernoulli().accelerate(mode, "cpu")
    fast = layer.sample_field(field, torch.Generator().manual_seed(5), beta=beta, lateral=lateral, start=s0,
                              reverse=reverse)
    u = torch.rand(field.shape, generator=torch.Generator().manual_seed(5), dtype=DT)  # the eager sweep's uniforms
    assert torch.equal(fast, reference_pixel_sweep(field, s0, u, lateral, beta, reverse))
    eager = LateralBernoulli().sample_field(field, torch.Generator().manual_seed(5), beta=beta, lateral=lateral,
                                            start=s0, reverse=reverse)
    assert torch.equal(fast, eager)  # one chain for a seed, in C or eagerly


@pytest.mark.parametrize("kernel", ["list", "tiled"])
@pytest.mark.parametrize("reverse", [False, True])
def test_both_native_pixel_kernels_make_the_per_pixel_chain(kernel, reverse):
    """Both C pixel kernels (``list``: sums of the rows of the units that are on; ``tiled``: a register-tiled product
    over chains, the default with AVX-512) on several full blocks and a narrower one, 13 chains (not a whole number of
    tiles), per-chain beta: the per-pixel loop's states for the kernel's own uniforms, in float64."""
    field, s0, lateral = pixel_case(chains=13, n=150, seed=3)
    beta = torch.linspace(0.2, 1.3, 13, dtype=DT)
    v = s0.clone()
    native.lateral_sweep(v, field, None, beta, reverse, lateral, seed=77, kernel=kernel)
    u = native.uniforms(13, 150, 77, DT)
    assert torch.equal(v, reference_pixel_sweep(field, s0, u, lateral, beta[:, None], reverse))


def test_the_tiled_pixel_kernel_agrees_with_the_list_kernel_in_float32():
    """MNIST-sized pixels in float32 (100 chains, 784 units, L ~ N(0, 0.02)): the kernels sum the lateral field in
    different orders, so a decision may differ where a field meets its threshold to rounding; at most 1 in 10^4."""
    g = torch.Generator().manual_seed(4)
    lateral = 0.02 * torch.randn(784, 784, generator=g)
    lateral = torch.triu(lateral, 1) + torch.triu(lateral, 1).T
    field, s0 = torch.randn(100, 784, generator=g), (torch.rand(100, 784, generator=g) < 0.2).float()
    runs = []
    for kernel in ("list", "tiled"):
        v = s0.clone()
        native.lateral_sweep(v, field, None, torch.ones(100), False, lateral, seed=5, kernel=kernel)
        runs.append(v)
    assert (runs[0] != runs[1]).float().mean() <= 1e-4 and not torch.equal(runs[0], s0)


@pytest.mark.parametrize("kernel", ["list", "tiled"])
def test_both_pixel_kernels_split_the_chains_over_threads_without_changing_a_decision(kernel):
    """800 chains (three ranges of 266-267 at 3 threads: not whole tiles), each range with its own scratch in the
    OpenMP driver (``threads.h``): the same states as one thread, bit for bit, and the per-pixel chain."""
    field, s0, lateral = pixel_case(chains=800, n=90, seed=6)
    beta = torch.linspace(0.2, 1.3, 800, dtype=DT)
    runs, threads = [], torch.get_num_threads()
    try:
        for t in (1, 3):
            torch.set_num_threads(t)
            v = s0.clone()
            native.lateral_sweep(v, field, None, beta, True, lateral, seed=8, kernel=kernel)
            runs.append(v)
    finally:
        torch.set_num_threads(threads)
    u = native.uniforms(800, 90, 8, DT)
    assert torch.equal(runs[0], runs[1])
    assert torch.equal(runs[1], reference_pixel_sweep(field, s0, u, lateral, beta[:, None], True))


def uniformity_z_scores(u: torch.Tensor) -> dict[str, float]:
    """|z| of the mean and variance against U(0, 1)'s, the Kolmogorov-Smirnov distance in units of its 1/sqrt(n)
    scale, and |z| of the lag-one correlations along units and across chains (each ~N(0, 1 / n) if independent)."""
    x = u.double().flatten()
    n = x.numel()
    xs = x.sort().values
    grid = torch.arange(1, n + 1, dtype=torch.float64) / n
    centred = u.double() - 0.5
    lag_unit = (centred[:, 1:] * centred[:, :-1]).flatten()
    lag_chain = (centred[1:] * centred[:-1]).flatten()
    return {"mean": abs(x.mean().item() - 0.5) / math.sqrt(1 / 12 / n),
            "variance": abs(x.var().item() - 1 / 12) / math.sqrt(1 / 180 / n),  # var of (U - 1/2)^2 is 1/180
            "ks": (xs - grid).abs().max().item() * math.sqrt(n),
            "lag_unit": abs(lag_unit.mean().item()) / math.sqrt(1 / 144 / lag_unit.numel()),
            "lag_chain": abs(lag_chain.mean().item()) / math.sqrt(1 / 144 / lag_chain.numel())}


LIMITS = {"mean": 4.0, "variance": 4.0, "ks": 1.95, "lag_unit": 4.0, "lag_chain": 4.0}  # KS: P(> 1.95) = 0.001


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_native_uniforms_are_uniform_independent_and_inside_the_unit_interval(dtype):
    """The pixel sweep's counter-based uniforms (SplitMix64): 600 x 784 draws pass the mean, variance, KS and lag-one
    correlation checks (along units: the float draws' two halves of one word; across chains); every one strictly
    inside (0, 1), so its threshold is finite; a draw depends on (seed, chain, unit) only; two seeds differ."""
    seed = native.seed_from(torch.Generator().manual_seed(3))
    u = native.uniforms(600, 784, seed, dtype)
    assert 0 < u.min() and u.max() < 1 and torch.isfinite(torch.log(u / (1 - u))).all()
    z = uniformity_z_scores(u)
    assert all(z[k] < LIMITS[k] for k in LIMITS), z
    assert torch.equal(native.uniforms(1200, 392, seed, dtype), u.reshape(1200, 392))  # the counter, not the shape
    assert (native.uniforms(600, 784, seed + 1, dtype) != u).float().mean() > 0.99


@pytest.mark.parametrize("broken", ["skewed", "correlated_units", "correlated_chains"])
def test_uniformity_check_has_power(broken):
    """The same checks fail for draws that are not uniform (u^1.05) or copy a neighbour's value into every other
    unit or chain."""
    u = native.uniforms(600, 784, 11, torch.float64)
    if broken == "skewed":
        u = u ** 1.05
    elif broken == "correlated_units":
        u[:, 1::2] = u[:, 0::2]
    else:
        u[1::2] = u[0::2]
    z = uniformity_z_scores(u)
    assert any(z[k] > 2 * LIMITS[k] for k in LIMITS), z


def test_native_pixel_sweep_draws_the_same_chains_in_any_number_of_threads(monkeypatch):
    """600 chains in one thread or in two ranges of chains: the same uniforms (by chain and unit), the same sweep."""
    field, s0, lateral = pixel_case(chains=600, n=70)
    runs = []
    for threads in (1, 2):
        monkeypatch.setattr(torch, "get_num_threads", lambda t=threads: t)
        layer = LateralBernoulli().accelerate("native", "cpu")
        runs.append(layer.sample_field(field, torch.Generator().manual_seed(9), beta=torch.tensor(0.8, dtype=DT),
                                       lateral=lateral, start=s0))
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], s0)


@pytest.mark.parametrize("kernel", ["list", "tiled"])
def test_native_pixel_sweep_without_the_lateral_field_fails(kernel):
    """Power: the C pixel sweep with the lateral field left out (its scale beta set to 0) is not the per-pixel chain."""
    field, s0, lateral = pixel_case()
    u = torch.rand(field.shape, generator=torch.Generator().manual_seed(5), dtype=DT)
    v = s0.clone()
    native.lateral_sweep(v, field, torch.log(u) - torch.log1p(-u), torch.zeros(12, dtype=DT), False, lateral,
                         kernel=kernel)
    assert not torch.equal(v, reference_pixel_sweep(field, s0, u, lateral, torch.tensor(1.0, dtype=DT)))


def test_native_mode_errors_and_fallback(monkeypatch):
    """accel=native off the CPU, or where no C compiler works, is a one-line ConfigError; accel=auto there warns once
    and runs the eager sweep (the same chain)."""
    from nvil.backend import native
    from nvil.backend.accel import check_mode

    with pytest.raises(ConfigError, match="estimator.accel=native .* CPU"):
        check_mode("native", "cuda", "estimator.accel")
    assert check_mode("auto", "cuda") == "auto"
    with pytest.raises(ConfigError, match="on the CPU"):
        native.wanted("native", torch.device("cuda"))
    assert not native.wanted("auto", torch.device("cuda")) and not native.wanted("none", "cpu")
    monkeypatch.setattr(native, "_library", None)
    monkeypatch.setattr(native, "_warned", False)
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setenv("NVIL_NATIVE_CACHE", "/tmp/nvil-native-test-empty")
    with pytest.raises(ConfigError, match="compile"):
        native.wanted("native", "cpu")
    with pytest.warns(UserWarning, match="eagerly"):
        h_auto, t_auto = native_case([(1.0, density())], start(), accel="auto")
    h_ref, t_ref = ReferenceSweep([(1.0, density())]).sweep(start(), generator=torch.Generator().manual_seed(11))
    assert torch.equal(h_auto, h_ref)
