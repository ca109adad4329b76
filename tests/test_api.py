"""``nvil.train`` and ``nvil.evaluate`` from Python (nvil/app/api.py): the same run as ``train.py`` with the same
overrides, the same files in the run directory, the estimator's ``Result`` back; a bad override is the scripts'
one-line message as a ``ConfigError``; a Hydra context the caller holds is left as it was."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import nvil
from conftest import CONFIG_DIR, SYNTHETIC, make_cfg
from nvil.app.main import train as train_job
from nvil.core.errors import ConfigError, UserError

TINY = [*SYNTHETIC, "trainer.max_steps=40"]


def test_train_then_evaluate_from_python(tmp_path, capsys):
    run = nvil.train(*TINY, run_dir=tmp_path / "run")
    assert run.metrics["step"] == 40 and run.checkpoint.exists() and run.last_checkpoint.exists()
    assert {"config.yaml", "metrics.jsonl", "train.log"} <= {p.name for p in run.run_dir.iterdir()}
    assert "new run in" in (run.run_dir / "train.log").read_text()
    result = nvil.evaluate(run.checkpoint, "estimator=exact", "eval.progress=false")
    assert result.estimator == "exact" and result.log_p.shape == (500,)    # the synthetic test split
    assert result.mean_log_p == pytest.approx(result.log_p.double().mean().item())
    printed = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert printed[-1]["mean_log_p"] == round(result.mean_log_p, 4)         # what evaluate.py prints


def test_the_api_run_is_the_scripts_run(tmp_path):
    """The same overrides and seed give the same parameters as ``train.py``'s job function."""
    api = nvil.train(*TINY, f"hydra.run.dir={tmp_path / 'api'}")
    script = train_job(make_cfg("train", TINY), tmp_path / "script")
    a = torch.load(api.last_checkpoint, weights_only=True)["model"]
    b = torch.load(tmp_path / "script" / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert script["step"] == api.metrics["step"] and a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_bad_override_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown config key trainer\.max_step \(did you mean trainer\.max_steps"):
        nvil.train(*SYNTHETIC, "trainer.max_step=5", run_dir=tmp_path)
    with pytest.raises(UserError) as e:
        nvil.evaluate(tmp_path / "missing.pt")
    assert "\n" not in str(e.value) and "missing.pt" in str(e.value)


def test_a_callers_hydra_context_is_kept(tmp_path):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        nvil.train(*TINY, run_dir=tmp_path)
        assert GlobalHydra.instance().is_initialized()
        assert compose("train", overrides=["model=rbm"]).model.name == "rbm"
