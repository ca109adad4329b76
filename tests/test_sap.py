"""Maximum-likelihood learners for Boltzmann machines (nvil/learners/sap.py) against the exact gradient.

On a tiny RBM (6 visible, 4 hidden: 1024 joint states) the gradient of the mean log-likelihood is known
exactly, by autograd through a brute-force enumeration of the energy:
- SAP's surrogate with particles at exact draws from the model is unbiased, its error falls as 1/M;
- the learners' own chains (sap, trans_sap, pt_sap), once mixed, give the exact gradient on average;
- exact_ml's gradient is the exact gradient; CD-1's is the (exactly computable) CD-1 expectation, biased;
- training resumes exactly, persistent particles included; train.py + evaluate.py estimator=exact work
  end to end on an RBM.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from omegaconf import OmegaConf

from conftest import SYNTHETIC, make_cfg, run_script
from nvil.estimators.exact import enumerate_states
from nvil.models.rbm import BoltzmannMachine, State
from nvil.core.checkpoint import load_checkpoint
from nvil.learners import build_learner
from nvil.learners.sap import SAP
from nvil.app.main import train

DT = torch.float64
CPU = torch.device("cpu")


# ---- a tiny RBM, its data, and brute force ----------------------------------------------------------------


def tiny_rbm(seed: int = 0, scale: float = 0.5) -> BoltzmannMachine:
    torch.manual_seed(seed)
    m = BoltzmannMachine(6, 4).to(DT)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, scale)
    return m


def tiny_data(n: int = 20, seed: int = 1) -> torch.Tensor:
    """Fixed binary rows that the model did not generate, so the data and model terms differ."""
    g = torch.Generator().manual_seed(seed)
    pixel_means = torch.tensor([0.9, 0.8, 0.2, 0.1, 0.6, 0.4], dtype=DT)
    return (torch.rand(n, 6, generator=g, dtype=DT) < pixel_means).to(DT)


def joint_states(m):
    v = enumerate_states(m.n_pixels, 0, 2**m.n_pixels, dtype=DT)
    h = enumerate_states(m.n_hidden, 0, 2**m.n_hidden, dtype=DT)
    return v.repeat_interleave(h.shape[0], 0), h.repeat(v.shape[0], 1)


def brute_energy(m, v, h):
    """E(v, h) = -v'W h - b'v - c'h, from the definition (no lateral or label terms in this RBM)."""
    return -torch.einsum("ni,ij,nj->n", v, m.W, h) - v @ m.b - h @ m.c


def brute_mean_log_p(m, x):
    """mean_x log p(x) by summing exp(-E) over every h, and over every (v, h) for log Z."""
    hs = enumerate_states(m.n_hidden, 0, 2**m.n_hidden, dtype=DT)
    e_data = brute_energy(m, x.repeat_interleave(hs.shape[0], 0), hs.repeat(x.shape[0], 1)).view(x.shape[0], -1)
    log_z = torch.logsumexp(-brute_energy(m, *joint_states(m)), 0)
    return (torch.logsumexp(-e_data, 1) - log_z).mean()


def flat_grad(m) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in m.parameters()])


def exact_gradient(m, x) -> torch.Tensor:
    """d/dtheta mean log p(x), by autograd through brute-force enumeration."""
    m.zero_grad()
    brute_mean_log_p(m, x).backward()
    g = flat_grad(m).clone()
    m.zero_grad()
    return g


def learner_for(m, mode: str, seed: int = 0, **options) -> SAP:
    """A SAP learner from the project's own learner config (configs/learner/<mode>.yaml) plus options."""
    cfg = make_cfg("train", [f"learner={mode}", "model=rbm"]).learner
    OmegaConf.set_struct(cfg, False)
    for key, value in options.items():
        OmegaConf.update(cfg, key, value)
    return build_learner(cfg, m, None, CPU, seed)


def surrogate_gradient(learner: SAP, x: torch.Tensor) -> torch.Tensor:
    """The gradient estimate of one learner.step (minus the surrogate's gradient), with the parameters put
    back afterwards so every estimate is taken at the same model."""
    saved = {k: v.clone() for k, v in learner.model.state_dict().items()}
    learner.sgd_in_products = False  # the gradient left in .grad (plain SGD would apply it inside the products)
    learner.step(x)
    g = -flat_grad(learner.model).clone()
    with torch.no_grad():
        for k, v in learner.model.state_dict().items():
            v.copy_(saved[k])
    return g


def exact_particles(m, n: int, g: torch.Generator) -> State:
    v, h = joint_states(m)
    with torch.no_grad():
        p = torch.softmax(-brute_energy(m, v, h), 0)
    idx = torch.multinomial(p, n, replacement=True, generator=g)
    return State(v[idx].clone(), h[idx].clone())


# ---- SAP's gradient against the exact gradient -----------------------------------------------------------------


def test_model_free_energy_and_log_z_agree_with_brute_force():
    """The premise of the comparisons below: -(mean F(x) + log Z) is the brute-force mean log p."""
    m, x = tiny_rbm(), tiny_data()
    assert torch.allclose(-(m.free_energy(x).mean() + m.log_z_exact()), brute_mean_log_p(m, x), rtol=0, atol=1e-12)


def test_sap_gradient_converges_to_the_exact_gradient_as_particles_grow():
    """Particles at exact draws from p (one Gibbs sweep, inside learner.negatives, keeps them exact): the
    estimate is unbiased for every M and its mean squared error falls as 1/M."""
    m, x = tiny_rbm(), tiny_data()
    exact = exact_gradient(m, x)
    g = torch.Generator().manual_seed(0)
    repeats, mse, means = 400, {}, {}
    for M in (10, 100, 1000):
        learner = learner_for(m, "sap", **{"num_particles": M})
        estimates = []
        for _ in range(repeats):
            learner.particles = exact_particles(m, M, g)
            estimates.append(surrogate_gradient(learner, x))
        est = torch.stack(estimates)
        mse[M] = ((est - exact) ** 2).sum(1).mean().item()
        se = est.std(0) / math.sqrt(repeats)
        z = (est.mean(0) - exact) / se
        assert z.abs().max() < 4, f"M={M}: the mean estimate is {z.abs().max():.1f} standard errors off"
        means[M] = est.mean(0)
    assert mse[10] > mse[100] > mse[1000]
    # unbiased: MSE = variance / M exactly, so each tenfold M divides it by about ten
    assert 6 < mse[10] / mse[100] < 16 and 6 < mse[100] / mse[1000] < 16, mse
    assert (means[1000] - exact).norm() < (means[10] - exact).norm()


@pytest.mark.parametrize("mode, options", [
    ("sap", {"k": 5}),
    ("trans_sap", {"k": 2, "tt.num_betas": 5, "tt.beta_min": 0.5, "tt.every": 1}),
    ("pt_sap", {"k": 2, "pt.num_temps": 3, "pt.beta_min": 0.5}),
], ids=["sap", "trans_sap", "pt_sap"])
def test_learners_own_chains_give_the_exact_gradient_once_mixed(mode, options):
    """Chains started at the data by the learner (its _init_particles), moved only by learner.negatives
    with the parameters held fixed: after a burn-in their surrogate gradient averages to the exact one.
    Successive estimates are correlated, so the standard error comes from 20 batch means."""
    m, x = tiny_rbm(), tiny_data()
    exact = exact_gradient(m, x)
    learner = learner_for(m, mode, **{"num_particles": 1000, **options})
    for _ in range(20):  # burn-in
        surrogate_gradient(learner, x)
    if mode == "pt_sap":
        assert learner.particles.x.shape[0] == 3 * 1000
    if mode == "trans_sap":
        assert learner.last_tt_accept is not None and 0.2 < learner.last_tt_accept.item() < 1
    est = torch.stack([surrogate_gradient(learner, x) for _ in range(200)])
    batch_means = est.view(20, 10, -1).mean(1)
    se = batch_means.std(0) / math.sqrt(20)
    z = (est.mean(0) - exact) / se
    assert z.abs().max() < 4, f"{mode}: the mean estimate is {z.abs().max():.1f} standard errors off"
    # and the estimate is informative: the exact gradient is far from zero on this scale
    assert (exact.abs() / se).max() > 20


def test_exact_ml_gradient_is_the_exact_gradient():
    m, x = tiny_rbm(), tiny_data()
    exact = exact_gradient(m, x)
    before = [p.detach().clone() for p in m.parameters()]
    learner = learner_for(m, "exact_ml", **{"lr": 0.1})
    metrics = learner.step(x)
    got = -flat_grad(m)
    assert torch.allclose(got, exact, rtol=0, atol=1e-12)
    with torch.no_grad():
        m_before = tiny_rbm()
        assert metrics["train/log_p_exact_batch"].item() == pytest.approx(brute_mean_log_p(m_before, x).item(), abs=1e-12)
    # one plain SGD step uphill on the log-likelihood
    for p, p0, g in zip(m.parameters(), before, torch.split(exact, [p.numel() for p in m.parameters()])):
        assert torch.allclose(p.detach(), p0 + 0.1 * g.view_as(p0), rtol=0, atol=1e-14)
    assert learner.negatives(x) is None and learner.particles is None


def test_exact_ml_refuses_models_it_cannot_enumerate():
    from nvil.core.errors import ConfigError

    with pytest.raises(ConfigError, match="H <= 20"):
        learner_for(BoltzmannMachine(6, 21), "exact_ml")


def cd1_expected_gradient(m, x) -> torch.Tensor:
    """E[CD-1 estimate] exactly: -d/dtheta [mean F(x) - sum_x' w(x') F(x')], w(x') = mean_x K(x -> x'),
    K(x -> x') = sum_h p(h | x) p(x' | h) from the brute-force joint."""
    vs = enumerate_states(m.n_pixels, 0, 2**m.n_pixels, dtype=DT)
    hs = enumerate_states(m.n_hidden, 0, 2**m.n_hidden, dtype=DT)
    with torch.no_grad():
        e_data = brute_energy(m, x.repeat_interleave(hs.shape[0], 0), hs.repeat(x.shape[0], 1)).view(x.shape[0], -1)
        h_given_data = torch.softmax(-e_data, 1)  # [data, h]
        e_all = brute_energy(m, vs.repeat_interleave(hs.shape[0], 0), hs.repeat(vs.shape[0], 1)).view(vs.shape[0], -1)
        v_given_h = torch.softmax(-e_all, 0)  # [v, h]
        w = (h_given_data @ v_given_h.T).mean(0)  # [v]
    m.zero_grad()
    (-(m.free_energy(x).mean() - (w * m.free_energy(vs)).sum())).backward()
    g = flat_grad(m).clone()
    m.zero_grad()
    return g


def test_cd1_is_unbiased_for_its_own_expectation_and_biased_for_ml():
    m, x = tiny_rbm(scale=1.0), tiny_data()
    exact, cd1 = exact_gradient(m, x), cd1_expected_gradient(m, x)
    batch = x.repeat(50, 1)  # 1000 chains restarted at the data each step: the same expectation as x
    learner = learner_for(m, "cd")
    est = torch.stack([surrogate_gradient(learner, batch) for _ in range(300)])
    se = est.std(0) / math.sqrt(est.shape[0])
    z_cd = (est.mean(0) - cd1) / se
    assert z_cd.abs().max() < 4, f"CD-1 is {z_cd.abs().max():.1f} standard errors from its exact expectation"
    z_ml = (est.mean(0) - exact) / se
    assert z_ml.abs().max() > 20, "CD-1 should be visibly biased for the ML gradient on this model"
    assert learner.particles is None and learner.gibbs_sweeps == 300  # CD keeps no persistent chains


def test_tempered_transitions_report_the_mean_acceptance_over_all_runs():
    """mcmc/tt_accept_mean is the mean of every run's acceptance rate so far (the paper's figure) and mcmc/tt_runs
    their count; mcmc/tt_accept_rate stays the last run's. The runs' rates differ here, so a report that gave the
    last rate (or the first) as the mean fails."""
    m, x = tiny_rbm(scale=1.0), tiny_data()
    learner = learner_for(m, "trans_sap", k=1, num_particles=50, **{"tt.num_betas": 4, "tt.beta_min": 0.2,
                                                                     "tt.every": 2, "tt.start_step": 0})
    assert learner.phase.report() == {}  # before any run
    rates = []
    for update in range(12):
        learner.step(x)
        if update % 2 == 0:  # runs at updates 0, 2, ..., 10 (the learner's clock before its step)
            rates.append(learner.last_tt_accept.item())
    report = learner.phase.report()
    assert len(set(rates)) > 1
    assert report["mcmc/tt_runs"].item() == len(rates) == 6
    assert report["mcmc/tt_accept_mean"].item() == pytest.approx(sum(rates) / len(rates), rel=1e-6)  # float32 rates
    assert report["mcmc/tt_accept_rate"].item() == rates[-1]


def test_cd_k_rises_linearly_to_k_final():
    """learner.k_final: k goes from k to k_final over k_ramp updates, then stays; each CD update takes k sweeps."""
    m, x = tiny_rbm(scale=1.0), tiny_data()
    learner = learner_for(m, "cd", k=1, k_final=5, k_ramp=8)
    seen = []
    for _ in range(12):
        before = learner.gibbs_sweeps
        learner.step(x)
        seen.append(learner.gibbs_sweeps - before)
    assert seen == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 5, 5]


# ---- resume with persistent particles ---------------------------------------------------------------------------


def rbm_overrides(*extra: str) -> list[str]:
    return [o for o in SYNTHETIC if not o.startswith("model.layers")] + list(extra)


@pytest.mark.parametrize("learner", [
    ["learner=trans_sap", "learner.tt.num_betas=4", "learner.tt.every=7", "learner.tt.start_step=5"],
    ["learner=pt_sap", "learner.pt.num_temps=3"],
], ids=["trans_sap", "pt_sap"])
def test_resume_gives_identical_parameters_and_particles(tmp_path, learner):
    n = 40  # the interruption falls on a validation step (val_every=20), so both runs validate alike
    base = rbm_overrides("model=rbm", "model.n_hidden=4", "learner.num_particles=30", *learner)
    train(make_cfg("train", base + [f"trainer.max_steps={n}"]), tmp_path / "straight")
    train(make_cfg("train", base + [f"trainer.max_steps={n // 2}"]), tmp_path / "resumed")
    train(make_cfg("train", base + [f"trainer.max_steps={n}", "trainer.resume=true"]), tmp_path / "resumed")
    a = load_checkpoint(tmp_path / "straight/checkpoints/last.pt")
    b = load_checkpoint(tmp_path / "resumed/checkpoints/last.pt")
    assert a["step"] == b["step"] == n
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    la, lb = a["learner"], b["learner"]
    assert la["particles_x"] is not None and la["particles_x"].shape[0] == 30 * (3 if "pt_sap" in learner[0] else 1)
    for k in ("particles_x", "particles_h", "generator"):
        assert torch.equal(la[k], lb[k]), k
    assert la["updates"] == lb["updates"] == n and la["gibbs_sweeps"] == lb["gibbs_sweeps"]
    if "trans_sap" in learner[0]:  # tempered-transition runs at updates 7, 14, ..., 35 (start_step 5): 5 runs
        assert la["gibbs_sweeps"] == n + 5 * 2 * 3
        assert la["tt_runs"] == lb["tt_runs"] == 5 and torch.equal(la["tt_accept_sum"], lb["tt_accept_sum"])
    assert a["best_score"] == b["best_score"]


# ---- end to end ---------------------------------------------------------------------------------------------------


run = run_script  # ``python SCRIPT *args``, in this process


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_train_rbm_with_sap_then_evaluate_exactly(tmp_path):
    run_dir = tmp_path / "run"
    proc = run("train.py", *rbm_overrides("model=rbm", "model.n_hidden=8", "learner=sap", "trainer.max_steps=50",
                                          f"hydra.run.dir={run_dir}"))
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in records if "val/log_p_exact" in r]
    assert [r["step"] for r in val] == [20, 40, 50]
    assert all("train/log_p_exact" in r and r["val/log_p_exact"] < 0 for r in val)
    assert any("train/free_energy_gap" in r for r in records)
    assert not any("val/elbo" in r for r in records)

    ckpt = run_dir / "checkpoints/best.pt"
    best_step = load_checkpoint(ckpt)["step"]
    proc = run("evaluate.py", f"checkpoint={ckpt}", "estimator=exact", "data.split=valid", "eval.num_examples=100",
               "eval.progress=false", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (line,) = json_lines(proc.stdout)
    assert line["estimator"] == "exact" and line["num_examples"] == 100 and line["num_latent"] == 8
    assert set(line) >= {"mean_log_p", "stderr", "log_z", "step"} and line["step"] == best_step
    assert math.isfinite(line["log_z"]) and -12 * math.log(2) - 5 < line["mean_log_p"] < 0
    # the same 100 validation rows the loop scored at the best step
    logged = next(r["val/log_p_exact"] for r in val if r["step"] == best_step)
    assert line["mean_log_p"] == pytest.approx(logged, abs=2e-3)
    assert json_lines((ckpt.parent / "best.pt.eval.jsonl").read_text())[-1]["log_z"] == line["log_z"]


def test_greedy_per_layer_settings_pick_each_rbms_learner():
    from nvil.models.dbn import DBN
    from nvil.core.errors import ConfigError

    cfg = make_cfg("train", ["model=dbn", "learner=greedy", "learner.layer_steps=3",
                             "learner.per_layer=[{layer_learner: cd, k_final: 4, k_ramp: 2}, {layer_learner: sap, lr: 0.002}]"]).learner
    dbn = DBN(6, [5, 4])
    x = (torch.rand(20, 6, generator=torch.Generator().manual_seed(0)) < 0.5).float()
    greedy = build_learner(cfg, dbn, None, CPU, 0)
    sweeps = []
    for _ in range(3):
        before = greedy.inner.gibbs_sweeps
        greedy.step(x)
        sweeps.append(greedy.inner.gibbs_sweeps - before)
    assert greedy.inner.mode == "cd" and sweeps == [1, 2, 4]  # RBM 1: CD with k rising 1 -> 4 over 2 updates
    greedy.step(x)
    assert greedy.layer == 1 and greedy.inner.mode == "sap" and greedy.inner.k_final is None
    assert greedy.inner.optimizer.param_groups[0]["lr"] == 0.002 and greedy.inner.particles is not None
    with pytest.raises(ConfigError, match="one entry per RBM"):
        cfg = make_cfg("train", ["model=dbn", "learner=greedy", "learner.per_layer=[{k: 2}]"]).learner
        build_learner(cfg, dbn, None, CPU, 0)


def test_pt_sap_logs_the_swap_rate_of_every_adjacent_pair():
    """Each PT step proposes only the even or the odd pairs; the logged rates cover all K - 1 pairs, each the mean
    over the steps since the last log that proposed it."""
    from nvil.mcmc.parallel_tempering import SwapRates

    learner = learner_for(tiny_rbm(), "pt_sap", num_particles=20, k=1, **{"pt.num_temps": 10})
    x = tiny_data()
    per_step = []
    original = learner.pt.step

    def recording_step(*args, **kwargs):
        state, info = original(*args, **kwargs)
        per_step.append(info["swap_rate"].clone())
        return state, info

    learner.pt.step = recording_step
    for _ in range(3):
        assert not any(k.startswith("mcmc/pt_swap_rate") for k in learner.step(x))  # only at log steps
    metrics = learner.step(x, diagnostics=True)
    keys = sorted(k for k in metrics if k.startswith("mcmc/pt_swap_rate/"))
    assert keys == sorted(f"mcmc/pt_swap_rate/{k}-{k + 1}" for k in range(9))
    expected = torch.nanmean(torch.stack(per_step), 0)  # 4 steps: each pair proposed twice
    for k in range(9):
        assert metrics[f"mcmc/pt_swap_rate/{k}-{k + 1}"].item() == pytest.approx(expected[k].item(), abs=1e-6)
    # one step between logs proposes half the pairs; the others keep their last rate
    assert len([k for k in learner.step(x, diagnostics=True) if k.startswith("mcmc/pt_swap_rate/")]) == 9

    rates = SwapRates(3)
    nan = float("nan")
    for step in ([0.5, nan, 1.0], [nan, 0.2, nan], [0.7, nan, 0.0]):
        rates.add(torch.tensor(step))
    assert {k: round(v.item(), 6) for k, v in rates.report().items()} == {"0-1": 0.6, "1-2": 0.2, "2-3": 0.5}
    rates.add(torch.tensor([nan, 1.0, nan]))
    assert {k: round(v.item(), 6) for k, v in rates.report().items()} == {"0-1": 0.6, "1-2": 1.0, "2-3": 0.5}
