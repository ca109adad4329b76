"""The fast pieces of RBM AIS (``nvil.estimators.ais_rbm``, ``nvil.mcmc.gibbs``) against their references: the weight
increment in one pass against the difference of two log f in float64, the eager in-place sweep against
``forward_sweep`` for the same uniforms, the parallel uniform streams (a function of the generator's state, not of
the thread count), and AIS log Z against enumeration. Each check has a broken variant that must fail it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from nvil.backend import native
from nvil.backend.native.bernoulli_log_prob import in_c
from nvil.core.ops import bernoulli_log_prob
from nvil.estimators.ais_rbm import base_rate, rbm_log_z
from nvil.estimators.annealing import schedule
from nvil.estimators.ais_rbm import RBMPath, ordered, softplus_difference
from nvil.models.rbm import BoltzmannMachine
from nvil.mcmc.gibbs import forward_sweep, forward_sweep_eager, sweep_uniforms

DT = torch.float64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def machine(visible="binary", lateral=False, n_labels=0, dtype=DT) -> BoltzmannMachine:
    torch.manual_seed(0)
    m = BoltzmannMachine(10, 6, visible=visible, lateral=lateral, n_labels=n_labels).to(dtype)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.7)
    return m


# ---- the increment ---------------------------------------------------------------------------------------


def softplus_difference_reference(a, beta_lo, beta_hi):
    """In float64, softplus as log(1 + e^x) exactly (F.softplus returns x itself above x = 20, off by up to 2e-9)."""
    a = a.double()
    softplus = lambda x: torch.logaddexp(torch.zeros_like(x), x)  # noqa: E731
    return (softplus(beta_hi * a) - softplus(beta_lo * a)).sum(-1)


def broken_softplus_difference(a, beta_lo, beta_hi):  # forgets the max(a, 0) part of softplus
    t, d = a.abs(), beta_hi - beta_lo
    return torch.log1p(torch.expm1(-d * t) * torch.sigmoid(-beta_lo * t)).sum(-1)


def two_float_sums(a, beta_lo, beta_hi):  # the old way: the difference of two sums of softplus
    softplus = lambda x: torch.logaddexp(torch.zeros_like(x), x)  # noqa: E731
    return softplus(beta_hi * a).sum(-1) - softplus(beta_lo * a).sum(-1)


def increment_matches(fn, dtype) -> bool:
    a = torch.cat([torch.randn(4, 50, generator=gen(0), dtype=DT) * 3,
                   torch.tensor([[-1e4, -200.0, -30.0, 0.0, 1e-8, 30.0, 200.0, 1e4] * 6 + [5.0, -5.0]], dtype=DT)], 0)
    for beta_lo, beta_hi in [(0.0, 1e-4), (0.0, 1.0), (0.5, 0.5 + 1e-6), (0.9, 0.90001), (0.3, 0.7), (1.0, 1.0)]:
        ref = softplus_difference_reference(a, beta_lo, beta_hi)
        got = fn(a.to(dtype), beta_lo, beta_hi).double()
        # float32: a few ulp of the terms (~ d |a|), where the difference of two float32 sums loses ulps of the
        # sums (~ |a|); float64: the float64 reference's own rounding, ulps of its sums
        size = a.abs().sum(-1)
        tol = 1e-14 * size if dtype == DT else 1e-6 * (1 + (beta_hi - beta_lo) * size)
        if not bool(((got - ref).abs() <= tol).all()):
            return False
    return True


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_one_pass_increment_equals_the_difference_of_softplus_sums(dtype):
    assert increment_matches(softplus_difference, dtype)
    assert not increment_matches(broken_softplus_difference, dtype)
    assert increment_matches(two_float_sums, DT) and not increment_matches(two_float_sums, torch.float32)


@pytest.mark.parametrize("kind", ["binary", "gaussian", "labels", "lateral"])
def test_log_ratio_is_the_difference_of_log_f_forward_and_reverse(kind):
    m = machine(visible="gaussian" if kind == "gaussian" else "binary", lateral=kind == "lateral",
                n_labels=3 if kind == "labels" else 0)
    data = torch.rand(40, m.n_visible, generator=gen(1), dtype=DT)
    data[:, : m.n_pixels] = data[:, : m.n_pixels] if kind == "gaussian" else (data[:, : m.n_pixels] < 0.4).to(DT)
    if m.n_labels:
        data[:, m.n_pixels:] = F.one_hot(torch.arange(40) % 3, 3).to(DT)
    path = RBMPath(m, base_rate(m, data))
    state = path.state(data[:20])
    for beta_prev, beta in [(0.0, 0.01), (0.4, 0.41), (0.41, 0.4), (1.0, 0.0), (0.2, 0.2)]:
        ref = path.log_f(state, beta) - path.log_f(state, beta_prev)
        torch.testing.assert_close(path.log_ratio(state, beta_prev, beta), ref, rtol=0, atol=1e-10)
        lo, hi, sign = ordered(beta_prev, beta)
        if beta != beta_prev:  # the reverse direction's sign matters
            wrong = -sign * (path.log_ratio(state, beta_prev, beta) * sign)
            assert not torch.allclose(wrong, ref, rtol=0, atol=1e-6)


# ---- the sweep -----------------------------------------------------------------------------------------


def broken_sweep(x, a, u_h, u_x, beta, W, b, c, offset=None):  # compares the visible side the wrong way round
    xs, h = forward_sweep_eager(x, a, u_h, u_x, beta, W, b, c, offset)
    return 1 - xs, h


@pytest.mark.parametrize("offset", [False, True])
def test_eager_sweep_draws_what_forward_sweep_draws_from_the_same_uniforms(offset):
    m = machine()
    base = torch.randn(m.n_pixels, generator=gen(2), dtype=DT) if offset else None
    x = (torch.rand(300, m.n_pixels, generator=gen(3), dtype=DT) < 0.5).to(DT)
    u_h, u_x = (torch.rand(300, n, generator=gen(4), dtype=DT) for n in (m.n_hidden, m.n_pixels))
    args = (u_h, u_x, 0.37, m.W.detach(), m.b.detach(), m.c.detach(), base)
    with torch.no_grad():
        ref_x, ref_h = forward_sweep(x, None, *args)
        for fn, same in ((forward_sweep_eager, True), (broken_sweep, False)):
            new_x, new_h = fn(x, torch.addmm(m.c, x, m.W), *args)
            assert torch.equal(new_h, ref_h)
            assert torch.equal(new_x, ref_x) is same
            assert new_x.dtype == x.dtype


# ---- the uniforms --------------------------------------------------------------------------------------


def same_seed_for_every_block(n, widths, generator=None, device="cpu", dtype=torch.float32):
    """A broken source: every block of chains from one seed, so the blocks repeat each other."""
    return tuple(torch.cat([torch.rand((s1 - s0, w), generator=torch.Generator().manual_seed(7), dtype=dtype)
                            for s0, s1 in [(0, 256), (256, n)]]) for w in widths)


def blocks_are_distinct(source) -> bool:
    u_h, u_x = source(512, (5, 7), gen(0))
    return not torch.equal(u_h[:256], u_h[256:]) and not torch.equal(u_x[:256], u_x[256:])


def test_sweep_uniforms_follow_the_generator_not_the_threads():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = sweep_uniforms(700, (50, 30), gen(5))
        torch.set_num_threads(2)
        two = sweep_uniforms(700, (50, 30), gen(5))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one, two):
        assert torch.equal(a, b) and a.dtype == torch.float32 and a.is_contiguous()
    g = gen(5)
    first, second = sweep_uniforms(700, (50, 30), g), sweep_uniforms(700, (50, 30), g)
    assert torch.equal(first[0], one[0]) and not torch.equal(second[0], first[0])  # the generator advances
    assert sweep_uniforms(3, (4,), gen(0), dtype=torch.float64)[0].dtype == torch.float64
    assert blocks_are_distinct(sweep_uniforms) and not blocks_are_distinct(same_seed_for_every_block)


def test_sweep_uniforms_are_uniform_and_uncorrelated():
    u = torch.cat([t.flatten() for t in sweep_uniforms(2000, (100, 150), gen(9))]).double()
    n = u.numel()
    assert 0 <= u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 5 * math.sqrt(1 / 12 / n)
    assert abs(u.var().item() - 1 / 12) < 5 * 0.0745 / math.sqrt(n)  # sd of the sample variance of U(0, 1)
    counts = torch.histc(u, bins=20, min=0, max=1)
    chi2 = ((counts - n / 20) ** 2 / (n / 20)).sum().item()
    assert chi2 < 60  # 19 degrees of freedom: p ~ 1e-6
    lag = torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1].item()
    assert abs(lag) < 5 / math.sqrt(n)


# ---- the estimate ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("accel", ["none", "compile", "auto"])
def test_fast_ais_finds_the_exact_log_z(accel):
    m = machine(dtype=torch.float32)
    data = (torch.rand(200, m.n_pixels, generator=gen(6)) < 0.3).float()
    exact = m.log_z_exact().item()
    est = rbm_log_z(m, base_rate(m, data), 400, schedule("linear", 300), gen(8), accel=accel)
    assert abs(est.log_z - exact) < 4 * est.stderr + 0.01, (est.log_z, exact, est.stderr)


def semi_rbm() -> tuple[BoltzmannMachine, torch.Tensor]:
    """A semi-RBM small enough to enumerate (6 pixels, 3 hidden units), N(0, 0.5^2) parameters, and 200 data rows."""
    torch.manual_seed(0)
    m = BoltzmannMachine(6, 3, lateral=True)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5)
    return m, (torch.rand(200, 6, generator=gen(6)) < 0.3).float()


@pytest.mark.parametrize("accel", ["none", "auto"])
def test_semi_rbm_ais_follows_estimator_accel_and_finds_the_exact_log_z(accel):
    """A semi-RBM's AIS moves its pixels by the layer's sequential sweep, which ``estimator.accel`` now reaches
    (``auto``: the C sweep on a CPU, the Triton kernel on CUDA); the estimate stays within 4 SE of log Z by
    enumeration either way."""
    m, data = semi_rbm()
    est = rbm_log_z(m, base_rate(m, data), 400, schedule("linear", 300), gen(8), accel=accel)
    assert m.visible_layer.sweep_mode == accel  # none: the layer's own mode, eager for a fresh model
    exact = m.log_z_exact().item()
    assert abs(est.log_z - exact) < 4 * est.stderr + 0.01, (est.log_z, exact, est.stderr)


def test_semi_rbm_ais_with_the_lateral_sweep_left_out_fails(monkeypatch):
    """Power: the pixel sweep given L = 0 (a kernel that does not leave the semi-RBM's p_beta invariant) misses the
    exact log Z by more than the same tolerance."""
    import nvil.models.visible

    sweep = nvil.models.visible.native_sweep
    monkeypatch.setattr(nvil.models.visible, "native_sweep", lambda field, v, lateral, *a: sweep(field, v, 0 * lateral, *a))
    m, data = semi_rbm()
    est = rbm_log_z(m, base_rate(m, data), 400, schedule("linear", 300), gen(8), accel="auto")
    assert abs(est.log_z - m.log_z_exact().item()) > 4 * est.stderr + 0.01


def test_one_seed_for_every_sweep_fails(monkeypatch):
    """Power of the ``auto`` row above (``sweep_uniforms``' streams from one seed per sweep): the same seed for every
    sweep (so every sweep compares with the same uniforms, and the moves are no longer independent given the
    state) leaves the same tolerance."""
    monkeypatch.setattr(native, "seed_from", lambda generator: 12345)
    m = machine(dtype=torch.float32)
    data = (torch.rand(200, m.n_pixels, generator=gen(6)) < 0.3).float()
    est = rbm_log_z(m, base_rate(m, data), 400, schedule("linear", 300), gen(8), accel="auto")
    assert abs(est.log_z - m.log_z_exact().item()) > 4 * est.stderr + 0.01, (est.log_z, est.stderr)


@pytest.mark.usefixtures("native_kernels")
def test_the_c_kernels_do_not_depend_on_the_threads():
    """The C kernels split their rows over torch's OpenMP threads (one runtime in the process: the library links
    the one torch loaded); 1, 2 and 3 threads give the same Bernoulli log-probabilities bit for bit."""
    logits = torch.randn(3000, 200, generator=gen(1))
    value = (torch.rand(3000, 200, generator=gen(2)) < 0.5).float()
    threads, results = torch.get_num_threads(), []
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            results.append(in_c(logits, value))
    finally:
        torch.set_num_threads(threads)
    for out in results[1:]:
        assert torch.equal(out, results[0])
    assert torch.allclose(results[0], bernoulli_log_prob(logits, value), rtol=1e-5, atol=1e-3)
    with open("/proc/self/maps") as maps:
        runtimes = {line.split()[-1] for line in maps if "libgomp" in line or "libiomp" in line}
    assert len(runtimes) <= 1, runtimes
