"""HMC and step-size adaptation against exact answers: a correlated Gaussian target whose moments are known,
leapfrog reversibility and its O(eps^2) energy error, and hand-written gradients.

Invariance tests start the chains from exact samples of the target, so after any number of HMC steps
the samples are still exact draws if (and only if) the kernel leaves the target invariant; the
tolerances are then standard errors of independent samples.
"""

from __future__ import annotations

import math

import pytest
import torch

from nvil.mcmc.adapt import DualAveraging, multiplicative_adapt
from nvil.mcmc.hmc import HMC, kinetic_energy, leapfrog, value_and_grad

MU = [1.0, -2.0, 0.5]
SIGMA = [[1.5, 0.6, 0.2], [0.6, 1.0, -0.3], [0.2, -0.3, 0.6]]  # eigenvalues 0.24, 0.96, 1.90


def gaussian(device="cpu", dtype=torch.float64):
    """(mu, Sigma, log density) of N(mu, Sigma), the log density written out: -0.5 (x - mu)^T Sigma^-1 (x - mu)."""
    mu = torch.tensor(MU, device=device, dtype=dtype)
    sigma = torch.tensor(SIGMA, device=device, dtype=dtype)
    precision = torch.linalg.inv(sigma)

    def log_density(x):
        d = x - mu
        return -0.5 * ((d @ precision) * d).sum(-1)

    return mu, sigma, log_density


def exact_samples(mu, sigma, n, generator):
    z = torch.randn(n, mu.numel(), generator=generator, dtype=mu.dtype).to(mu.device)
    return mu + z @ torch.linalg.cholesky(sigma).T


def moment_errors(x, mu, sigma):
    """Largest |error| / standard error of the sample mean (SE^2 = Sigma_ii / n) and of the sample
    covariance (for Gaussian data Var S_ij = (Sigma_ii Sigma_jj + Sigma_ij^2) / n)."""
    n = x.shape[0]
    mean_z = (x.mean(0) - mu).abs() / (sigma.diagonal() / n).sqrt()
    d = x - x.mean(0)
    cov = d.T @ d / (n - 1)
    var_s = (sigma.diagonal()[:, None] * sigma.diagonal()[None, :] + sigma**2) / n
    cov_z = (cov - sigma).abs() / var_s.sqrt()
    return mean_z.max().item(), cov_z.max().item()


def run(kernel, x, step_size, num_steps, generator):
    state = kernel.init(x)
    accept = 0.0
    for _ in range(num_steps):
        state, info = kernel.step(state, generator=generator, step_size=step_size)
        accept += info.accept_prob.mean().item() / num_steps
    return state, accept


def assert_invariant(kernel, step_size, seed=0, n=4000, num_steps=20, device="cpu", dtype=torch.float64):
    mu, sigma, _ = gaussian(device, dtype)
    g = torch.Generator().manual_seed(seed)
    x0 = exact_samples(mu, sigma, n, g)
    if device != "cpu":
        g = torch.Generator(device=device).manual_seed(seed)
    state, accept = run(kernel, x0, step_size, num_steps, g)
    assert 0.2 < accept < 1.0  # the chains move: a kernel that never accepts would pass trivially
    assert (state.position != x0).any(1).float().mean() > 0.9
    mean_z, cov_z = moment_errors(state.position.double(), mu.double(), sigma.double())
    assert mean_z < 4, mean_z
    assert cov_z < 5, cov_z


@pytest.mark.parametrize("step_size", [0.3, 0.8])
def test_hmc_leaves_correlated_gaussian_invariant(step_size):
    _, _, log_density = gaussian()
    assert_invariant(HMC(log_density, num_leapfrog=5), step_size)


def test_invariance_check_catches_a_kernel_without_accept_step():
    """Leapfrog proposals always accepted (the Metropolis step skipped) at eps = 0.8 sample a modified
    Hamiltonian: along the stiffest direction (sd 0.49) the variance inflates by 1 / (1 - eps^2 omega^2 / 4),
    about 3x. The same step size with the accept step passes (the test above)."""
    mu, sigma, log_density = gaussian()
    g = torch.Generator().manual_seed(0)
    x = exact_samples(mu, sigma, 4000, g)
    _, grad = value_and_grad(log_density, x)
    for _ in range(20):
        p = torch.randn(x.shape, generator=g, dtype=x.dtype)
        x, _, _, grad = leapfrog(log_density, x, p, grad, 0.8, 5)
    _, cov_z = moment_errors(x, mu, sigma)
    assert cov_z > 2 * 5, cov_z  # far outside the 5-SE bound


def test_invariance_with_per_chain_step_sizes_and_diagonal_mass():
    _, _, log_density = gaussian()
    g = torch.Generator().manual_seed(1)
    steps = torch.empty(4000, dtype=torch.float64).uniform_(0.05, 0.9, generator=g)
    assert_invariant(HMC(log_density, num_leapfrog=5), steps, seed=2)
    inv_mass = torch.tensor([1.5, 1.0, 0.4], dtype=torch.float64)  # roughly the marginal variances
    assert_invariant(HMC(log_density, num_leapfrog=5, inv_mass=inv_mass), steps, seed=3)
    assert_invariant(HMC(log_density, num_leapfrog=3, inv_mass=inv_mass), 0.6, seed=4)


def quartic(x):
    """A non-quadratic target: log p(x) = -0.5 |x|^2 - 0.1 sum x^4 (leapfrog is not exact on it)."""
    return -0.5 * x.square().sum(-1) - 0.1 * x.pow(4).sum(-1)


def test_leapfrog_is_reversible():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(100, 3, generator=g, dtype=torch.float64)
    p = torch.randn(100, 3, generator=g, dtype=torch.float64)
    inv_mass = torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    _, grad = value_and_grad(quartic, q)
    q1, p1, _, grad1 = leapfrog(quartic, q, p, grad, 0.1, 20, inv_mass)
    assert (q1 - q).abs().max() > 0.5  # it went somewhere
    q2, p2, _, _ = leapfrog(quartic, q1, -p1, grad1, 0.1, 20, inv_mass)
    assert (q2 - q).abs().max() < 1e-4
    assert (p2 + p).abs().max() < 1e-4


@pytest.mark.parametrize("inv_mass", [None, [1.0, 0.5, 2.0]])
def test_leapfrog_energy_error_is_second_order(inv_mass):
    """Leapfrog is a second-order method: over a fixed trajectory length T = L eps, Delta H = O(eps^2), so
    halving eps (and doubling L) divides the mean |Delta H| by about 4. (With L fixed instead, the
    trajectory shrinks with eps and the error falls like eps^3.)"""
    inv_mass = None if inv_mass is None else torch.tensor(inv_mass, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1000, 3, generator=g, dtype=torch.float64)
    p = torch.randn(1000, 3, generator=g, dtype=torch.float64)
    log_p, grad = value_and_grad(quartic, q)

    def mean_abs_dh(eps, num_steps):
        q1, p1, log_p1, _ = leapfrog(quartic, q, p, grad, eps, num_steps, inv_mass)
        return ((kinetic_energy(p1, inv_mass) - log_p1) - (kinetic_energy(p, inv_mass) - log_p)).abs().mean().item()

    errors = [mean_abs_dh(0.2 / 2**k, 5 * 2**k) for k in range(3)]
    assert errors[0] > 1e-3
    for big, small in zip(errors, errors[1:]):
        assert 3 < big / small < 5, errors


def test_rejected_chains_keep_their_state_and_accepted_ones_take_the_leapfrog_end_point():
    mu, sigma, log_density = gaussian()
    kernel = HMC(log_density, num_leapfrog=5, divergence_threshold=2.0)
    state = kernel.init(exact_samples(mu, sigma, 2000, torch.Generator().manual_seed(0)))
    new, info = kernel.step(state, generator=torch.Generator().manual_seed(7), step_size=0.9)

    # the proposal and Delta H by hand: the step draws p ~ N(0, I) first, from the same generator
    p = torch.randn(state.position.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    q1, p1, _, _ = leapfrog(log_density, state.position, p, state.grad, 0.9, 5)
    dh = (0.5 * p1.square().sum(1) - log_density(q1)) - (0.5 * p.square().sum(1) - log_density(state.position))
    torch.testing.assert_close(info.energy_change, dh)
    torch.testing.assert_close(info.accept_prob, torch.exp(-dh).clamp(max=1.0))
    assert torch.equal(info.divergent, dh > 2.0)

    acc, rej = info.accepted, ~info.accepted
    assert 100 < rej.sum() < 1900
    assert torch.equal(new.position[acc], q1[acc])
    for field in ("position", "log_density", "grad"):
        assert torch.equal(getattr(new, field)[rej], getattr(state, field)[rej])
    log_p, grad = value_and_grad(log_density, new.position)  # the cache matches the state
    torch.testing.assert_close(new.log_density, log_p)
    torch.testing.assert_close(new.grad, grad)
    # accepted with probability accept_prob: the acceptance count agrees with its mean within 4 SE
    a = info.accept_prob
    assert (acc.double().mean() - a.mean()).abs() < 4 * (a * (1 - a)).mean().sqrt() / math.sqrt(a.numel())


def test_non_finite_target_is_divergent_and_rejected():
    """log p = NaN (with a NaN gradient) where x_0 > 1: chains whose trajectory crosses into that region
    are marked divergent and rejected, and no NaN reaches the state."""

    def log_density(x):
        nan_where_bad = torch.where(x[:, 0] > 1.0, float("nan"), 1.0)  # constant, so no NaN gradient elsewhere
        return -0.5 * x.square().sum(-1) * nan_where_bad

    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 2, generator=g, dtype=torch.float64)
    x[:, 0] = torch.empty(500, dtype=torch.float64).uniform_(-1.0, 1.0, generator=g)
    kernel = HMC(log_density, num_leapfrog=4)
    state = kernel.init(x)
    new, info = kernel.step(state, generator=g, step_size=0.3)
    bad = ~torch.isfinite(info.energy_change)
    assert 20 < bad.sum() < 480
    assert info.divergent[bad].all() and not info.accepted[bad].any()
    assert (info.accept_prob[bad] == 0).all()
    assert ((info.accept_prob >= 0) & (info.accept_prob <= 1)).all()
    assert info.accepted[~bad].float().mean() > 0.5
    assert torch.equal(new.position[bad], state.position[bad])
    for t in new:
        assert torch.isfinite(t).all()


def test_dual_averaging_reaches_target_acceptance():
    """One leapfrog step (L = 1): on a standard Gaussian, L leapfrog steps of size eps = 2 sin(pi k / L)
    return to the start of a period, where Delta H = 0, so for L > 1 the acceptance is not monotone in eps
    (for L = 5 it is 0.3 at eps = 1.5 but 0.9 at 1.2) and no step-size rule can be expected to settle.
    For L = 1 it falls from 1 to 0 on (0, 2)."""
    log_density = lambda x: -0.5 * x.square().sum(-1)  # noqa: E731, 10-D standard Gaussian
    g = torch.Generator().manual_seed(0)
    kernel = HMC(log_density, num_leapfrog=1)
    state = kernel.init(torch.randn(500, 10, generator=g))
    adapt = DualAveraging(target_accept=0.65)
    da = adapt.init(torch.full((500,), 1.5))
    for t in range(300):
        state, info = kernel.step(state, generator=g, step_size=adapt.step_size(da))
        if t == 0:
            assert info.accept_prob.mean() < 0.4  # 1.5 is far too large
        da = adapt.update(da, info.accept_prob)
    assert da.count.eq(300).all()
    step = adapt.final_step_size(da)
    assert step.max() < 1.5
    accept = []
    for _ in range(50):
        state, info = kernel.step(state, generator=g, step_size=step)
        accept.append(info.accept_prob.mean().item())
    assert abs(sum(accept) / len(accept) - 0.65) < 0.1, sum(accept) / len(accept)


def test_dual_averaging_with_max_count_follows_a_drifting_target():
    """A deterministic acceptance curve alpha(eps) = exp(-eps / s), whose target step is eps* = -s log 0.65.
    After s drops tenfold, capped dual averaging finds the new eps* (up to a small bias); uncapped, x_bar lags
    behind (its weight t^-kappa is ~0.005 by then)."""
    def adapt_on(adapt, s_values):
        da = adapt.init(torch.tensor([1.0, 0.01]))
        for s in s_values:
            da = adapt.update(da, torch.exp(-adapt.step_size(da) / s))
        return da

    def final_accept(da, s):
        return torch.exp(-DualAveraging.final_step_size(da) / s)

    steady = adapt_on(DualAveraging(), [1.0] * 1000)
    assert (final_accept(steady, 1.0) - 0.65).abs().max() < 0.01
    drift = [1.0] * 1000 + [0.1] * 300
    capped = adapt_on(DualAveraging(max_count=50), drift)
    assert capped.count.max() == 50
    # capping t leaves a small bias: at the fixed point H_bar = delta - alpha = gamma (mu - log eps) / sqrt(50)
    assert (final_accept(capped, 0.1) - 0.65).abs().max() < 0.05
    assert (final_accept(adapt_on(DualAveraging(), drift), 0.1) < 0.55).all()


def test_multiplicative_rule():
    step = multiplicative_adapt(torch.tensor([0.1, 0.1, 0.495, 1.01e-4]), torch.tensor([0.9, 0.3, 0.9, 0.1]))
    torch.testing.assert_close(step, torch.tensor([0.102, 0.098, 0.5, 1e-4]))

    log_density = lambda x: -0.5 * x.square().sum(-1)  # noqa: E731
    g = torch.Generator().manual_seed(0)
    kernel = HMC(log_density, num_leapfrog=5)
    state = kernel.init(torch.randn(200, 10, generator=g))
    step = torch.tensor([0.01] * 100 + [3.0] * 100)
    start = step.clone()
    for _ in range(50):
        state, info = kernel.step(state, generator=g, step_size=step)
        step = multiplicative_adapt(step, info.accept_prob, max_step=5.0)
    assert (step[:100] > start[:100]).all() and (step[100:] < start[100:]).all()


def test_value_and_grad_matches_analytic_gradient_and_leaves_parameters_alone():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 4, generator=g, dtype=torch.float64)
    precision = a @ a.T + torch.eye(4, dtype=torch.float64)
    x = torch.randn(6, 4, generator=g, dtype=torch.float64)

    def log_density(x):
        return -0.5 * ((x @ precision) * x).sum(-1) + x.sin().sum(-1)

    with torch.no_grad():
        log_p, grad = value_and_grad(log_density, x)
    torch.testing.assert_close(grad, -x @ precision + x.cos())
    torch.testing.assert_close(log_p, log_density(x))
    assert not log_p.requires_grad and not grad.requires_grad

    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 3).double()
    x = x.clone().requires_grad_(True)
    log_p, grad = value_and_grad(lambda z: -0.5 * linear(z).square().sum(-1), x)
    w, b = linear.weight.detach(), linear.bias.detach()
    torch.testing.assert_close(grad, -(x.detach() @ w.T + b) @ w)
    assert linear.weight.grad is None and linear.bias.grad is None and x.grad is None
    assert not log_p.requires_grad and not grad.requires_grad


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype")
def test_hmc_invariance_on_cuda_without_host_syncs():
    """Invariance on the GPU, then step / update / multiplicative_adapt under sync debug mode "error",
    which raises on .item() and other host syncs."""
    _, _, log_density = gaussian("cuda", torch.float32)
    kernel = HMC(log_density, num_leapfrog=5, inv_mass=torch.tensor([1.5, 1.0, 0.4], device="cuda"))
    steps = torch.linspace(0.2, 0.7, 4000, device="cuda")
    assert_invariant(kernel, steps, device="cuda", dtype=torch.float32)

    g = torch.Generator(device="cuda").manual_seed(0)
    state = kernel.init(torch.zeros(4000, 3, device="cuda"))
    adapt = DualAveraging()
    da = adapt.init(steps)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            state, info = kernel.step(state, generator=g, step_size=adapt.step_size(da))
            da = adapt.update(da, info.accept_prob)
            multiplicative_adapt(steps, info.accept_prob)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert state.position.device.type == "cuda" and da.log_step.device.type == "cuda"


def test_dual_averaging_state_rows_can_be_updated_in_place():
    """MCEM keeps one adaptation state for every training example and writes a minibatch's rows back in place:
    the five fields must not share storage."""
    da = DualAveraging()
    state = da.init(torch.full((4,), 0.1))
    new = da.update(state, torch.tensor([1.0, 0.0, 1.0, 0.0]))
    for f, g in zip(state, new):
        f[:2] = g[:2]
    assert torch.equal(state.count, torch.tensor([1.0, 1.0, 0.0, 0.0]))
    assert torch.equal(state.h_avg[2:], torch.zeros(2)) and torch.equal(state.log_step[2:], torch.full((2,), math.log(0.1)))
    assert len({f.data_ptr() for f in da.init(torch.full((4,), 0.1))}) == 5
