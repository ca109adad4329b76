"""The one transition-operator protocol (``nvil.mcmc.base``): every kernel speaks ``init`` / ``step(state, beta,
generator) -> (state, info)`` / ``reverse()``, the Chib kernels also ``log_transition`` / ``log_prob`` /
``oriented``, and ``beta`` really tempers: a step leaves p^beta invariant (checked exactly or against exact
draws), while the same step with beta ignored fails the same check."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import tiny_model
from nvil.estimators.exact import enumerate_states, split_layers
from nvil.mcmc import BlockGibbs, ParallelTempering, TemperedTransitions, uniform_betas
from nvil.mcmc.base import ChibKernel, Kernel
from nvil.mcmc.hmc import HMC
from nvil.mcmc.mh import MetropolisHastings
from nvil.mcmc.sequential_gibbs import SequentialGibbs
from tests.test_rbm import CHI2_999, State, exact_draws, joint_log_p, make_bm, pearson, state_index

DT = torch.float64


def gaussian(x):  # log N(x; 0, I) up to a constant
    return -0.5 * x.square().sum(-1)


def sbn_latent():
    """A 7-latent SBN's posterior given one visible vector: (SequentialGibbs, every h, log P(v, h))."""
    model, _ = tiny_model(seed=3)
    model = model.double()
    x = torch.tensor([[1.0, 0.0, 1.0, 1.0, 0.0, 1.0]], dtype=DT)
    H = enumerate_states(model.n_latent, 0, 2**model.n_latent, dtype=DT)
    log_joint = model.log_joint(x.expand(H.shape[0], -1), split_layers(H, model.layers)).detach()
    return model, x, H, log_joint


def kernels():
    """name -> (kernel, a batch of starting points x)."""
    rbm = make_bm(4, 3, seed=9, scale=0.7)
    x = torch.bernoulli(torch.full((8, 4), 0.5, dtype=DT), generator=torch.Generator().manual_seed(0))
    model, v, H, _ = sbn_latent()
    return {
        "block_gibbs": (BlockGibbs(rbm), x),
        "tempered_transitions": (TemperedTransitions(rbm, uniform_betas(3, 0.5)), x),
        "parallel_tempering": (ParallelTempering(rbm, uniform_betas(3, 0.5)), x),
        "sequential_gibbs": (SequentialGibbs([(1.0, model.latent_density(v.expand(8, -1)))]), H[:8]),
        "metropolis_hastings": (MetropolisHastings(gaussian, 0.5), torch.randn(8, 2, dtype=DT)),
        "hmc": (HMC(gaussian, 3, step_size=0.5), torch.randn(8, 2, dtype=DT)),
    }


CHIB = ("sequential_gibbs", "metropolis_hastings")


def shapes(state):
    return [t.shape for t in (state if isinstance(state, tuple) else (state,))]


@pytest.mark.parametrize("name", list(kernels()))
def test_every_kernel_speaks_the_protocol(name):
    kernel, x = kernels()[name]
    g = torch.Generator().manual_seed(1)
    for k in (kernel, kernel.reverse()):
        assert isinstance(k, Kernel)
        state = k.init(x, g)
        new, info = k.step(state, 1.0, g)
        assert type(new) is type(state) and shapes(new) == shapes(state)
        assert isinstance(info, (dict, tuple))
        new, _ = k.step(new, 0.7, g)  # tempered
        assert shapes(new) == shapes(state)
    assert isinstance(kernel, ChibKernel) == (name in CHIB)


@pytest.mark.parametrize("name", CHIB)
def test_chib_kernels_give_transition_densities_and_per_chain_directions(name):
    kernel, x = kernels()[name]
    g = torch.Generator().manual_seed(2)
    backward = torch.arange(x.shape[0]) % 2 == 0
    moved, _ = kernel.oriented(backward).step(kernel.init(x, g), 1.0, g)
    assert isinstance(kernel.oriented(backward), Kernel)
    log_t = kernel.log_transition(moved, x)
    assert log_t.shape == (x.shape[0],) and kernel.log_prob(x).shape == (x.shape[0],)


def test_an_object_without_reverse_is_no_kernel():
    class Forward:
        def init(self, x, generator=None):
            return x

        def step(self, state, beta=1.0, generator=None):
            return state, {}

    assert not isinstance(Forward(), Kernel)
    assert not isinstance(HMC(gaussian, 3), ChibKernel)  # no log_transition


# ---- beta tempers ------------------------------------------------------------------------------------------


BETA = 0.5
CHAINS = 200_000


def rbm_check(kernel_of, step_beta, seed=4):
    """Chains at exact draws of p^BETA of a tiny RBM, one step at ``step_beta``: the chi-square against p^BETA."""
    m = make_bm(4, 3, seed=9, scale=0.7)
    g = torch.Generator().manual_seed(seed)
    log_p = joint_log_p(m, BETA)
    new, _ = kernel_of(m).step(exact_draws(m, log_p, CHAINS, g), step_beta, g)
    stat, dof, min_expected = pearson(state_index(m, new.x, new.h), log_p.exp())
    assert min_expected > 50
    return stat, dof


RBM_KERNELS = {
    "block_gibbs": lambda m: BlockGibbs(m),
    "block_gibbs_reverse": lambda m: BlockGibbs(m).reverse(),
    "tempered_transitions": lambda m: TemperedTransitions(m, uniform_betas(3, 0.3)),
}


@pytest.mark.parametrize("name", list(RBM_KERNELS))
def test_boltzmann_kernels_leave_p_beta_invariant(name):
    stat, dof = rbm_check(RBM_KERNELS[name], BETA)
    assert stat < CHI2_999[dof], f"chi-square {stat:.1f} on {dof} dof"
    stat, dof = rbm_check(RBM_KERNELS[name], 1.0)  # power: beta ignored
    assert stat > 3 * CHI2_999[dof], f"chi-square {stat:.1f}: the check has no power"


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "reverse"])
def test_parallel_tempering_at_beta_leaves_its_scaled_ladder_invariant(backward):
    """Replica k at exact draws of p^(BETA beta_k); 20 steps of PT at BETA (and of its reverse): each replica
    keeps its distribution. The same run at beta = 1 moves the replicas off theirs."""
    m = make_bm(4, 3, seed=9, scale=0.7)
    n = 50_000

    def run(step_beta):
        g = torch.Generator().manual_seed(5)
        pt = ParallelTempering(m, uniform_betas(3, 0.3))
        pt = pt.reverse() if backward else pt
        betas = [BETA * b for b in pt.betas.double().tolist()]
        starts = [exact_draws(m, joint_log_p(m, b), n, g) for b in betas]
        state = State(torch.cat([s.x for s in starts]), torch.cat([s.h for s in starts]))
        for t in range(20):
            state, _ = pt.step(state, step_beta, g, parity=t)
        return [pearson(state_index(m, state.x[k * n:(k + 1) * n], state.h[k * n:(k + 1) * n]),
                        joint_log_p(m, b).exp())[:2] for k, b in enumerate(betas)]

    for stat, dof in run(BETA):
        assert stat < CHI2_999[dof]
    stat, dof = run(1.0)[-1]
    assert stat > 3 * CHI2_999[dof]


def test_sequential_gibbs_at_beta_leaves_p_beta_invariant_exactly():
    """The forced sweeps give the whole transition matrix T_beta[a, b] = T(h_a <- h_b): T_beta p_beta = p_beta,
    for both directions; T_1 does not leave p_beta invariant."""
    model, v, H, log_joint = sbn_latent()
    N = H.shape[0]
    gibbs = SequentialGibbs([(1.0, model.latent_density(v.expand(N * N, -1)))])
    to, frm = H.repeat_interleave(N, 0), H.repeat(N, 1)
    p = torch.softmax(BETA * log_joint, 0)

    def matrix(beta, reverse):
        return gibbs.sweep(frm, force=to, beta=beta, reverse=reverse)[1].double().exp().view(N, N)

    for reverse in (False, True):
        T = matrix(BETA, reverse)
        assert torch.allclose(T.sum(0), torch.ones(N, dtype=DT), atol=1e-6)
        assert torch.allclose(T @ p, p, atol=1e-9, rtol=1e-6)
    assert (matrix(1.0, False) @ p - p).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["hmc", "metropolis_hastings"])
def test_continuous_kernels_at_beta_target_the_tempered_gaussian(name):
    """N(0, I) tempered at beta = 1/4 is N(0, 4 I): chains started there keep E[x^2] = 4 within 4 SE; run at
    beta = 1 they shrink towards E[x^2] = 1."""
    n, beta = 20_000, 0.25
    kernel = HMC(gaussian, 5, step_size=0.8) if name == "hmc" else MetropolisHastings(gaussian, 1.5)

    def second_moment(step_beta):
        g = torch.Generator().manual_seed(6)
        state = kernel.init(2.0 * torch.randn(n, 2, generator=g, dtype=DT), g)
        for _ in range(15):
            state, _ = kernel.step(state, step_beta, g)
        x = state.position if name == "hmc" else state
        return x.square().mean(0), math.sqrt(2 * 16 / n)  # Var(x^2) = 2 sigma^4

    m2, se = second_moment(beta)
    assert ((m2 - 4).abs() < 4 * se).all(), (m2, se)
    m2, se = second_moment(1.0)
    assert ((m2 - 4).abs() > 10 * se).all(), (m2, se)
