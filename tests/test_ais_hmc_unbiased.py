"""estimator=ais_hmc: exp(log w) is unbiased for p(x) (Neal 2001) because every HMC move is a fixed
f_beta-invariant kernel, its step size taken from a pilot run (``nvil.estimators.model_paths.pilot_steps``).

The check: on a linear-Gaussian net (2 latents, 5 visibles, sigma 0.5; p(x) Gaussian in closed form,
``test_gaussian.exact_log_p``), 100 examples x 16 chains, 1,000 sigmoid betas and 10 leapfrog steps (the default
settings), the mean over every chain of exp(log w) / p(x) is 1 within 3 standard errors. The SE is the sample SD of
the 1,600 ratios over sqrt(1,600); chains of one example share x and its pilot step sizes, so the ratios are not
quite independent and this SE is approximate (over seeds 0-5 the ratio lies within 0.8 SE of 1).

The same for ``estimator=bdmc``'s continuous side, where the forward chains and the reverse chains (started from the
exact posterior sample of each simulated v) move with the same pilot step sizes: exp(log w) / p(v) and
exp(log w_rev) p(v) both average to 1 within 3 SE (slow; tests/test_bdmc.py has a short-ladder sibling).

Power: the same estimator with each main chain adapting its own step size after every move (Wu et al. 2017,
Sec. 5, applied to the chain it moves) has a step size at move k that depends on the state move k starts from; over
seeds 0-5 its mean ratio is 1.057-1.092, 6.6-10.8 SE above 1, so the check rejects it. In BDMC, chains adapting
their own step sizes in both directions invert the sandwich: over seeds 0-5 the mean gap (upper - lower) is -0.07
to -0.11 nats, 5-9 SE below 0 (with pilot step sizes: -0.003 to +0.020, within 1.8 SE of 0).
"""

from __future__ import annotations

import pytest
import torch

from nvil.core.ops import mean_and_stderr
from nvil.estimators import ais_per_example, bdmc
from nvil.estimators.ais_hmc import MAX_STEP_SIZE, AISHMC, ContinuousLatent, fixed_kernel_path
from nvil.estimators.annealing import StepTape, ais, schedule
from nvil.estimators.model_paths import ModelPath, pilot_steps
from nvil.estimators.bdmc import BDMC
from nvil.models.protocol import ProtocolModel
from test_gaussian import exact_log_p, linear_net

EXAMPLES, RUNS = 100, 16
SETTINGS = {"num_betas": 1000, "schedule": "sigmoid", "num_runs": RUNS, "num_leapfrog": 10, "batch_size": EXAMPLES}


def gaussian_net():
    """2 latents, 5 visibles, sigma 0.5: p(x) Gaussian in closed form."""
    return linear_net(n_visible=5, layers=(2,), sigma=0.5, visible_sigma=0.5, seed=5)


def ratio_mean_and_se(log_ratio: torch.Tensor) -> tuple[float, float]:
    """Mean of exp(log_ratio) over every chain of every example, and its standard error (module docstring)."""
    return mean_and_stderr(log_ratio.double().exp().flatten())


def ais_hmc_ratio(seed: int = 0) -> tuple[float, float]:
    """exp(log w) / p(x) averaged over the chains of ``estimator=ais_hmc`` at the default settings."""
    net = gaussian_net()
    x, _ = net.sample(EXAMPLES, generator=torch.Generator().manual_seed(seed))
    result = AISHMC(**SETTINGS).estimate(net, x, seed=seed)
    assert result.run_log_p.shape == (RUNS, EXAMPLES)
    return ratio_mean_and_se(result.run_log_p - exact_log_p(net, x).detach()[None, :])


def chain_adapted_path(lm, x, betas, *, num_leapfrog, target_accept, accel, max_step_size=MAX_STEP_SIZE, **_):
    """The broken variant: no pilot, each main chain adapting its own step size after every move."""
    pm = lm if isinstance(lm, ProtocolModel) else ProtocolModel(lm)
    return ModelPath(pm, x, pm.base("prior", x), num_leapfrog=num_leapfrog, target_accept=target_accept, adapt=True,
                     max_step_size=max_step_size, accel=accel)


def test_pilot_step_sizes_keep_exp_log_w_unbiased_for_p_x():
    mean, se = ais_hmc_ratio()
    assert abs(mean - 1) < 3 * se, f"E[w] / p(x) = {mean:.4f} +- {se:.4f}"


def test_step_sizes_adapted_on_the_chain_itself_fail_the_same_check(monkeypatch):
    """No pilot: ``ModelPath`` without fixed step sizes adapts each main chain's own after every move."""
    monkeypatch.setattr(ais_per_example, "fixed_kernel_path", chain_adapted_path)
    mean, se = ais_hmc_ratio()
    assert mean - 1 > 3 * se, f"E[w] / p(x) = {mean:.4f} +- {se:.4f}"


def test_main_chains_move_with_the_pilot_geometric_mean_fixed_per_example_and_beta():
    """The step sizes the main chains use: per example, the geometric mean of its pilot chains' step sizes at
    that beta (computed here from the pilot's own tape), the same for all its chains, and no adaptation on the way."""
    net = gaussian_net()
    x, _ = net.sample(3, generator=torch.Generator().manual_seed(0))
    lm = ContinuousLatent(net, "test", "auxiliary")
    betas = schedule("sigmoid", 30)
    settings = {"num_leapfrog": 3, "target_accept": 0.65}
    pm = ProtocolModel(lm)
    steps = pilot_steps(pm, x, "prior", betas, 3, 0.05, 4, torch.Generator().manual_seed(1), **settings)
    xp = x.repeat_interleave(3, 0)
    pilot = StepTape(ModelPath(pm, xp, pm.base("prior", xp), adapt=True, **settings))
    g = torch.Generator().manual_seed(1)
    ais(pilot, pilot.path.start(g, 0.05), betas, g)
    assert sorted(steps) == sorted(pilot.tape) == betas[1:-1].tolist()  # one step size per move
    for beta, step in steps.items():
        expected = pilot.tape[beta].double().log().view(3, 3).mean(1).exp()
        assert torch.allclose(step.double().view(3, 4), expected[:, None].expand(3, 4), rtol=1e-6)
    assert not torch.equal(steps[betas[1].item()], steps[betas[-2].item()])  # the pilot did adapt
    path = fixed_kernel_path(lm, x.repeat_interleave(4, 0), betas, chains=4, pilot_chains=3,
                             generator=torch.Generator().manual_seed(1), step_size=0.05, **settings)
    beta = betas[5].item()
    moved = path.transition(path.start(torch.Generator().manual_seed(2), 0.05), beta)
    assert torch.equal(moved.step_size, steps[beta])  # the step it used, not adapted after the move
    with pytest.raises(ValueError, match="whole examples"):
        fixed_kernel_path(lm, x, betas, chains=2, pilot_chains=2, step_size=0.05, **settings)


# ---- bdmc's continuous side (slow: a pilot and two runs of 1,600 chains each) ----------------------------


def bdmc_sides(seed: int = 0):
    """(forward ratio, reverse ratio, mean gap, its SE, result) of ``estimator=bdmc`` at the default settings."""
    net = gaussian_net()
    settings = {("num_chains" if k == "num_runs" else k): v for k, v in SETTINGS.items()}
    est = BDMC(num_simulated=EXAMPLES, **settings)
    result = est.estimate(net, None, generator=torch.Generator().manual_seed(seed), seed=seed)
    exact = exact_log_p(net, result.simulated).detach()[None, :]
    forward = ratio_mean_and_se(result.run_log_p - exact)
    reverse = ratio_mean_and_se(exact - result.run_log_p_upper)  # run_log_p_upper = -log w_rev
    return forward, reverse, result.extras["bdmc_gap"], result.extras["bdmc_gap_stderr"], result


@pytest.mark.slow
def test_bdmc_with_pilot_step_sizes_has_unbiased_weights_both_ways():
    (fwd, fwd_se), (rev, rev_se), gap, gap_se, result = bdmc_sides()
    assert abs(fwd - 1) < 3 * fwd_se, f"E[w] / p(v) = {fwd:.4f} +- {fwd_se:.4f}"
    assert abs(rev - 1) < 3 * rev_se, f"E[w_rev] p(v) = {rev:.4f} +- {rev_se:.4f}"
    assert gap > -3 * gap_se and "bdmc_order" not in result.failed


@pytest.mark.slow
def test_bdmc_with_step_sizes_adapted_on_the_chains_inverts_the_sandwich(monkeypatch):
    monkeypatch.setattr(bdmc, "fixed_kernel_path", chain_adapted_path)
    (fwd, fwd_se), _, gap, gap_se, result = bdmc_sides()
    assert fwd - 1 > 3 * fwd_se, f"E[w] / p(v) = {fwd:.4f} +- {fwd_se:.4f}"
    assert gap < -3 * gap_se and "bdmc_order" in result.failed, (gap, gap_se)
