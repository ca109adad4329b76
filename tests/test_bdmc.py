"""estimator=bdmc: bidirectional Monte Carlo (Grosse, Ghahramani & Adams 2015; Wu et al. 2017) on directed models.

- On a tiny SBN (exact log p(v) by enumeration of the simulated examples), forward AIS sits below and reverse AIS
  above the exact mean, each weight is unbiased (exp(log w) for p(v), exp(log w_rev) for 1 / p(v)), and with
  enough betas both sides meet the exact value;
- power: reverse AIS started from a Q sample instead of the exact posterior sample falls below the exact value by
  far more than 3 standard errors, and the estimator's own bdmc_order check flags the inverted sandwich;
- the certificate: a 5-beta ladder leaves a gap above max_gap (certified false, a bdmc_gap warning), a long one
  is certified;
- a linear-Gaussian net (exact log p(x) in closed form) is bracketed too;
- evaluate.py: one JSON line with the certificate; one-line refusals for Boltzmann machines and DBNs.

Standard errors. For simulated example i let d_i = estimate_i - log p(v_i) (exact). The d_i are independent
(each example has its own chains and its own draw of v), so the mean of d over the n examples has standard error
sd(d) / sqrt(n), which covers both the Monte Carlo noise of the chains and the spread of the bias over the
model's distribution of v. Forward AIS has E[d] <= 0 and reverse AIS E[d] >= 0 (Jensen), so a correct estimator
fails ``mean(d) <= 3 SE`` (resp. ``>= -3 SE``) with probability below 0.14% under a normal approximation; the
seeds are fixed. Where both sides should equal the exact value (a long ladder), the band is two-sided and only
approximate: forward-AIS errors are left-skewed (now and then all runs of an example miss a posterior mode), so
the sample SE can understate the spread; over seeds 0-7 at 100 betas one seed lands at -3.5 SE, the others
within 1.4 SE.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from omegaconf import OmegaConf

from conftest import SYNTHETIC, make_cfg, run_script, tiny_model
from nvil.estimators import build_estimator
from nvil.estimators.annealing import ais
from nvil.estimators.ais_posterior import PosteriorPath
from nvil.estimators.bdmc import BDMC
from nvil.estimators.exact import exact_log_marginal
from nvil.core.errors import ConfigError
from nvil.core.ops import mean_and_stderr

ROUNDING = 1e-3  # float32 log-weights of ~10 terms: a floor on the 3-SE bands where the estimate is nearly exact


def bdmc(**cfg) -> BDMC:
    return BDMC(**{"num_simulated": 200, "num_chains": 4, "batch_size": 200, **cfg})


def run_sbn(est: BDMC, model, q, seed: int = 0):
    """(result, exact log p of its simulated examples)."""
    r = est.estimate(model, torch.zeros(1, model.n_visible), inference=q, generator=torch.Generator().manual_seed(seed),
                     seed=seed)
    return r, exact_log_marginal(model, r.simulated).double()


def ratio_mean_and_se(log_ratio: torch.Tensor) -> tuple[float, float]:
    """Mean of exp(log_ratio) over every run of every example, and its standard error: for an unbiased estimator
    of p(v) (or of 1 / p(v)) divided by the exact value, the mean is 1."""
    return mean_and_stderr(log_ratio.double().exp().flatten())


# ---- 1. the sandwich on a tiny SBN -----------------------------------------------------------------------


def test_short_ladder_brackets_exact_log_p_and_both_weights_are_unbiased():
    model, q = tiny_model()
    r, exact = run_sbn(bdmc(num_betas=5), model, q)
    lower, lower_se = mean_and_stderr(r.log_p - exact)
    upper, upper_se = mean_and_stderr(r.log_p_upper - exact)
    assert lower <= 3 * lower_se, f"forward AIS above exact: {lower:.4f} +- {lower_se:.4f}"
    assert upper >= -3 * upper_se, f"reverse AIS below exact: {upper:.4f} +- {upper_se:.4f}"
    # With 5 betas the sandwich is visibly open: upper - lower far above its own standard error.
    gap, gap_se = mean_and_stderr(r.log_p_upper - r.log_p)
    assert gap > 3 * gap_se and abs(r.extras["bdmc_gap"] - gap) < 1e-3
    # Each run's weight, not just its log: exp(log w) / p(v) and exp(log w_rev) p(v) average to 1.
    fwd, fwd_se = ratio_mean_and_se(r.run_log_p - exact)
    rev, rev_se = ratio_mean_and_se(exact - r.run_log_p_upper)  # run_log_p_upper = -log w_rev
    assert abs(fwd - 1) < 3 * fwd_se, f"E[w] / p(v) = {fwd:.4f} +- {fwd_se:.4f}"
    assert abs(rev - 1) < 3 * rev_se, f"E[w_rev] p(v) = {rev:.4f} +- {rev_se:.4f}"
    assert r.run_log_p.shape == r.run_log_p_upper.shape == (4, 200)


def test_long_ladder_closes_the_gap_at_the_exact_value():
    model, q = tiny_model()
    r, exact = run_sbn(bdmc(num_betas=100), model, q)
    for side in (r.log_p, r.log_p_upper):
        mean, se = mean_and_stderr(side - exact)
        assert abs(mean) <= 3 * se + ROUNDING, f"{mean:.4f} +- {se:.4f}"
    assert r.extras["bdmc_gap"] < 0.05 and r.certified is True and r.warnings == []
    assert r.checks == ["bdmc_gap", "bdmc_order"]
    assert abs(r.mean - r.log_p.mean().item()) < 1e-9  # log_p is the forward (lower) side
    assert r.extras["mean_log_p_upper"] == round(r.log_p_upper.mean().item(), 4)


# ---- 2. power: reverse AIS from the wrong start --------------------------------------------------------


class ReverseFromQ(BDMC):
    """The bug BDMC exists to catch: reverse chains started from Q(h | v), not from the exact posterior sample."""

    def run_batch(self, lm, v, h, generator):
        path = PosteriorPath(lm.joint(v), lm.q_density(v))
        log_w, _ = ais(path, path.state(lm.sample_q(v, generator)), self.betas, generator)
        log_w_rev, _ = ais(path, path.state(lm.sample_q(v, generator)), self.betas.flip(0), generator)
        return log_w, log_w_rev, {}


def test_reverse_ais_from_q_instead_of_the_exact_posterior_sample_fails_the_bound():
    model, q = tiny_model()
    est = ReverseFromQ(num_simulated=200, num_chains=4, batch_size=200, num_betas=5)
    r, exact = run_sbn(est, model, q)
    upper, upper_se = mean_and_stderr(r.log_p_upper - exact)
    assert upper < -3 * upper_se, f"the broken upper side should sit below exact: {upper:.4f} +- {upper_se:.4f}"
    rev, rev_se = ratio_mean_and_se(exact - r.run_log_p_upper)
    assert rev - 1 > 3 * rev_se  # exp(log w_rev) is no longer unbiased for 1 / p(v)
    # The estimator's own check sees the inverted sandwich without knowing the exact value.
    assert r.certified is False
    assert any(w.startswith("bdmc_order") for w in r.warnings), r.warnings


# ---- 3. the certificate -----------------------------------------------------------------------------------


def test_short_ladder_is_not_certified_and_a_long_one_is():
    model, q = tiny_model(n_visible=20, layers=(10,), scale=2.0)
    data = torch.zeros(3, 20)  # ignored but for its width and device

    def run(num_betas):
        est = bdmc(num_betas=num_betas, num_simulated=50, batch_size=25)
        return est.estimate(model, data, inference=q, generator=torch.Generator().manual_seed(0), seed=0)

    short = run(5)
    assert short.extras["bdmc_gap"] > short.extras["max_gap"] == 1.0
    assert short.certified is False and len(short.warnings) == 1
    (warning,) = short.warnings
    assert warning.startswith("bdmc_gap") and "estimator.num_betas=5" in warning and "ais_posterior" in warning
    assert short.summary()["certified"] is False
    long = run(200)
    assert long.certified is True and long.extras["bdmc_gap"] < 1.0
    assert long.extras["certifies"] == "estimator=ais_posterior estimator.num_betas=200 estimator.schedule=linear"
    q50, q90, top = long.extras["bdmc_gap_per_example_q50_q90_max"]
    assert q50 <= q90 <= top
    json.loads(long.to_json())  # strict JSON


# ---- 4. a linear-Gaussian net --------------------------------------------------------------------------


def test_linear_gaussian_net_is_bracketed_and_certified_with_enough_betas():
    """Continuous latents: HMC moves, prior -> posterior. The net is in centred form and the estimator runs in
    auxiliary form, so the simulated z must be mapped to eps for the reverse chains to start exactly. The reverse
    weights are checked for unbiasedness (exp(log w_rev) p(v) averages to 1): both directions move with the step
    sizes of one pilot run, fixed before either starts (tests/test_ais_hmc_unbiased.py has the power check)."""
    from nvil.estimators.ais_hmc import ais_hmc_log_w
    from test_gaussian import exact_log_p, linear_net

    net = linear_net(seed=5, form="centred")
    data = torch.zeros(1, 4, dtype=torch.float64)
    for num_betas in (20, 200):
        est = BDMC(num_simulated=50, num_chains=4, batch_size=50, num_betas=num_betas, schedule="sigmoid",
                   num_leapfrog=5, step_size=0.1, form="auxiliary")
        r = est.estimate(net, data, generator=torch.Generator().manual_seed(0), seed=0)
        exact = exact_log_p(net, r.simulated).detach()
        lower, lower_se = mean_and_stderr(r.log_p - exact)
        upper, upper_se = mean_and_stderr(r.log_p_upper - exact)
        assert lower <= 3 * lower_se and upper >= -3 * upper_se, (num_betas, lower, lower_se, upper, upper_se)
        rev, rev_se = ratio_mean_and_se(exact - r.run_log_p_upper)
        assert abs(rev - 1) < 3 * rev_se, (num_betas, rev, rev_se)
        assert 0.3 < r.extras["accept_rate_reverse"] <= 1.0 and r.extras["latents"] == "continuous"
    assert r.certified is True and r.extras["certifies"].startswith("estimator=ais_hmc")
    # The forward side is ais_hmc's own run, random number for random number (what the certificate is about).
    lm = est.latent_model(net, None)
    v, h = (t.repeat_interleave(est.num_runs, 0) for t in est.simulate(lm, 3, torch.Generator().manual_seed(1)))
    log_w, _, _ = est.run_batch(lm, v, h, torch.Generator().manual_seed(2))
    ref, _ = ais_hmc_log_w(lm, v, est.betas, chains=est.num_runs, num_leapfrog=5, step_size=0.1,
                           generator=torch.Generator().manual_seed(2))
    assert torch.equal(log_w, ref)


# ---- 5. evaluate.py --------------------------------------------------------------------------------------


run = run_script  # ``python SCRIPT *args``, in this process


def test_cli_reports_the_certificate_and_refuses_boltzmann_machines(tmp_path):
    from nvil.app.main import train

    sbn = train(make_cfg("train", SYNTHETIC + ["trainer.max_steps=5"]), tmp_path / "sbn")
    proc = run("evaluate.py", f"checkpoint={sbn['checkpoint']}", "estimator=bdmc", "estimator.num_simulated=20",
               "estimator.num_betas=50", "eval.progress=false", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (line,) = [json.loads(s) for s in proc.stdout.splitlines() if s.startswith("{")]
    assert line["estimator"] == "bdmc" and line["num_examples"] == line["num_simulated"] == 20
    assert isinstance(line["certified"], bool) and math.isfinite(line["bdmc_gap"])
    assert line["checks"] == ["bdmc_gap", "bdmc_order"] and line["num_betas"] == 50
    sharded = run("evaluate.py", f"checkpoint={sbn['checkpoint']}", "estimator=bdmc", "eval.shard=0",
                  "eval.num_shards=2", "eval.progress=false", cwd=tmp_path)
    assert sharded.returncode == 2 and sharded.stderr.strip().startswith("error:") and "simulates" in sharded.stderr

    rbm = train(make_cfg("train", [o for o in SYNTHETIC if not o.startswith("model.layers")] +
                         ["model=rbm", "model.n_hidden=4", "learner=cd", "trainer.max_steps=5"]), tmp_path / "rbm")
    proc = run("evaluate.py", f"checkpoint={rbm['checkpoint']}", "estimator=bdmc", "eval.progress=false", cwd=tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    err = proc.stderr.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in proc.stderr, err
    assert "estimator=bdmc" in err and "estimator=raise" in err and "estimator=ais" in err


def test_refuses_dbns_and_bad_settings():
    from nvil.models.dbn import DBN

    est = build_estimator(OmegaConf.create({"name": "bdmc", "num_betas": 10}))
    with pytest.raises(ConfigError, match="estimator=raise"):
        est.check(DBN(6, [5, 4]), None)
    model, _ = tiny_model()
    with pytest.raises(ConfigError, match="inference network"):
        est.check(model, None)
    with pytest.raises(ConfigError, match="estimator.form"):
        BDMC(num_betas=10, form="centered")
    with pytest.raises(ConfigError, match="estimator.max_gap"):
        BDMC(num_betas=10, max_gap=0)
