"""Defects found by checking estimators against exact answers, each with a test that fails on the old code:

1. ``estimator=exact`` on a DBN subtracts the top RBM's exact log Z (brute force over v, h_1 .. h_L);
2. ``estimator=exact`` refuses continuous latents in one line (before, an AttributeError from deep inside);
3. ``chib_mh`` adapts its MH step size per chain in a warm-up run, then keeps it fixed for Fig. 1: the default
   is right within 3 SE on a linear-Gaussian net where the old fixed step was 3.5 nats low (power check), the
   adapted kernel stays unbiased for p(x), and examples whose every run estimates 0 are counted;
4. ``ais_hmc``'s step-size clamp is configurable and by default does not bind, so the auxiliary-form acceptance
   reaches its 0.65 target (with the old 0.5 clamp it sits near 0.95).

Expected values come from enumeration or closed forms written here; tolerances from standard errors.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from conftest import make_cfg
from nvil.estimators import build_estimator
from nvil.estimators.exact import check_top_enumerable, enumerate_states, top_log_z_exact
from nvil.models.dbn import DBN
from nvil.core.config import estimator_config
from nvil.core.errors import ConfigError
from test_gaussian import GBN, exact_log_p, linear_net

DT = torch.float64


def cfg(name: str, **overrides):
    return OmegaConf.merge(estimator_config(name), overrides)


# ---- 1. exact log p(v) of a DBN ----------------------------------------------------------------------------


def random_dbn(sizes, seed):
    torch.manual_seed(seed)
    model = DBN(6, sizes)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 1.0)
    return model


def brute_force_dbn(model: DBN):
    """(log P(v) for all 2^6 v, log Z) of a DBN with two hidden layers, from its parameters alone, float64:
    P(v, h1, h2) = P(v | h1) exp(b2'h1 + c2'h2 + h1'W2 h2) / Z, Z summed over all (h1, h2)."""
    (r1, r2) = model.rbms
    W1, b1, W2, b2, c2 = (t.detach().double() for t in (r1.W, r1.b, r2.W, r2.b, r2.c))
    V = enumerate_states(r1.n_pixels, 0, 2**r1.n_pixels, dtype=DT)[:, None, None]  # [v, 1, 1, 6]
    H1 = enumerate_states(r1.n_hidden, 0, 2**r1.n_hidden, dtype=DT)[None, :, None]  # [1, h1, 1, 4]
    H2 = enumerate_states(r2.n_hidden, 0, 2**r2.n_hidden, dtype=DT)[None, None, :]  # [1, 1, h2, 3]
    logits = b1 + H1 @ W1.T  # [1, h1, 1, 6]
    log_p_v_given_h1 = (V * logits - F.softplus(logits)).sum(-1)  # [v, h1, 1]
    top = (H1 @ b2[:, None]).squeeze(-1) + (H2 @ c2[:, None]).squeeze(-1) + ((H1 @ W2) * H2).sum(-1)  # [1, h1, h2]
    log_z = torch.logsumexp(top.flatten(), 0)
    log_p = torch.logsumexp((log_p_v_given_h1 + top).flatten(1), 1) - log_z
    return log_p, log_z.item()


def test_exact_dbn_subtracts_the_top_rbm_log_z():
    """A 6-4-3 DBN: every visible state's log P(v) equals brute-force enumeration over (v, h1, h2), they sum to 1,
    and log Z is in the JSON. The old estimate (log P*, no log Z) is off by log Z, here several nats."""
    model = random_dbn([4, 3], seed=0)
    V = enumerate_states(6, 0, 64)
    truth, log_z = brute_force_dbn(model)
    assert abs(log_z) > 1.0  # so that forgetting log Z fails the comparison below by far more than its tolerance
    result = build_estimator(cfg("exact")).estimate(model, V, seed=0)
    assert torch.allclose(result.log_p.double(), truth, atol=1e-4), (result.log_p.double() - truth).abs().max()
    assert abs(torch.logsumexp(result.log_p.double(), 0).item()) < 1e-4  # sum_v P(v) = 1
    summary = json.loads(result.to_json())
    assert summary["log_z"] == pytest.approx(log_z, abs=1e-3)


def test_top_log_z_enumerates_the_smaller_side_and_refuses_when_neither_fits():
    """A top RBM with 3 visible (= h_{L-1}) and 12 hidden units: log Z by its 2^3 visible states equals the
    2^12-hidden-state enumeration; a top RBM too wide on both sides is refused in one line."""
    top = random_dbn([3, 12], seed=1).top
    via_visible = top_log_z_exact(top)
    assert torch.allclose(via_visible.double(), top.log_z_exact().double(), atol=1e-4)
    with pytest.raises(ConfigError, match="log Z of the model.s top machine") as err:
        check_top_enumerable(top, max_units=2)
    assert "\n" not in str(err.value)


# ---- 2. exact refuses continuous latents ---------------------------------------------------------------------


def test_exact_refuses_a_gaussian_belief_net_in_one_line(tmp_path):
    from test_evaluators import assert_one_line_error, run
    from nvil.app.main import train

    gbn = linear_net()
    with pytest.raises(ConfigError, match="continuous latents"):
        build_estimator(cfg("exact")).check(gbn, None)
    m = train(make_cfg("train", GBN + ["trainer.max_steps=2"]), tmp_path / "gbn")
    proc = run("evaluate.py", f"checkpoint={m['checkpoint']}", "estimator=exact", "eval.progress=false", cwd=tmp_path)
    assert_one_line_error(proc, "estimator=exact", "continuous latents", "ais_hmc", "chib_mh", "iwae")


# ---- 3. chib_mh: adapted step size, fixed during Fig. 1 ------------------------------------------------------


def well_scaled_net():
    """A linear-Gaussian net whose auxiliary-form posterior SDs are 0.55-1.0 (eigenvalues of the covariance)."""
    return linear_net(seed=5, visible_sigma=1.5)


def chib_errors(**overrides):
    net = well_scaled_net()
    x, _ = net.sample(20, generator=torch.Generator().manual_seed(0))
    est = build_estimator(cfg("chib_mh", **overrides))
    result = est.estimate(net, x, seed=0)
    return result.log_p - exact_log_p(net, x).detach(), est, result


def test_chib_mh_default_is_within_3_se_of_exact():
    """The default config (adapted step size, S = 40, 10 runs): the mean error over 20 examples is within 3 SE.
    Measured: +0.04 +- 0.05 nats; the old default (fixed step 0.1) gave -3.4 +- 0.2."""
    d, est, result = chib_errors()
    se = d.std().item() / math.sqrt(d.numel())
    assert abs(d.mean().item()) < 3 * se, f"error {d.mean():.3f} +- {se:.3f}"
    s = est.settings()
    assert s["adapt"] and s["zero_run_examples"] == 0 and s["target_accept"] == 0.8
    q10, q50, q90 = s["step_size_q10_q50_q90"]
    assert 0.2 < q10 <= q50 <= q90 < 2.0  # moved away from the initial 0.1
    assert 0.7 < s["accept_rate"] < 1.0 and abs(s["adapt_accept_rate"] - 0.8) < 0.05
    assert json.loads(result.to_json())["step_size_q10_q50_q90"] == [q10, q50, q90]


def test_chib_mh_with_the_old_fixed_step_fails_the_same_check():
    """Power: adapt=false at the old default step 0.1 (posterior SDs 0.55-1) under-estimates by several SE."""
    d, _, _ = chib_errors(adapt=False)
    se = d.std().item() / math.sqrt(d.numel())
    assert d.mean().item() < -3 * se and d.mean().item() < -1.0, f"error {d.mean():.3f} +- {se:.3f}"


def test_chib_mh_with_an_adapted_step_stays_unbiased_for_p_x():
    """The warm-up only picks each chain's step size; Fig. 1 then runs a fixed MH kernel, so exp(estimate) is
    still unbiased for p(x): over 2000 runs on one example the mean ratio to the exact p(x) is 1 within 3 SE."""
    net = well_scaled_net()
    x, _ = net.sample(1, generator=torch.Generator().manual_seed(3))
    est = build_estimator(cfg("chib_mh", num_runs=2000, batch_size=1))
    result = est.estimate(net, x, seed=1)
    ratio = (result.run_log_p[:, 0] - exact_log_p(net, x).detach()).exp()
    se = ratio.std().item() / math.sqrt(ratio.numel())
    assert abs(ratio.mean().item() - 1) < 3 * se, f"mean ratio {ratio.mean():.4f} +- {se:.4f}"
    assert 0 < est.zero_runs < ratio.numel()  # zero runs occur and are part of the unbiased average


def test_chib_mh_counts_examples_whose_every_run_is_zero():
    """The user's report: at a fixed step 1.0 (adapt=false) the move away from h* is often rejected, runs estimate
    p(x) = 0, and some examples (2 of 20 here) in all 10 runs. They are counted (zero_runs, zero_run_examples),
    marked per example, and the JSON line stays strict JSON with a reason beside the null mean."""
    d, est, result = chib_errors(adapt=False, step_size=1.0)
    zero_examples = torch.isneginf(result.log_p)
    assert 0 < int(zero_examples.sum()) < zero_examples.numel()
    s = est.settings()
    assert s["zero_runs"] == int(torch.isneginf(result.run_log_p).sum())
    assert s["zero_run_examples"] == int(zero_examples.sum()) == est.zero_run_examples
    assert torch.equal(torch.cat(est.zero_example_mask), zero_examples)
    line = json.loads(result.to_json())
    assert line["mean_log_p"] is None and "probability 0" in line["mean_log_p_null_reason"]


# ---- 4. ais_hmc: the step-size clamp no longer binds -----------------------------------------------------------


def ais_hmc_accept(**overrides) -> float:
    net = well_scaled_net()  # auxiliary form: posterior scale near 1, the best HMC step near 1 too
    x, _ = net.sample(5, generator=torch.Generator().manual_seed(0))
    est = build_estimator(cfg("ais_hmc", num_betas=200, num_runs=4, step_size=0.5, **overrides))
    est.estimate(net, x, seed=0)
    return est.settings()["accept_rate"]


def test_ais_hmc_acceptance_reaches_its_target_in_auxiliary_form():
    """Default config (max_step_size 10): mean acceptance within 0.1 of 0.65 (measured 0.66); with the old 0.5
    clamp the step sizes sit at 0.5 and the acceptance stays near 0.95 (power)."""
    assert abs(ais_hmc_accept() - 0.65) < 0.1
    assert ais_hmc_accept(max_step_size=0.5) > 0.75
