"""``budget=``: an annealing estimator started small and doubled (temperatures and chains) until its certificate holds
or the next doubling would overrun the budget (``nvil.estimators.budget``). Checked against enumeration (an RBM's
log Z) and a closed form (a linear-Gaussian model of the user's own); the broken variants, a schedule fixed too
small and a budget too small, are not certified and say why."""

from __future__ import annotations

import pytest
import torch
from test_certificate import random_rbm
from test_user_model import LinearGaussianVAE

import nvil
from nvil.core.errors import ConfigError
from nvil.estimators import evaluate_model
from nvil.models.protocol import Latent


@pytest.fixture(scope="module")
def rbm_and_rows():
    m = random_rbm(4, 30, 10, 3.0)  # sharp: 10 temperatures leave a sandwich gap above a nat
    x = (torch.rand(200, 30, generator=torch.Generator().manual_seed(3)) < 0.3).float()
    return m, x


def test_a_budget_grows_ais_until_it_certifies_the_enumerated_log_z(rbm_and_rows):
    m, x = rbm_and_rows
    small = {"num_betas": 160, "num_chains": 16}  # the first round: 10 temperatures, 4 chains
    r = nvil.evaluate(m, x, estimator="ais", budget=60, seed=1, **small)
    rounds = r.extras["budget"]["rounds"]
    assert len(rounds) >= 2 and not rounds[0]["certified"] and rounds[-1]["certified"] and r.certified, rounds
    assert rounds[1]["num_betas"] == 2 * rounds[0]["num_betas"] == 20 and rounds[1]["num_chains"] == 8
    lo, hi = r.extras["log_z_band"]
    assert lo <= m.log_z_exact().item() + 1e-4 and (hi is None or m.log_z_exact().item() <= hi)
    assert r.extras["budget"]["spent"] <= 60 and "stopped" not in r.extras["budget"]


def test_a_budget_too_small_is_not_certified_and_says_what_the_next_doubling_costs(rbm_and_rows):
    m, x = rbm_and_rows
    r = nvil.evaluate(m, x, estimator="ais", budget=1e-3, num_betas=160, num_chains=16)
    assert r.certified is False and len(r.extras["budget"]["rounds"]) == 1
    assert any(w.startswith("budget: not certified within the budget") and "num_betas=20, num_chains=8" in w
               for w in r.warnings), r.warnings


@pytest.mark.parametrize("budget", [0, -1, "soon", float("nan")])
def test_a_bad_budget_is_one_line(rbm_and_rows, budget):
    m, x = rbm_and_rows
    with pytest.raises(ConfigError, match="budget must be a positive number of seconds"):
        nvil.evaluate(m, x, estimator="ais", budget=budget)


def test_a_budget_needs_an_annealing_estimator(rbm_and_rows):
    m, x = rbm_and_rows
    with pytest.raises(ConfigError, match="no num_betas and num_chains to grow"):
        nvil.evaluate(m, x, estimator="exact", budget=5)


@pytest.mark.slow
def test_a_budget_certifies_ais_on_a_sharp_posterior_where_a_small_fixed_schedule_does_not():
    """A user's linear-Gaussian model, 3 latents, 12 visibles, sigma 0.3: AIS from the prior at 60 temperatures x 4
    chains is uncertified (per-example ESS, BDMC gap) and several nats low; within a budget it certifies, and the
    estimate is within 3 SE of the closed form."""
    m = LinearGaussianVAE(d=3, v=12, sigma=0.3, seed=0)
    m.latent = Latent.continuous(3)
    x = m.sample_likelihood(m.sample_prior(8, torch.Generator().manual_seed(1)), torch.Generator().manual_seed(2))
    x = x.detach()
    exact = m.exact_log_p(x).mean().item()
    settings = {"start": "prior", "num_simulated": 4, "iwae_samples": 50, "num_leapfrog": 3, "batch_size": 8}
    fixed = evaluate_model(m, x, "ais", num_betas=60, num_chains=4, **settings)
    assert fixed.certified is False
    grown = evaluate_model(m, x, "ais", budget=120, **settings)
    assert grown.certified, grown.extras["budget"]
    assert abs(grown.mean_log_p - exact) < 3 * grown.stderr, (grown.mean_log_p, exact, grown.stderr)


def test_evaluate_py_takes_estimator_budget(tmp_path):
    """``evaluate.py checkpoint=... estimator.budget=SECONDS`` (here through ``nvil.evaluate``, which composes the
    same config): the rounds in the JSON line, each built from the config with its two sizes replaced; a budget with
    shards, or for an estimator that has no temperatures, is refused in one line."""
    from conftest import SYNTHETIC, make_cfg

    from nvil.app.main import train

    args = [a for a in SYNTHETIC if not a.startswith(("final_eval", "model.layers"))]
    metrics = train(make_cfg("train", [*args, "model=rbm", "model.n_hidden=6", "learner=sap", "trainer.max_steps=40",
                                       "final_eval.enabled=false"]), tmp_path / "run")
    ck = metrics["checkpoint"]
    quiet = {"eval.num_examples": 20, "eval.progress": False, "eval.output": str(tmp_path / "e.jsonl")}
    r = nvil.evaluate(ck, estimator="ais", budget=60, num_betas=160, num_chains=16, **quiet)
    rounds = r.extras["budget"]["rounds"]
    assert rounds[0]["num_betas"] == 10 and rounds[0]["num_chains"] == 4 and r.certified == rounds[-1]["certified"]
    with pytest.raises(ConfigError, match="cannot be split between processes"):
        nvil.evaluate(ck, estimator="ais", budget=60, **{**quiet, "eval.shard": 0, "eval.num_shards": 2})
    with pytest.raises(ConfigError, match="Exact has no num_betas and num_chains to grow"):  # no temperatures
        nvil.evaluate(ck, estimator="exact", **{**quiet, "estimator.budget": 5})


def test_no_schedule_means_a_budget_and_a_schedule_given_is_run_as_given():
    """``budget="auto"`` is the default of ``evaluate_model`` and ``nvil.evaluate``: an annealing estimator given no
    schedule grows within ``AUTO_SECONDS`` and says what it spent; one given a schedule (or ``budget=None``) runs
    it as given; an estimator without temperatures is unaffected."""
    from nvil.estimators.budget import AUTO_SECONDS
    m = LinearGaussianVAE(d=2, v=5, sigma=1.0, seed=0)
    x = m.sample_likelihood(m.sample_prior(6, torch.Generator().manual_seed(1)), torch.Generator().manual_seed(2))
    x = x.detach()
    quick = {"num_simulated": 4, "iwae_samples": 50, "num_leapfrog": 3}
    grown = evaluate_model(m, x, **quick)
    assert grown.extras["budget"]["seconds"] == AUTO_SECONDS and grown.extras["budget"]["rounds"]
    assert grown.extras["budget"]["spent"] < AUTO_SECONDS and grown.certified
    fixed = evaluate_model(m, x, num_betas=30, num_chains=4, **quick)
    assert "budget" not in fixed.extras and fixed.summary()["num_betas"] == 30
    assert "budget" not in evaluate_model(m, x, budget=None, num_betas=30, **quick).extras
    assert "budget" not in nvil.evaluate(m, x, estimator="iwae", num_samples=20).extras
