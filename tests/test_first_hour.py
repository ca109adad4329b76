"""A new user's first hour: the family's final evaluation, resume with the run's own config, nothing of a run
rewritten before a refusal, divergence and Ctrl-C caught, Hydra's errors as one line, stdout only JSON."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT, SYNTHETIC, make_cfg
from nvil.core.checkpoint import load_checkpoint
from nvil.app.cli import check_launcher
from nvil.app.divergence import DivergenceMonitor
from nvil.core.errors import ConfigError, TrainingDiverged
from nvil.learners.nvil import NVIL
from test_cli import assert_one_line_error, json_lines, run
from nvil.app.main import final_plan, train

FAST = [a for a in SYNTHETIC if not a.startswith("final_eval")]
RBM = [a for a in FAST if not a.startswith("model.layers")] + ["model=rbm", "model.n_hidden=6", "learner=sap"]


# ---- the family's final evaluation ------------------------------------------------------------------------

@pytest.mark.parametrize("model, estimators", [
    ("sbn", ["iwae"]), ("fdarn", ["iwae"]), ("rbm", ["ais"]), ("srbm", ["ais"]), ("dbn", ["dbn_bound", "chib"]),
    ("gbn", ["ais_hmc"]), ("dbn_dynamic", ["ais_hmc"])])
def test_each_family_has_its_own_final_evaluation(model, estimators):
    plan = final_plan(make_cfg("train", [f"model={model}"]))
    assert [est.name for est, _ in plan] == estimators


def test_final_evaluation_can_be_chosen_and_tuned():
    cfg = make_cfg("train", ["model=rbm", "final_eval=directed", "final_eval.estimator.num_samples=7"])
    (est, n), = final_plan(cfg)
    assert est.name == "iwae" and est.num_samples == 7 and n is None
    assert final_plan(make_cfg("train", ["model=dbn", "~final_eval.then"]))[0][0].name == "dbn_bound"
    assert len(final_plan(make_cfg("train", ["model=dbn", "~final_eval.then"]))) == 1
    assert final_plan(make_cfg("train", ["final_eval.enabled=false"])) == []
    # experiments that pick their own estimator still do
    assert final_plan(make_cfg("train", ["experiment=sap_rbm10_toy"]))[0][0].name == "exact"


def test_a_final_evaluation_that_does_not_fit_the_model_is_refused_before_training(tmp_path):
    cfg = make_cfg("train", RBM + ["final_eval=directed", "trainer.max_steps=20"])
    with pytest.raises(ConfigError, match="inference network"):
        train(cfg, tmp_path)
    assert not (tmp_path / "checkpoints").exists()


def test_an_rbm_run_ends_with_its_certified_ais_line(tmp_path):
    proc = run("train.py", *RBM, "trainer.max_steps=40",
               f"hydra.run.dir={tmp_path / 'run'}", "final_eval.estimator.num_betas=300",
               "final_eval.estimator.num_chains=50", "final_eval.num_examples=50", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = json_lines(proc.stdout)
    assert len(lines) == 2 and proc.stdout.count("\n") == 2  # stdout: only the JSON lines
    assert lines[0]["train"]["step"] == 40 and "train/free_energy_gap" in lines[0]["train"]
    final = lines[1]
    assert final["estimator"] == "ais" and final["certified"] is not None and "log_z_lower_bound" in final
    log = (tmp_path / "run" / "train.log").read_text()
    assert "new run" in log and "final evaluation" in log


# ---- resume restores the run ------------------------------------------------------------------------------

def test_resume_restores_the_runs_own_config_and_refuses_changes(tmp_path):
    run_dir = tmp_path / "run"
    first = run("train.py", *FAST, "model.layers=[5,3]", "seed=3", "trainer.max_steps=20",
                f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    record = {p.name: p.read_bytes() for p in (run_dir / ".hydra").iterdir()}
    assert set(record) == {"config.yaml", "hydra.yaml", "overrides.yaml"}

    # conflicting config, an occupied directory, a smaller budget, a finished run: refused, nothing rewritten
    assert_one_line_error(run("train.py", f"hydra.run.dir={run_dir}", "trainer.resume=true", "model.layers=[7]",
                              "trainer.max_steps=40", cwd=tmp_path), "model.layers=[5, 3]", "cannot resume")
    assert_one_line_error(run("train.py", *FAST, f"hydra.run.dir={run_dir}", cwd=tmp_path), "already holds a run")
    assert_one_line_error(run("train.py", f"hydra.run.dir={run_dir}", "trainer.resume=true", "trainer.max_steps=10",
                              cwd=tmp_path), "already at step 20", "trainer.max_steps=10")
    assert_one_line_error(run("train.py", f"hydra.run.dir={run_dir}", "trainer.resume=true", cwd=tmp_path),
                          "already finished")
    assert {p.name: p.read_bytes() for p in (run_dir / ".hydra").iterdir()} == record

    # no overrides but the budget: the run's own model, data and seed come back
    again = run("train.py", f"hydra.run.dir={run_dir}", "trainer.resume=true", "trainer.max_steps=40", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    payload = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert payload["step"] == 40 and payload["config"]["model"]["layers"] == [5, 3]
    assert payload["config"]["seed"] == 3 and payload["config"]["data"]["name"] == "synthetic"
    assert (run_dir / ".hydra" / "config.yaml").read_bytes() == record["config.yaml"]
    assert "trainer.max_steps=40" in (run_dir / ".hydra" / "resumes.yaml").read_text()


def test_resumed_run_matches_an_uninterrupted_one(tmp_path):
    base = FAST + ["model.layers=[5,3]", "seed=2"]
    whole = train(make_cfg("train", base + ["trainer.max_steps=40"]), tmp_path / "whole")
    train(make_cfg("train", base + ["trainer.max_steps=20"]), tmp_path / "part")
    from nvil.app.resume import run_config
    cfg, resumed = run_config(make_cfg("train", ["trainer.resume=true", "trainer.max_steps=40"]), tmp_path / "part",
                              ["trainer.resume=true", "trainer.max_steps=40"])
    assert resumed and cfg.model.layers == [5, 3]
    train(cfg, tmp_path / "part")
    a = load_checkpoint(tmp_path / "whole/checkpoints/last.pt")["model"]
    b = load_checkpoint(tmp_path / "part/checkpoints/last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a) and whole["step"] == 40


# ---- divergence and Ctrl-C --------------------------------------------------------------------------------

def test_divergence_monitor_flags_a_collapse_and_not_noise():
    noisy = [-550.0, -300.0, -200.0, -180.0, -190.0, -175.0, -185.0, -170.0, -240.0, -168.0]
    m = DivergenceMonitor(20.0)
    assert all(m.check({"train/elbo": v}) is None for v in noisy)
    assert "train/elbo fell to" in m.check({"train/elbo": -2e9})
    # the broken variant (no check) lets the collapse through: the test above has power
    off = DivergenceMonitor(None)
    assert all(off.check({"train/elbo": v}) is None for v in noisy + [-2e9])


def test_a_huge_learning_rate_is_stopped_with_one_line(tmp_path):
    proc = run("train.py", *FAST, "learner.lr=1e6", "trainer.max_steps=200", f"hydra.run.dir={tmp_path / 'run'}",
               cwd=tmp_path)
    assert_one_line_error(proc, "diverged", "no checkpoint was written")
    assert proc.returncode == 2 and not (tmp_path / "run" / "checkpoints" / "best.pt").exists()


def test_nan_before_the_first_checkpoint_says_none_is_kept(tmp_path, monkeypatch):
    original = NVIL.step

    def poisoned(self, x, diagnostics=False):
        metrics = original(self, x, diagnostics)
        with torch.no_grad():
            self.model.decoders[0].weight.fill_(float("nan"))
        return metrics

    monkeypatch.setattr(NVIL, "step", poisoned)
    with pytest.raises(TrainingDiverged, match="no checkpoint was written before that"):
        train(make_cfg("train", FAST + ["trainer.max_steps=100"]), tmp_path)


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_exits_with_one_line(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *FAST, "trainer.max_steps=1000000",
                             f"hydra.run.dir={run_dir}"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (run_dir / "metrics.jsonl").exists() and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().startswith("error: stopped by Ctrl-C at step") and "\n" not in err.strip() and "Traceback" not in err
    step = load_checkpoint(run_dir / "checkpoints" / "last.pt")["step"]
    assert 0 < step < 1000000 and f"step {step}" in err


# ---- one-line errors from Hydra and the launcher ------------------------------------------------------------

@pytest.mark.parametrize("args, fragments", [
    (["trainer.max_step=5"], ["unknown config key trainer.max_step", "did you mean trainer.max_steps"]),
    (["model.layers=[200"], ["cannot parse the command line"]),
    (["final_eval=nope"], ["unknown final_eval 'nope'"]),
])
def test_hydra_errors_are_one_line(tmp_path, args, fragments):
    proc = run("train.py", *args, cwd=tmp_path)
    assert proc.returncode == 2
    assert_one_line_error(proc, *fragments)


def test_a_launcher_without_its_plugin_names_the_extra(monkeypatch):
    import importlib.util
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[cluster\]'"):
        check_launcher(["-m", "hydra/launcher=local", "seed=0,1"])
    check_launcher(["seed=0"])  # no launcher asked for: nothing to check


def test_print_config_goes_to_stderr(tmp_path):
    proc = run("train.py", *FAST, "trainer.max_steps=10", "print_config=true", f"hydra.run.dir={tmp_path / 'r'}",
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "learner:" in proc.stderr and all(line.startswith("{") for line in proc.stdout.splitlines())
    assert json.loads(proc.stdout.splitlines()[0])["train"]["step"] == 10


def test_every_run_ends_with_an_image_grid(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    cfg = make_cfg("train", [a for a in FAST if not a.startswith(("data=", "trainer.tensorboard"))] +
                   ["data=mnist", "data.num_train=200", "trainer.max_steps=15", "model.layers=[5]",
                    "trainer.val_num_examples=20", "final_eval.enabled=false"])
    train(cfg, tmp_path)
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    events.Reload()
    assert "samples/model" in events.Tags()["images"]
    assert [e.step for e in events.Images("samples/model")] == [15]


# ---- the bad-input table, through the command line ------------------------------------------------

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("table")
    train(make_cfg("train", FAST + ["trainer.max_steps=20"]), root / "run")
    return root / "run" / "checkpoints" / "last.pt"


def _files(root, checkpoint):
    rng = torch.Generator().manual_seed(0)
    made = {"text.pt": b"hello, this is not a checkpoint\n", "config.yaml": b"model:\n  name: sbn\n",
            "best.pt.eval.jsonl": b'{"estimator": "iwae", "mean_log_p": -100.0}\n',
            "random.pt": bytes(torch.randint(0, 256, (4096,), generator=rng, dtype=torch.uint8).tolist()),
            "truncated.pt": checkpoint.read_bytes()[:1500]}
    for name, data in made.items():
        (root / name).write_bytes(data)
    return root


BAD_INPUT = [  # (script, arguments, fragments of the one-line error); CKPT and DIR are filled in
    ("train.py", ["model.layers=200"], ["model.layers must be a list"]),
    ("train.py", ["model=dbn", "model.layers=200", "learner=greedy"], ["model.layers must be a list"]),
    ("train.py", ["model=gbn", "model.layers=200", "learner=mcem_hmc"], ["model.layers must be a list"]),
    ("train.py", ["data.num_train=-1"], ["data.num_train"]),
    ("train.py", ["trainer.max_step=5"], ["unknown config key trainer.max_step"]),
    ("train.py", ["trainer.resume=sometimes"], ["trainer.resume must be true, false or auto"]),
    ("evaluate.py", ["checkpoint=DIR/text.pt"], ["text"]),
    ("evaluate.py", ["checkpoint=DIR/config.yaml"], ["config"]),
    ("evaluate.py", ["checkpoint=DIR/best.pt.eval.jsonl"], ["eval"]),
    ("evaluate.py", ["checkpoint=DIR/random.pt"], ["checkpoint"]),
    ("evaluate.py", ["checkpoint=DIR/truncated.pt"], ["truncated or corrupt"]),
    ("evaluate.py", ["checkpoint=DIR/missing.pt"], ["not found"]),
    ("evaluate.py", ["checkpoint=CKPT", "eval.num_examples=501"], ["eval.num_examples=501", "500 examples"]),
    ("evaluate.py", ["checkpoint=CKPT", "estimator.num_sample=5"], ["did you mean estimator.num_samples"]),
    ("evaluate.py", ["checkpoint=CKPT", "estimator=ais"], ["ais"]),
]


@pytest.mark.parametrize("script, args, fragments", BAD_INPUT, ids=[" ".join(a) for _, a, _ in BAD_INPUT])
def test_bad_input_table(tmp_path, checkpoint, script, args, fragments):
    root = _files(tmp_path, checkpoint)
    args = [a.replace("CKPT", str(checkpoint)).replace("DIR", str(root)) for a in args]
    extra = ["data=synthetic", "trainer.progress=false"] if script == "train.py" and not any(
        a.startswith("data.") for a in args) else []
    proc = run(script, *extra, *args, *(["eval.progress=false"] if script == "evaluate.py" else []), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc, *fragments)
