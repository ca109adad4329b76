"""Adaptive tempered SMC (``nvil.estimators.smc``, ``estimator=smc``) against enumeration.

- Unbiased in Z: over many independent runs on an enumerable RBM, the mean of Z_r / Z is 1 within 3 standard errors,
  and the standard error is small enough that the test has power: the broken variants (weights kept, not reset to
  their mean, after resampling; rejuvenation at the previous beta) miss by many standard errors.
- The adaptive ladder keeps every step's conditional ESS share at the target and reaches beta = 1.
- Systematic resampling keeps each particle floor(N W_i) or ceil(N W_i) times.
- ``estimator=smc``: certified, its interval holding the exact log Z, on an RBM and on a DBM's top machine;
  from ``evaluate.py`` on a trained checkpoint; bad settings are one line.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_certificate import random_rbm
from test_dbm import CONFIGS, Brute, make_dbm

from nvil.core.errors import ConfigError
from nvil.estimators import SMC
from nvil.estimators.ais_rbm import RBMPath, base_rate
from nvil.estimators.smc import adaptive_betas, cess, group_log_z, smc, systematic

RUNS, PARTICLES = 400, 16


@pytest.fixture(scope="module")
def rbm_path():
    m = random_rbm(1, 20, 10, 1.5)
    data = (torch.rand(300, m.n_pixels, generator=torch.Generator().manual_seed(5)) < 0.3).float()
    path = RBMPath(m, base_rate(m, data, 0.05))
    g = torch.Generator().manual_seed(0)
    betas = adaptive_betas(path, path.sample_base(2 * PARTICLES, g), 2, target=0.9, generator=g)
    return path, betas, m.log_z_exact().double().item()


def z_ratios(path, betas, exact, seed=1, **broken) -> tuple[float, float]:
    """(mean, SE) over RUNS independent runs of Z_r / Z on the ladder ``betas``."""
    g = torch.Generator().manual_seed(seed)
    log_w, _, _ = smc(path, path.sample_base(RUNS * PARTICLES, g), betas, RUNS, generator=g, **broken)
    r = torch.exp(group_log_z(log_w, RUNS) + path.log_z0() - exact)
    return r.mean().item(), r.std().item() / math.sqrt(RUNS)


def test_smc_is_unbiased_in_z(rbm_path):
    mean, se = z_ratios(*rbm_path)
    assert se < 0.03, se  # power: the broken variants below miss by far more
    assert abs(mean - 1) < 3 * se, (mean, se)


@pytest.mark.parametrize("broken", [{"renormalise": False}, {"lag": True}], ids=["weights-kept", "moves-lag"])
def test_broken_variants_are_biased(rbm_path, broken):
    mean, se = z_ratios(*rbm_path, **broken)
    assert abs(mean - 1) > 5 * max(se, 0.01), (broken, mean, se)


def test_the_adaptive_ladder_keeps_the_conditional_ess_at_its_target(rbm_path):
    path, _, _ = rbm_path
    g = torch.Generator().manual_seed(3)
    seen = []
    state = path.sample_base(64, g)
    log_w = torch.zeros(64, dtype=torch.float64)

    def record(k, step):
        seen.append(step)

    betas = adaptive_betas(path, state, 2, target=0.7, generator=g, on_step=record)
    assert betas[0] == 0 and betas[-1] == 1 and bool((betas.diff() > 0).all())
    assert 3 <= len(betas) - 1 < 200
    # the first step from equal weights: its CESS share is the target (bisection), or above it where beta' = 1
    share = cess(log_w, seen[0], 2)
    assert bool((share >= 0.7 - 1e-6).all()) and (betas[1] == 1 or share.min().item() < 0.7 + 0.01)
    with pytest.raises(ConfigError, match="max_betas=2"):
        adaptive_betas(path, path.sample_base(64, g), 2, target=0.99, max_betas=2, generator=g)


def test_systematic_resampling_keeps_floor_or_ceil_copies():
    w = torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64)
    for seed in range(20):
        idx = systematic(w.log(), torch.Generator().manual_seed(seed))[0]
        counts = torch.bincount(idx, minlength=4).double()
        assert bool(((counts - 4 * w[0]).abs() < 1).all()), counts


def test_estimator_smc_certifies_an_rbm_within_its_interval():
    m = random_rbm(4, 30, 10, 3.0)  # sharp: weights ~ N(0, 9)
    exact = m.log_z_exact().double().item()
    data = (torch.rand(300, m.n_pixels, generator=torch.Generator().manual_seed(5)) < 0.3).float()
    for seed in range(3):
        r = SMC(num_particles=50, num_runs=10).estimate(m, data[:20], train=data, seed=seed)
        lo, hi = r.extras["log_z_band"]
        assert r.certified is True, r.warnings
        assert (lo is None or lo <= exact + 1e-4) and (hi is None or exact <= hi + 1e-4), (lo, exact, hi)
        assert r.extras["schedule"] == "smc" and r.extras["log_z_schedule"]["num_runs"] == 10


def test_estimator_smc_on_a_dbms_top_machine():
    dbm, Ws, bs = make_dbm(*CONFIGS["2-layers"])
    brute = Brute([7, 5, 4], Ws, bs)
    x = brute.sample_v(150, seed=11)
    with torch.no_grad():
        r = SMC(num_particles=50, num_runs=10, num_climb=16, num_data_probes=100).estimate(dbm, x, train=x)
    assert r.certified is True, r.warnings
    assert abs(r.extras["log_z"] - brute.log_z.item()) < 3 * r.shared_stderr + 1e-3


@pytest.mark.parametrize("settings, message", [
    ({"cess": 1.0}, "estimator.cess must lie strictly between 0 and 1"),
    ({"num_particles": 1}, "num_particles must be at least 2"),
    ({"num_runs": 0}, "estimator.num_runs"),
])
def test_bad_settings_are_one_line(settings, message):
    with pytest.raises(ConfigError, match=message):
        SMC(**settings)


def test_evaluate_py_estimator_smc_on_a_trained_rbm(tmp_path):
    """``evaluate.py checkpoint=... estimator=smc`` (through ``nvil.evaluate``, which composes the same config) on
    an RBM trained by SAP: certified, its log Z within the SE of the enumerated one, cached beside the checkpoint."""
    import nvil
    from conftest import SYNTHETIC, make_cfg

    from nvil.app.main import train
    from nvil.models.rbm import BoltzmannMachine

    args = [a for a in SYNTHETIC if not a.startswith(("final_eval", "model.layers"))]
    metrics = train(make_cfg("train", [*args, "model=rbm", "model.n_hidden=6", "learner=sap", "trainer.max_steps=40",
                                       "final_eval.enabled=false"]), tmp_path / "run")
    ck = metrics["checkpoint"]
    quiet = {"eval.num_examples": 20, "eval.progress": False, "eval.output": str(tmp_path / "e.jsonl")}
    r = nvil.evaluate(ck, estimator="smc", num_particles=20, num_runs=8, **quiet)
    model = nvil.load(ck)
    assert isinstance(model, BoltzmannMachine)
    exact = model.log_z_exact().double().item()
    assert r.certified is True, r.warnings
    assert abs(r.extras["log_z"] - exact) < 3 * r.shared_stderr + 1e-3, (r.extras["log_z"], exact)
    again = nvil.evaluate(ck, estimator="smc", num_particles=20, num_runs=8, **quiet)
    assert again.extras["log_z_cached"] and again.extras["log_z"] == r.extras["log_z"]
    with pytest.raises(ConfigError, match="did you mean estimator.num_particles"):
        nvil.evaluate(ck, estimator="smc", num_particle=20, **quiet)


def user_smc_ratios(monkeypatch=None, **broken):
    """Z_r / p(x) over 400 runs of ``estimator=smc`` on two examples of a user's linear-Gaussian model (closed-form
    log p(x)): [runs, examples]."""
    import functools

    from test_user_model import LinearGaussianVAE

    from nvil.estimators import ModelSMC, smc_per_example
    m = LinearGaussianVAE(d=2, v=6, sigma=0.5, seed=0)
    x = m.sample_likelihood(m.sample_prior(2, torch.Generator().manual_seed(1)), torch.Generator().manual_seed(2))
    x = x.detach()
    if broken:
        monkeypatch.setattr(smc_per_example, "smc", functools.partial(smc, **broken))
    r = ModelSMC(num_particles=8, num_runs=400, start="prior", num_leapfrog=3, iwae_samples=0, num_simulated=0,
                 cess=0.8).estimate(m, x, seed=0)
    return torch.exp(r.run_log_p.double() - m.exact_log_p(x).double().detach().unsqueeze(0))


def test_per_example_smc_is_unbiased_for_p_x_on_a_users_model():
    ratio = user_smc_ratios()
    mean, se = ratio.mean(0), ratio.std(0) / math.sqrt(ratio.shape[0])
    assert bool((se < 0.06).all()), se
    assert bool(((mean - 1).abs() < 3 * se).all()), (mean, se)


def test_per_example_smc_without_renormalising_is_caught(monkeypatch):
    ratio = user_smc_ratios(monkeypatch, renormalise=False)
    mean, se = ratio.mean(0), ratio.std(0) / math.sqrt(ratio.shape[0])
    assert bool(((mean - 1).abs() > 5 * se).all()), (mean, se)


def sbn_ratios(monkeypatch=None, **broken):
    """Sum_h P*(v, h) estimates over the true value for 300 runs of ``estimator=smc`` on three rows of a 7-latent
    SBN (enumerated by ``Exact``): [runs, examples]."""
    import functools

    from conftest import tiny_model

    from nvil.estimators import Exact, PosteriorSMC, smc_per_example
    sbn, q = tiny_model(seed=1, scale=2.0)
    x = (torch.rand(3, 6, generator=torch.Generator().manual_seed(0)) < 0.5).float()
    exact = Exact().estimate(sbn, x, inference=q).log_p.double()
    if broken:
        monkeypatch.setattr(smc_per_example, "smc", functools.partial(smc, **broken))
    r = PosteriorSMC(num_particles=8, num_runs=300, cess=0.8).estimate(sbn, x, inference=q, seed=0)
    return torch.exp(r.run_log_p.double() - exact.unsqueeze(0))


def test_smc_over_an_sbns_binary_latents_is_unbiased_and_the_broken_variant_is_not(monkeypatch):
    ratio = sbn_ratios()
    mean, se = ratio.mean(0), ratio.std(0) / math.sqrt(ratio.shape[0])
    assert bool((se < 0.05).all()) and bool(((mean - 1).abs() < 3 * se).all()), (mean, se)
    ratio = sbn_ratios(monkeypatch, renormalise=False)
    mean, se = ratio.mean(0), ratio.std(0) / math.sqrt(ratio.shape[0])
    assert bool(((mean - 1).abs() > 5 * se).all()), (mean, se)


def test_estimator_smc_reaches_every_family_by_its_name():
    """One name, the class each model needs: a Boltzmann machine's log Z (SMC), a DBM's top machine (SMC), a built-in
    net's binary latents (PosteriorSMC, with a DBN's top log Z), a model through the protocol (ModelSMC)."""
    from conftest import tiny_dbn, tiny_model
    from test_user_model import LinearGaussianVAE

    from nvil.estimators import ModelSMC, PosteriorSMC, build_estimator
    from nvil.models.gaussian import GaussianBeliefNet
    sbn, q = tiny_model()
    cases = [(random_rbm(0), None, SMC), (make_dbm(*CONFIGS["2-layers"])[0], None, SMC), (sbn, q, PosteriorSMC),
             (tiny_dbn(3), None, PosteriorSMC), (LinearGaussianVAE(), None, ModelSMC),
             (GaussianBeliefNet(6, [2]), None, ModelSMC)]
    for model, inference, cls in cases:
        assert type(build_estimator({"name": "smc"}, model, inference=inference)) is cls, type(model).__name__


def test_a_dbns_top_log_z_by_smc_is_certified_and_holds_the_exact_value():
    """``estimator.log_z.sampler=smc``: the DBN estimators' top-machine log Z by SMC, with the same certificate."""
    from conftest import tiny_dbn

    from nvil.estimators.log_z import top_log_z
    from nvil.estimators.settings import LogZSettings
    dbn = tiny_dbn(3)
    train = (torch.rand(300, 12, generator=torch.Generator().manual_seed(6)) < 0.4).float()
    exact = dbn.top.log_z_exact().double().item()
    for seed in range(3):
        c, _ = top_log_z(dbn, train, LogZSettings(seed=seed, cache=False, num_climb=32, sampler="smc"))
        lo, hi = c.band()
        assert c.certified is True and c.ladder["schedule"] == "smc", c.warnings
        assert (lo is None or lo <= exact) and (hi is None or exact <= hi), (lo, exact, hi)
    with pytest.raises(ConfigError, match="estimator.log_z.sampler must be ais or smc"):
        LogZSettings(sampler="mcmc")


@pytest.mark.parametrize("family", ["dbn", "dbm"])
def test_evaluate_py_estimator_smc_and_budget_auto_on_a_dbn_and_a_dbm(tmp_path, family):
    """``evaluate.py checkpoint=... estimator=smc`` on trained DBN and DBM checkpoints (the DBN's binary latents by
    PosteriorSMC; the DBM's top machine by SMC), certified and within 3 SE of exact enumeration; with
    ``estimator.budget=auto`` and no schedule the rounds start from a quarter of the particles at cess 0.5."""
    import nvil
    from conftest import SYNTHETIC, make_cfg

    from nvil.app.main import train
    args = [a for a in SYNTHETIC if not a.startswith(("final_eval", "model.layers"))]
    spec = {"dbn": ["model=dbn", "model.layers=[6,5]", "learner=greedy", "learner.layer_steps=50",
                    "trainer.max_steps=100"],
            "dbm": ["model=dbm", "model.layers=[6,4]", "learner=dbm_sap", "learner.pretrain_steps=[40,40]",
                    "learner.validation_betas=200", "trainer.val_every=30", "trainer.max_steps=100"]}[family]
    ck = train(make_cfg("train", [*args, *spec, "final_eval.enabled=false"]), tmp_path / "run")["checkpoint"]
    quiet = {"eval.num_examples": 10, "eval.progress": False, "eval.output": str(tmp_path / "e.jsonl")}
    small = {"num_particles": 20, "num_runs": 4} if family == "dbn" else {"num_particles": 20, "num_runs": 8}
    if family == "dbn":
        small["log_z"] = {"num_betas": 200, "num_chains": 20}
    r = nvil.evaluate(ck, estimator="smc", **small, **quiet)
    exact = nvil.evaluate(ck, estimator="exact", **quiet)
    assert r.certified is True, r.warnings
    if family == "dbn":  # log p(v) per example; a DBM's smc is its mean-field bound, below log p(v)
        d = r.log_p.double() - exact.log_p.double()
        assert abs(d.mean().item()) < 3 * (d.std().item() / math.sqrt(len(d)) + r.shared_stderr) + 0.02
    else:
        assert r.mean_log_p <= exact.mean_log_p + 3 * r.shared_stderr
    auto = nvil.evaluate(ck, estimator="smc", budget="auto", **({"log_z": small["log_z"]} if family == "dbn" else {}),
                         **quiet)
    first = auto.extras["budget"]["rounds"][0]
    assert first["cess"] == 0.5 and auto.certified == auto.extras["budget"]["rounds"][-1]["certified"]
