"""The Gaussian nets' closed-form gradient (models/gaussian_grad.py), HMC's target in MCEM and the benchmark, against
autograd through the model's own log joint: equal values and gradients in float64 for every configuration the nets
support, the same HMC trajectories and accept decisions from the same random numbers, and broken variants (a wrong
sign, a wrong derivative) that fail the same checks."""

from __future__ import annotations

import itertools

import pytest
import torch

from nvil.models.gaussian import DynamicBayesNet, GaussianBeliefNet
from nvil.models.gaussian_grad import LogJoint
from nvil.mcmc.hmc import HMC, Autograd, value_and_grad

DT = torch.float64
NETS = [(form, visible, nonlinearity, layers)
        for form, visible, nonlinearity, layers in itertools.product(
            ("auxiliary", "centred"), ("bernoulli", "gaussian"), ("tanh", "sigmoid", "hard_tanh", "hard_sigmoid", "identity"),
            ([4], [5, 3], [6, 4, 3]))]


def gbn(form="centred", visible="bernoulli", nonlinearity="tanh", layers=(5, 3), n_visible=7, seed=0):
    torch.manual_seed(seed)
    net = GaussianBeliefNet(n_visible, list(layers), form=form, visible=visible, nonlinearity=nonlinearity,
                            sigma=0.5, visible_sigma=0.7, init_scale=0.6).to(DT)
    with torch.no_grad():  # learnt noise scales that differ per unit, so a missing sigma factor shows
        for log_sigma in [*net.log_sigmas, net.log_sigma_x]:
            if log_sigma is not None:
                log_sigma.uniform_(-1.0, 0.0)
    return net


def data_and_states(net, n=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    x, _ = net.sample(n, g)
    return x, 1.5 * torch.randn(n, net.n_latent, generator=g, dtype=DT)


def errors(target, log_density, s):
    """Largest |difference| of value and of gradient, target's closed form against autograd of ``log_density``."""
    lp, g = value_and_grad(log_density, s)
    lp_c, g_c = target.value_and_grad(s)
    return max((lp_c - lp).abs().max().item(), (g_c - g).abs().max().item(), (target.grad(s) - g).abs().max().item())


@pytest.mark.parametrize("form,visible,nonlinearity,layers", NETS)
def test_closed_form_equals_autograd_on_every_gaussian_belief_net(form, visible, nonlinearity, layers):
    net = gbn(form, visible, nonlinearity, layers)
    x, s = data_and_states(net)
    for beta in (1.0, 0.3, torch.tensor(0.7, dtype=DT)):  # beta tempers the likelihood (AIS's path)
        target = net.posterior(x, beta=beta)
        assert errors(target, lambda v: net.log_prior(v) + beta * net.log_likelihood(x, v), s) < 1e-10
    torch.testing.assert_close(net.posterior(x)(s), net.log_joint(x, s), rtol=0, atol=0)
    other = "centred" if form == "auxiliary" else "auxiliary"  # the other form, asked for by name
    assert errors(net.posterior(x, other), lambda v: net.log_joint(x, v, other), s) < 1e-10


@pytest.mark.parametrize("form,visible", itertools.product(("auxiliary", "centred"), ("bernoulli", "gaussian")))
def test_closed_form_equals_autograd_on_the_dynamic_bayes_net(form, visible):
    torch.manual_seed(0)
    net = DynamicBayesNet(4, 3, 5, form=form, visible=visible, sigma=0.5, init_scale=0.6).to(DT)
    x, s = data_and_states(net)
    assert errors(net.posterior(x), lambda v: net.log_joint(x, v), s) < 1e-10


def test_targets_are_chosen_by_capability_and_the_closed_form_never_calls_autograd(monkeypatch):
    net = gbn()
    x, s = data_and_states(net)
    assert isinstance(HMC(lambda v: net.log_joint(x, v), 3).log_density, Autograd)
    closed = HMC(net.posterior(x), 3)
    assert isinstance(closed.log_density, LogJoint)

    def no_autograd(*args, **kwargs):
        raise AssertionError("autograd called")

    monkeypatch.setattr(torch.autograd, "grad", no_autograd)
    state = closed.init(s)
    closed.step(state, generator=torch.Generator().manual_seed(0), step_size=0.1)
    assert all(p.grad is None for p in net.parameters())  # no parameter's .grad touched either
    with pytest.raises(AssertionError, match="autograd called"):
        HMC(lambda v: net.log_joint(x, v), 3).init(s)


def trajectories(net, x, s, target, steps=8, step_size=0.35, beta=1.0):
    """(positions after each step, accept decisions) of HMC on ``target`` and on autograd of the model's density,
    both from s with the same seed; per-chain step sizes, and the tempered kernel when beta is a tensor."""
    out = []
    for t in (target, lambda v: net.log_joint(x, v)):
        hmc, g = HMC(t, 5), torch.Generator().manual_seed(3)
        state, positions, accepts = hmc.init(s), [], []
        eps = torch.linspace(0.5, 1.5, s.shape[0], dtype=DT) * step_size
        for _ in range(steps):
            state, info = hmc.step(state, beta, g, step_size=eps)
            positions.append(state.position)
            accepts.append(info.accepted)
        out.append((torch.stack(positions), torch.stack(accepts)))
    return out


def same(runs) -> bool:
    (q1, a1), (q2, a2) = runs
    return torch.equal(a1, a2) and torch.allclose(q1, q2, rtol=0, atol=1e-9)


@pytest.mark.parametrize("form,visible", [("centred", "bernoulli"), ("auxiliary", "bernoulli"),
                                          ("centred", "gaussian")])
def test_hmc_on_both_paths_gives_the_same_positions_and_accept_decisions(form, visible):
    net = gbn(form, visible, layers=(5, 4, 3))
    x, s = data_and_states(net, n=40)
    for beta in (1.0, torch.linspace(0.2, 1.0, 40, dtype=DT)):
        runs = trajectories(net, x, s, net.posterior(x), beta=beta)
        assert same(runs)
        accepted = runs[0][1]
        assert accepted.any() and not accepted.all()  # the check sees both decisions


class WrongSign(LogJoint):
    """The likelihood's gradient with the wrong sign (d/d out = sigmoid(out) - x)."""

    def _likelihood(self, zs, value):
        log_lik, adjoint = super()._likelihood(zs, value)
        return log_lik, [None if a is None else -a for a in adjoint]


class WrongDerivative(LogJoint):
    """tanh'(a) taken as 1 + tanh(a)^2: only the terms through the hidden links are wrong."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.df = lambda a, mu: 1 + mu * mu


class MissingPrior(LogJoint):
    """The centred prior's own term -r_k left out of the gradient (the child terms kept)."""

    def _centred_prior(self, s, parts, zs, links, adjoint, value):
        log_prior, grads = super()._centred_prior(s, parts, zs, links, adjoint, value)
        for i, z in enumerate(zs):
            if self.net.latent_parent[i] is not None:
                a, mu = links[i]
                grads[i] = grads[i] + (z - mu) * torch.exp(-2 * self.net.log_sigma(i))
        return log_prior, grads


@pytest.mark.parametrize("broken,form", [(WrongSign, "centred"), (WrongSign, "auxiliary"),
                                         (WrongDerivative, "centred"), (WrongDerivative, "auxiliary"),
                                         (MissingPrior, "centred")])
def test_a_broken_gradient_fails_both_checks(broken, form):
    net = gbn(form, layers=(5, 4, 3))
    x, s = data_and_states(net, n=40)
    bad = broken(net, x, form)
    assert errors(bad, lambda v: net.log_joint(x, v), s) > 1e-3
    assert not same(trajectories(net, x, s, bad))
