"""The Boltzmann-machine learners' closed-form gradient (models/rbm_grad.py, SAP.set_closed_form_grads) and the
negative phase's reuse of the hidden input (learner.reuse_hidden).

- sum_n w_n dF(x_n)/dtheta from the sufficient statistics equals autograd's, for binary, Gaussian and lateral
  pixels and label units, on the learners' surrogate mean F(data) - mean F(negatives) and on weights that do
  not sum to zero (which the Gaussian bias term needs); plausible bugs fail the same check;
- a few updates of every phase give the same parameters and particles on the closed-form and autograd paths;
- with reuse_hidden the phase's a(x) is that of the negatives at the update's parameters, the gradient is
  autograd's at those negatives, and the reverse-order sweep leaves p(x, h) invariant (chi-square against
  enumeration), while a sweep that reuses the stale a(x) of the previous state fails the same check.
"""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf

from nvil.models.rbm_grad import free_energy_grad
from nvil.core.errors import ConfigError
from nvil.learners import build_learner
from nvil.learners.sap import SAP
from tests.test_rbm import CHI2_999, State, exact_draws, joint_log_p, make_bm, pearson, state_index

DT = torch.float64
CPU = torch.device("cpu")

MACHINES = {  # every parameter random; the free L asymmetric with a non-zero diagonal
    "binary": lambda: make_bm(6, 4, seed=0, scale=0.5),
    "gaussian": lambda: make_bm(6, 4, visible="gaussian", seed=1, scale=0.5),
    "lateral": lambda: make_bm(6, 4, lateral=True, seed=2, scale=0.5),
    "labels": lambda: make_bm(6, 4, n_labels=3, seed=3, scale=0.5),
    "lateral_labels": lambda: make_bm(6, 4, lateral=True, n_labels=3, seed=4, scale=0.5),
}


def rows(m, n: int, seed: int) -> torch.Tensor:
    """n rows x = [v, y]: binary or real pixels, one-hot labels."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(n, m.n_pixels, generator=g, dtype=DT) if m.visible == "gaussian" else \
        (torch.rand(n, m.n_pixels, generator=g, dtype=DT) < 0.4).to(DT)
    if not m.n_labels:
        return v
    y = torch.nn.functional.one_hot(torch.randint(0, m.n_labels, (n,), generator=g), m.n_labels).to(DT)
    return torch.cat([v, y], -1)


def autograd_grads(m, x: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
    """d/dtheta sum_n w_n F(x_n) by autograd through the free energy."""
    names, params = zip(*m.named_parameters())
    return dict(zip(names, torch.autograd.grad((w * m.free_energy(x)).sum(), params)))


def closed_form(m, x, w):
    with torch.no_grad():
        return m.free_energy_grad(x, w, m.h_given_x(x))


def surrogate_weights(b: int, n: int) -> torch.Tensor:
    return torch.cat([torch.full((b,), 1.0 / b, dtype=DT), torch.full((n,), -1.0 / n, dtype=DT)])


def matches(m, grad_fn) -> bool:
    """Whether ``grad_fn(m, x, w)`` equals autograd on the surrogate (data 7 rows, negatives 5) and on
    weights that do not sum to zero."""
    x = torch.cat([rows(m, 7, 0), rows(m, 5, 1)])
    for w in (surrogate_weights(7, 5), torch.linspace(-0.3, 1.0, 12, dtype=DT)):
        want, got = autograd_grads(m, x, w), grad_fn(m, x, w)
        try:
            assert set(got) == set(want)
            for name in want:
                torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-12)
        except AssertionError:
            return False
    return True


@pytest.mark.parametrize("name", list(MACHINES))
def test_closed_form_gradient_is_autograds(name):
    m = MACHINES[name]()
    assert m.closed_form_grad
    assert matches(m, closed_form)


def negatives_from_data(m, x, w):  # the negative statistics taken at the data rows
    half = x.shape[0] // 2
    return closed_form(m, torch.cat([x[:half], x[:half], x[: x.shape[0] - 2 * half]]), w)


def no_hidden_bias(m, x, w):
    g = closed_form(m, x, w)
    g["c"] = torch.zeros_like(g["c"])
    return g


def sampled_h(m, x, w):  # the statistics of a sampled h instead of p(h | x)
    with torch.no_grad():
        p = m.h_given_x(x)
        u = torch.rand(p.shape, generator=torch.Generator().manual_seed(0), dtype=DT)
        return m.free_energy_grad(x, w, (u < p).to(DT))


def lateral_diagonal(m, x, w):  # L's statistic v v' with its diagonal kept
    g = closed_form(m, x, w)
    if "L" in g:
        v = m.split(x)[0]
        g["L"] = -0.5 * v.T @ (w.unsqueeze(-1) * v)
    return g


def bernoulli_bias_for_gaussian(m, x, w):  # dE_vis/db = -v whatever the layer
    g = closed_form(m, x, w)
    g["b"] = -(w @ m.split(x)[0])
    return g


@pytest.mark.parametrize("name, broken", [("binary", negatives_from_data), ("binary", no_hidden_bias),
                                          ("binary", sampled_h), ("labels", negatives_from_data),
                                          ("lateral", lateral_diagonal), ("gaussian", bernoulli_bias_for_gaussian)])
def test_the_gradient_check_catches_broken_statistics(name, broken):
    assert not matches(MACHINES[name](), broken)


def test_free_energy_grad_is_the_models_method():
    m = MACHINES["labels"]()
    x = rows(m, 4, 2)
    w = surrogate_weights(2, 2)
    with torch.no_grad():
        a, b = m.free_energy_grad(x, w, m.h_given_x(x)), free_energy_grad(m, x, w, m.h_given_x(x))
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---- the learners: both paths, every phase ---------------------------------------------------------------

PHASE_CFG = {
    "sap": {},
    "cd": {},
    "trans_sap": {"tt": {"num_betas": 4, "beta_min": 0.5, "every": 2, "start_step": 1}},
    "pt_sap": {"pt": {"num_temps": 3, "beta_min": 0.5}},
}


def learner(m, mode: str, **extra) -> SAP:
    cfg = OmegaConf.create({"name": mode, "lr": 0.05, "momentum": 0.5, "weight_decay": 1e-3, "num_particles": 6,
                            "k": 1, "schedule": {"t0": 2, "a": 0.2, "b": 4.0}, **PHASE_CFG[mode], **extra})
    return build_learner(cfg, m, None, CPU, seed=5)


def run(name: str, mode: str, updates: int = 5, **extra):
    m = MACHINES[name]()
    sap = learner(m, mode, **extra)
    x = rows(m, 8, 3)
    metrics = [sap.step(x[(i % 2) * 4:(i % 2) * 4 + 4], diagnostics=True) for i in range(updates)]
    return m, sap, metrics


@pytest.mark.parametrize("mode", list(PHASE_CFG))
@pytest.mark.parametrize("name", ["binary", "gaussian", "lateral_labels"])
def test_closed_form_updates_equal_autograds(name, mode):
    m_fast, fast, met_fast = run(name, mode)
    m_slow, slow, met_slow = run(name, mode, closed_form=False)
    assert fast.closed_form and not slow.closed_form
    for (k, p), q in zip(m_fast.named_parameters(), m_slow.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=k)
    if mode != "cd":
        torch.testing.assert_close(fast.particles.x, slow.particles.x, rtol=1e-10, atol=1e-12)  # real for Gaussian
        assert torch.equal(fast.particles.h, slow.particles.h)
    torch.testing.assert_close(met_fast[-1]["train/free_energy_gap"], met_slow[-1]["train/free_energy_gap"])


def test_the_update_check_catches_negatives_taken_from_the_data(monkeypatch):
    m_slow, _, _ = run("binary", "sap", closed_form=False)
    m = MACHINES["binary"]()
    sap = learner(m, "sap")
    real = m.free_energy_grad
    monkeypatch.setattr(m, "free_energy_grad", lambda x, w, p: real(torch.cat([x[:4], x[:4], x[8:]]), w,
                                                                      torch.cat([p[:4], p[:4], p[8:]])))
    x = rows(m, 8, 3)
    for i in range(5):
        sap.step(x[(i % 2) * 4:(i % 2) * 4 + 4])
    assert not torch.allclose(m.W, m_slow.W, rtol=1e-6, atol=1e-8)


# ---- reusing the negatives' hidden input --------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sap", "cd", "trans_sap"])
@pytest.mark.parametrize("name", ["binary", "lateral_labels"])
def test_reused_hidden_input_is_the_negatives_at_the_updates_parameters(name, mode):
    """After each step the phase's a(x) must be a(particles) at the parameters before the step, and the gradient
    left in .grad autograd's gradient of the surrogate at those particles and parameters, plus the weight cost
    (1e-3 W on the weights, nothing on the biases)."""
    m = MACHINES[name]()
    sap = learner(m, mode, reuse_hidden=True)
    x = rows(m, 4, 3)
    for _ in range(3):
        before = copy.deepcopy(m)
        sap.step(x)
        assert sap.phase.hidden_input is not None
        if mode == "cd":  # no persistent chains to compare with
            continue
        torch.testing.assert_close(sap.phase.hidden_input, before.hidden_input(sap.particles.x), rtol=1e-12, atol=1e-12)
        want = autograd_grads(before, torch.cat([x, sap.particles.x]), surrogate_weights(4, 6))
        for (k, p), old in zip(m.named_parameters(), before.parameters()):
            cost = 1e-3 * old.detach() if p.dim() >= 2 else 0.0
            torch.testing.assert_close(p.grad, want[k] + cost, rtol=1e-10, atol=1e-12, msg=k)


def test_pt_phase_leaves_no_hidden_input_to_reuse():
    _, sap, _ = run("binary", "pt_sap", reuse_hidden=True)
    assert sap.phase.hidden_input is None


def stale_sweep(m, state: State, g: torch.Generator) -> State:
    """A broken reuse: x ~ p(x | h), then h ~ p(h | x) from the a(x) of the state *before* the sweep."""
    a_old = m.hidden_input(state.x)
    x = m.sample_x_given_h(state.h, 1.0, g, x=state.x, reverse=True)
    return State(x, m.sample_h(x, 1.0, g, a_old))


def reuse_chi_square(sweep_of, chains: int = 200_000):
    """Chains at exact draws of p(x, h) of a tiny RBM, one sweep: the chi-square of (x, h) against p."""
    m = make_bm(4, 3, seed=9, scale=1.0)
    g = torch.Generator().manual_seed(7)
    log_p = joint_log_p(m, 1.0)
    new = sweep_of(m, exact_draws(m, log_p, chains, g), g)
    stat, dof, min_expected = pearson(state_index(m, new.x, new.h), log_p.exp())
    assert min_expected > 20
    return stat, dof


def phase_sweep(m, state: State, g: torch.Generator) -> State:
    sap = learner(m, "sap", reuse_hidden=True)
    sap.phase.generator = g
    new = sap.phase.sweep(state)
    torch.testing.assert_close(sap.phase.hidden_input, m.hidden_input(new.x))
    return new


def test_reverse_order_sweep_leaves_p_invariant_and_the_stale_reuse_does_not():
    with torch.no_grad():
        stat, dof = reuse_chi_square(phase_sweep)
        assert stat < CHI2_999[dof], f"chi-square {stat:.1f} on {dof} dof"
        stat, dof = reuse_chi_square(stale_sweep)
        assert stat > 3 * CHI2_999[dof], f"chi-square {stat:.1f}: the check has no power"


def test_reuse_hidden_resumes_exactly():
    """The reverse order's next sweep starts from the particles' h: a resumed run restores it with the rest."""
    m, straight, _ = run("binary", "sap", updates=4, reuse_hidden=True)
    m2, first, _ = run("binary", "sap", updates=2, reuse_hidden=True)
    state, params = copy.deepcopy(first.learner_state()), copy.deepcopy(m2.state_dict())
    m3 = MACHINES["binary"]()
    m3.load_state_dict(params)
    resumed = learner(m3, "sap", reuse_hidden=True)
    resumed.load_learner_state(state)
    x = rows(m3, 8, 3)
    for i in range(2, 4):
        resumed.step(x[(i % 2) * 4:(i % 2) * 4 + 4], diagnostics=True)
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), m3.parameters()))
    assert torch.equal(straight.particles.x, resumed.particles.x)
    assert torch.equal(straight.particles.h, resumed.particles.h)


# ---- the paper's recipe: the rate schedule and the weight cost -------------------------------------------------
def test_the_rate_schedule_counts_t_from_the_switch():
    """0.01 for 10,000 updates then 10 / (1000 + t), and 0.05 then 100 / (2000 + t) (Salakhutdinov 2009): continuous
    at the switch, then decaying as a / (b + t - t0); t counted from 0 would drop the rate 11x and 26x there."""
    from nvil.learners.sap import paper_schedule

    for lr, t0, a, b in ((0.01, 10_000, 10.0, 1000.0), (0.05, 50_000, 100.0, 2000.0)):
        rate = lambda t: lr * paper_schedule(lr, t0, a, b)(t)  # noqa: E731
        assert rate(t0 - 1) == lr and rate(t0) == pytest.approx(lr, rel=1e-12)
        assert rate(t0 + 1000) == pytest.approx(a / (b + 1000))
        assert lr / (a / (b + t0)) > 10  # what counting t from 0 did at the switch
    with pytest.raises(ConfigError, match="b > 0"):
        paper_schedule(0.01, 10, 1.0, 0.0)


def test_the_weight_cost_reaches_the_weights_only():
    """learner.weight_decay adds w * W to the weights' gradients (rbm.m's weightcost * vishid), never to the biases:
    one update with and without it differs by -lr w W in W, U and L and by nothing in b, c, d."""
    models, params = [], []
    for cost in (0.5, 0.0):
        m = MACHINES["lateral_labels"]()
        before = {k: p.detach().clone() for k, p in m.named_parameters()}
        sap = learner(m, "sap", momentum=0.0, weight_decay=cost)
        sap.step(rows(m, 4, 3))
        models.append(dict(m.named_parameters()))
        params.append(before)
    for k, p in models[0].items():
        delta = p - models[1][k]
        if p.dim() >= 2:
            torch.testing.assert_close(delta, -0.05 * 0.5 * params[0][k], rtol=1e-9, atol=1e-12)
        else:
            assert torch.equal(delta, torch.zeros_like(delta)), k


def test_the_cd_recipe_schedules_k_rate_and_momentum():
    """Salakhutdinov & Murray 2008 / rbm.m: k = 1 + t // k_every up to k_final, the rate lr / k, momentum 0.5 for the
    first momentum_switch updates then 0.9; the rates and momenta the optimiser actually used."""
    m = MACHINES["binary"]()
    cd = learner(m, "cd", schedule={"t0": None}, k=1, k_final=3, k_every=2, lr_over_k=True, momentum=0.9,
                 momentum_initial=0.5, momentum_switch=3)
    ks, rates, momenta = [], [], []
    x = rows(m, 4, 3)
    for _ in range(7):
        ks.append(cd.sweeps_now())
        rates.append(cd.optimizer.param_groups[0]["lr"])
        cd.step(x)
        momenta.append(cd.optimizer.param_groups[0]["momentum"])
    assert ks == [1, 1, 2, 2, 3, 3, 3]
    assert rates == pytest.approx([0.05 / k for k in ks])
    assert momenta == [0.5, 0.5, 0.5, 0.9, 0.9, 0.9, 0.9]
    with pytest.raises(ConfigError, match="k_final"):
        learner(MACHINES["binary"](), "cd", k_every=2)
    with pytest.raises(ConfigError, match="momentum_switch"):
        learner(MACHINES["binary"](), "cd", momentum_initial=0.5)


@pytest.mark.parametrize("mode", list(PHASE_CFG))
@pytest.mark.parametrize("name", ["binary", "gaussian", "lateral_labels"])
def test_plain_sgd_inside_the_products_takes_the_optimisers_steps(name, mode):
    """With plain SGD (no momentum, no weight cost) the gradient's GEMMs apply the step themselves: the same
    parameters and chains as the optimiser's steps, across the schedule's switch and a logging step."""
    def trained(in_products: bool, sign: float = 1.0):
        m = MACHINES[name]()
        sap = learner(m, mode, momentum=0.0, weight_decay=0.0)
        sap.sgd_in_products = in_products
        x = rows(m, 8, 3)
        for i in range(5):
            sap.step(x[(i % 2) * 4:(i % 2) * 4 + 4], diagnostics=i == 2)
        return m

    fast, slow = trained(True), trained(False)
    for (k, p), q in zip(fast.named_parameters(), slow.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=k)


def test_plain_sgd_inside_the_products_with_the_wrong_sign_fails(monkeypatch):
    import nvil.models.rbm as rbm

    right = rbm.free_energy_grad
    monkeypatch.setattr(rbm, "free_energy_grad", lambda m, x, w, p, lr=None: right(m, x, w, p, None if lr is None else -lr))
    m_fast, m_slow = MACHINES["binary"](), MACHINES["binary"]()
    fast, slow = learner(m_fast, "sap", momentum=0.0, weight_decay=0.0), learner(m_slow, "sap", momentum=0.0, weight_decay=0.0)
    slow.sgd_in_products = False
    x = rows(m_fast, 4, 3)
    fast.step(x), slow.step(x)
    assert not torch.allclose(m_fast.W, m_slow.W)
