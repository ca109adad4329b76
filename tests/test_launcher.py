"""Sweeps through Hydra's submitit launcher (the `cluster` extra): hydra/launcher=local runs the same jobs that
hydra/launcher=slurm sends to SLURM, as local processes; and trainer.resume=auto, which lets a requeued job
continue from its last checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, SYNTHETIC, make_cfg

import nvil.app.main as train_module
from nvil.core.checkpoint import load_checkpoint
from nvil.core.errors import ConfigError

TINY = [*SYNTHETIC, "trainer.max_steps=20", "trainer.val_every=10", "trainer.ckpt_every=10"]


def sweep(*args: str) -> subprocess.CompletedProcess:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs the cluster extra")
    env = dict(os.environ, HYDRA_FULL_ERROR="0", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "-m", "hydra/launcher=local", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_submitit_sweep_runs_one_job_per_seed(tmp_path):
    sweep("seed=0,1", *TINY, f"hydra.sweep.dir={tmp_path}")
    runs = [load_checkpoint(tmp_path / str(i) / "checkpoints" / "last.pt") for i in (0, 1)]
    assert [r["config"]["seed"] for r in runs] == [0, 1]
    assert all(r["step"] == 20 for r in runs)
    assert not torch.equal(runs[0]["model"]["decoders.0.weight"], runs[1]["model"]["decoders.0.weight"])
    assert list((tmp_path / ".submitit").iterdir())  # the jobs went through submitit


@pytest.mark.slow
def test_submitit_tasks_train_data_parallel(tmp_path):
    """tasks_per_node=2: submitit starts two tasks, which join one process group (nvil.core.distributed)."""
    sweep("hydra.launcher.tasks_per_node=2", *TINY, f"hydra.sweep.dir={tmp_path}")
    ckpt = load_checkpoint(tmp_path / "0" / "checkpoints" / "last.pt")
    assert ckpt["world_size"] == 2 and ckpt["step"] == 20


def test_resume_auto_continues_a_requeued_run(tmp_path):
    cfg = make_cfg("train", [*TINY, "trainer.resume=auto"])
    train_module.train(cfg, tmp_path)  # nothing there yet: a fresh start
    cfg = make_cfg("train", [*TINY, "trainer.resume=auto", "trainer.max_steps=30"])
    metrics = train_module.train(cfg, tmp_path)
    assert metrics["step"] == 30 and load_checkpoint(tmp_path / "checkpoints" / "last.pt")["step"] == 30
    with pytest.raises(ConfigError, match="trainer.resume must be true, false or auto"):
        train_module.train(make_cfg("train", [*TINY, "trainer.resume=sometimes"]), tmp_path / "other")
