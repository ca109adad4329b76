"""train.py and evaluate.py as a user runs them, and the one-line errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction

import pytest
import torch

from conftest import ROOT, SYNTHETIC, run_script
from nvil.data import MNIST_PACKAGE


run = run_script  # ``python SCRIPT *args``, in this process


def run_process(script: str, *args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    """``python SCRIPT *args`` as a process of its own: for what only a process shows (its start, its exit code)."""
    env = dict(os.environ, HYDRA_FULL_ERROR="0")
    return subprocess.run([sys.executable, str(ROOT / script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, f"not a one-line error:\n{err}"
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in err, err


@pytest.mark.slow
def test_train_then_evaluate_on_synthetic(tmp_path):
    run_dir = tmp_path / "run"
    train = run_process("train.py", *SYNTHETIC, "trainer.max_steps=60", f"hydra.run.dir={run_dir}",
                "final_eval.enabled=true", "final_eval.estimator.num_samples=50")
    assert train.returncode == 0, train.stderr
    final = json_lines(train.stdout)[-1]
    assert final["estimator"] == "iwae" and final["num_examples"] == 500 and final["stderr"] > 0
    ckpt = run_dir / "checkpoints/best.pt"
    results = {}
    for est, extra in (("iwae", ["estimator.num_samples=2000"]), ("elbo", ["estimator.num_samples=10"]),
                       ("exact", [])):
        proc = run_process("evaluate.py", f"checkpoint={ckpt}", f"estimator={est}", *extra, "data.split=test",
                   "eval.num_examples=200", "eval.progress=false", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        (line,) = json_lines(proc.stdout)
        assert set(line) >= {"estimator", "mean_log_p", "stderr", "num_examples", "seconds", "seed"}
        assert line["num_examples"] == 200
        results[est] = line
    # The bounds sit below the exact value; the K = 2000 IS bound is close to it on 7 latent units.
    assert results["elbo"]["mean_log_p"] < results["iwae"]["mean_log_p"] <= results["exact"]["mean_log_p"] + 0.01
    assert results["exact"]["mean_log_p"] - results["iwae"]["mean_log_p"] < 0.05
    written = json_lines((ckpt.parent / "best.pt.eval.jsonl").read_text())
    assert [r["estimator"] for r in written] == ["iwae", "iwae", "elbo", "exact"]
    assert not (tmp_path / "outputs").exists()  # evaluate.py leaves no Hydra clutter behind


def test_final_evaluation_scores_the_checkpoint_asked_for(tmp_path):
    """final_eval.checkpoint: best (default) scores the validation's choice, last the final model."""
    from conftest import make_cfg
    from nvil.app.main import train

    scored = {}
    for which in ("best", "last"):
        cfg = make_cfg("train", [*SYNTHETIC, "trainer.max_steps=40", "final_eval.enabled=true",
                                 f"final_eval.checkpoint={which}", "final_eval.estimator.num_samples=5",
                                 "final_eval.num_examples=50"])
        metrics = train(cfg, tmp_path / which)
        scored[which] = (metrics["final_eval"]["checkpoint"], metrics["final_eval"]["step"], metrics["best_step"])
    assert scored["best"][0].endswith("best.pt") and scored["best"][1] == scored["best"][2]
    assert scored["last"][0].endswith("last.pt") and scored["last"][1] == 40


@pytest.mark.skipif(not __import__("importlib.util").util.find_spec("mnist"), reason=f"{MNIST_PACKAGE} not installed")
def test_train_then_evaluate_on_mnist(tmp_path):
    run_dir = tmp_path / "run"
    train = run("train.py", "model.layers=[20,10]", "trainer.max_steps=50", "trainer.val_every=25",
                "trainer.ckpt_every=25", "trainer.sample_every=25", "trainer.log_every=25", "trainer.device=cpu",
                "final_eval.num_examples=100", "final_eval.estimator.num_samples=10", "print_config=false",
                f"hydra.run.dir={run_dir}")
    assert train.returncode == 0, train.stderr
    assert json_lines(train.stdout)[-1]["num_examples"] == 100
    proc = run("evaluate.py", f"checkpoint={run_dir}/checkpoints/last.pt", "estimator=elbo",
               "eval.num_examples=50", "eval.progress=false", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (line,) = json_lines(proc.stdout)
    assert -400 < line["mean_log_p"] < -50


@pytest.mark.parametrize("args, fragments", [
    (["model=nosuchmodel"], ["unknown model 'nosuchmodel'", "sbn"]),
    (["learner=nosuchlearner"], ["unknown learner 'nosuchlearner'", "nvil"]),
    (["trainer.max_steps=-5"], ["trainer.max_steps must be a positive integer, got -5"]),
    (["model.layers=[]"], ["model.layers must be a non-empty list"]),
    (["learner.lr=-1"], ["learner.lr must be a positive number"]),
    (["data.binarize=sometimes"], ["data.binarize must be one of"]),
    (["final_eval.enabled=true", "final_eval.checkpoint=newest"], ["final_eval.checkpoint must be best or last"]),
], ids=["model", "learner", "steps", "layers", "lr", "binarize", "final_checkpoint"])
def test_bad_train_config_is_one_line(tmp_path, args, fragments):
    proc = run("train.py", *SYNTHETIC, "trainer.max_steps=5", f"hydra.run.dir={tmp_path}", *args)
    assert_one_line_error(proc, *fragments)


def test_bad_checkpoints_are_one_line_errors(tmp_path):
    run_dir = tmp_path / "run"
    assert run("train.py", *SYNTHETIC, "trainer.max_steps=20", f"hydra.run.dir={run_dir}").returncode == 0
    good = run_dir / "checkpoints/last.pt"
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:1000])
    payload = torch.load(good, weights_only=True)
    payload["model_name"] = payload["config"]["model"]["name"] = "darn"
    torch.save(payload, tmp_path / "other.pt")
    payload = torch.load(good, weights_only=True)
    payload["sneaky"] = Fraction(1, 3)  # an arbitrary class: only a full unpickler rebuilds it
    torch.save(payload, tmp_path / "pickle.pt")
    cases = [
        (tmp_path / "missing.pt", "checkpoint not found"),
        (truncated, "truncated or corrupt"),
        (tmp_path / "other.pt", "holds a model 'darn'"),
        (tmp_path / "pickle.pt", "refusing to load"),
    ]
    for path, fragment in cases:
        proc = run("evaluate.py", f"checkpoint={path}", "eval.progress=false", cwd=tmp_path)
        assert_one_line_error(proc, fragment)
    assert_one_line_error(run("evaluate.py", "eval.progress=false", cwd=tmp_path), "checkpoint=PATH")
    assert_one_line_error(run("evaluate.py", f"checkpoint={good}", "estimator=nosuch", cwd=tmp_path),
                          "unknown estimator 'nosuch'")
    assert_one_line_error(run("evaluate.py", f"checkpoint={good}", "estimator=iwae", "estimator.num_samples=0",
                              cwd=tmp_path), "num_samples must be a positive integer")


def test_exact_on_a_large_model_says_so(tmp_path):
    run_dir = tmp_path / "run"
    assert run("train.py", *SYNTHETIC, "model.layers=[21]", "trainer.max_steps=20",
               f"hydra.run.dir={run_dir}").returncode == 0
    proc = run("evaluate.py", f"checkpoint={run_dir}/checkpoints/last.pt", "estimator=exact", cwd=tmp_path)
    assert_one_line_error(proc, "D <= 20", "D = 21")


@pytest.mark.slow
def test_resume_refusal_from_the_command_line(tmp_path):
    """The refusal of a second run into a run's directory and the resume that continues it, from the command line
    (in the default run: tests/test_first_hour.py's resume test through ``train.py`` and
    tests/test_resume_and_checkpoints.py's refusal message)."""
    args = [*SYNTHETIC, "trainer.max_steps=20", f"hydra.run.dir={tmp_path}"]
    assert run("train.py", *args).returncode == 0
    assert_one_line_error(run("train.py", *args), "already holds a run", "trainer.resume=true")
    proc = run("train.py", *SYNTHETIC, "trainer.max_steps=40", "trainer.resume=true", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert torch.load(tmp_path / "checkpoints/last.pt", weights_only=True)["step"] == 40
