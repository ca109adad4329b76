"""A deep Boltzmann machine through the entry points: ``train.py model=dbm learner=dbm_sap`` resumes bit for bit
from inside the pretraining and from its boundary with the joint phase, validates in nats, and evaluates with
every DBM estimator on one shared log Z; the Chib-style sweep gives the same estimate eagerly and on the fused C
kernel."""

from __future__ import annotations

import pytest
import torch

from conftest import SYNTHETIC, make_cfg
from nvil.app.api import evaluate
from nvil.app.main import train
from nvil.app.resume import run_config
from nvil.core.checkpoint import load_checkpoint
from nvil.core.errors import CheckpointError, ConfigError

DBM = [o for o in SYNTHETIC if not o.startswith("model.layers")] + [
    "model=dbm", "model.layers=[6,4]", "learner=dbm_sap", "learner.pretrain_steps=[40,40]", "learner.k=2",
    "learner.validation_betas=200", "trainer.val_every=30", "trainer.ckpt_every=100000"]


def parameters(run_dir) -> dict:
    return load_checkpoint(run_dir / "checkpoints" / "last.pt")["model"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """160 updates in one run: two pretrained RBMs of 40 updates, then 80 joint updates."""
    run_dir = tmp_path_factory.mktemp("dbm_straight")
    train(make_cfg("train", DBM + ["trainer.max_steps=160", f"hydra.run.dir={run_dir}"]), run_dir)
    return run_dir


@pytest.mark.parametrize("stop", [60, 80], ids=["inside_pretraining", "at_the_joint_phase"])
def test_a_resumed_run_equals_the_straight_one(tmp_path, straight, stop):
    train(make_cfg("train", DBM + [f"trainer.max_steps={stop}"]), tmp_path)
    train(make_cfg("train", DBM + ["trainer.max_steps=160", "trainer.resume=true"]), tmp_path)
    after, expected = parameters(tmp_path), parameters(straight)
    assert after.keys() == expected.keys()
    assert all(torch.equal(after[k], expected[k]) for k in expected)


def test_validation_reports_the_bound_in_nats_next_to_the_exact_log_likelihood(straight):
    import json

    rows = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    joint = [r for r in rows if "val/variational_bound_ais" in r]
    assert joint, "no validation in the joint phase"
    last = joint[-1]
    # the bound lies below exact log p; the AIS log Z (200 betas) and the exact one give nearly the same bound
    assert last["val/variational_bound"] <= last["val/log_p_exact"] + 1e-6
    assert abs(last["val/variational_bound_ais"] - last["val/variational_bound"]) < 0.05
    pretraining = [r for r in rows if any(k.startswith("val/pretrain_layer") for k in r)]
    assert {k for r in pretraining for k in r if k.startswith("val/pretrain")} == \
        {"val/pretrain_layer1/reconstruction_error", "val/pretrain_layer2/reconstruction_error"}


def test_every_dbm_estimator_scores_the_checkpoint_against_the_exact_answer(straight):
    ckpt = straight / "checkpoints" / "last.pt"
    common = ["data.split=test", "eval.num_examples=60", "estimator.log_z.num_betas=2000", "eval.progress=false"]
    exact = evaluate(ckpt, "estimator=exact", "data.split=test", "eval.num_examples=60")
    bound = evaluate(ckpt, "estimator=dbm_bound", *common)
    chib = evaluate(ckpt, "estimator=chib", "estimator.num_runs=4", *common)
    posterior = evaluate(ckpt, "estimator=ais_posterior", "estimator.num_betas=100", "estimator.num_runs=4", *common)
    ais = evaluate(ckpt, "estimator=ais", "estimator.num_betas=2000", "data.split=test", "eval.num_examples=60")
    for r in (bound, chib, posterior, ais):
        assert r.certified, (r.estimator, r.failed, r.warnings)
    # one log Z for dbm_bound, chib and ais_posterior (computed once, then read from the cache)
    assert bound.extras["log_z"] == chib.extras["log_z"] == posterior.extras["log_z"]
    assert chib.extras["log_z_cached"] and posterior.extras["log_z_cached"]
    assert abs(ais.extras["log_z"] - bound.extras["log_z"]) < 3 * (ais.extras["log_z_stderr"]
                                                                  + bound.extras["log_z_stderr"]) + 1e-3
    assert bound.mean <= exact.mean + 3 * bound.extras["log_z_stderr"]
    assert abs(ais.mean - bound.mean) < 0.01  # both the mean-field bound, each with its own log Z
    for r in (chib, posterior):  # per-example estimates of log p(v) itself, at or above the bound
        d = r.log_p - exact.log_p  # paired by example: the estimators' own error
        assert abs(d.mean().item()) < 3 * d.std().item() / len(d) ** 0.5 + 0.01, (r.estimator, d.mean().item())
        assert (r.log_p - bound.log_p).mean().item() >= -0.01, r.estimator


def test_the_fused_sweep_gives_the_eager_chib_estimate(straight):
    ckpt = straight / "checkpoints" / "last.pt"
    args = ["estimator=chib", "estimator.num_runs=2", "data.split=test", "eval.num_examples=20",
            "estimator.log_z.num_betas=500"]
    eager = evaluate(ckpt, *args, "estimator.accel=none")
    native = evaluate(ckpt, *args, "estimator.accel=native")
    assert torch.allclose(eager.log_p, native.log_p, atol=1e-4)


def test_a_resume_may_change_the_mean_field_stopping_rule_and_nothing_else(tmp_path):
    """The mean field's tolerance, cap and over-relaxation set how closely one fixed point is computed, so a resumed
    run may change them (an old run sped up); the learner's other settings still refuse to change."""
    train(make_cfg("train", DBM + ["trainer.max_steps=80", "learner.mean_field_tol=1e-7",
                                   "learner.mean_field_omega=1.0"]), tmp_path)
    train(make_cfg("train", DBM + ["trainer.max_steps=100", "trainer.resume=true", "learner.mean_field_tol=1e-3",
                                   "learner.mean_field_omega=1.3", "learner.mean_field_iters=30"]), tmp_path)
    saved = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert saved["step"] == 100
    assert saved["config"]["learner"]["mean_field_tol"] == 1e-3
    assert saved["config"]["learner"]["mean_field_omega"] == 1.3
    with pytest.raises((CheckpointError, ConfigError), match="cannot resume.*learner.k"):
        train(make_cfg("train", DBM + ["trainer.max_steps=120", "trainer.resume=true", "learner.k=3"]), tmp_path)


def test_a_preset_resumed_with_a_new_mean_field_rule_is_accepted(tmp_path):
    """``train.py experiment=... trainer.resume=true`` compares the preset's sections with the run's: a changed
    mean-field stopping rule passes, a changed learner.k is refused in one line."""
    train(make_cfg("train", DBM + ["trainer.max_steps=40", "learner.mean_field_tol=1e-7"]), tmp_path)
    command = ["experiment=the_preset", "trainer.resume=true", "trainer.max_steps=60"]
    cfg, resumed = run_config(make_cfg("train", DBM + ["trainer.max_steps=60", "trainer.resume=true",
                                                       "learner.mean_field_tol=1e-3"]), tmp_path, command)
    assert resumed and cfg.learner.mean_field_tol == 1e-7  # the preset's value is the run's own; no override
    with pytest.raises(ConfigError, match="cannot resume .*learner="):
        run_config(make_cfg("train", DBM + ["trainer.max_steps=60", "trainer.resume=true", "learner.k=3"]), tmp_path,
                   command)
