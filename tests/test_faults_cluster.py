"""Preemption under the launchers users run: torchrun with two gloo ranks, and Hydra's submitit launcher
(``hydra/launcher=local``: submitit's local executor, which forwards SIGTERM to the job and sends its preemption
signal, USR2, before the time limit, as SLURM does).

- SIGTERM to torchrun's agent: it passes the signal to both ranks, which agree on one stop step, and rank 0 writes
  last.pt there; the run resumed under torchrun ends bit-identical to an uninterrupted two-rank run.
- A rank that stops answering (SIGSTOP, a hung node) is detected within ``trainer.dist_timeout``: one line, not
  the process group's hour.
- SIGTERM to submitit's controller reaches the job, which saves; USR2 near the time limit saves, submitit
  requeues the job, and the requeued job resumes and finishes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import ROOT, SYNTHETIC
from nvil.app.cli import has_submitit
from nvil.app.interrupt import SYNC_EVERY
from nvil.core.checkpoint import load_checkpoint

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed")
SAP = [*(o for o in SYNTHETIC if not o.startswith("model.layers")), "model=rbm", "model.n_hidden=6", "learner=sap", "learner.num_particles=20",
       "trainer.ckpt_every=100000", "trainer.val_every=1000", "trainer.log_every=50"]
ENV = dict(os.environ, HYDRA_FULL_ERROR="0", OMP_NUM_THREADS="1")


def popen(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def torchrun(*args: str) -> subprocess.Popen:
    return popen("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(ROOT / "train.py"), *args)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def wait_for(path: Path, proc: subprocess.Popen, text: str = "", timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size and text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise AssertionError(f"ended early: {proc.communicate()[1][-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"{path} never showed {text!r}")


def last_params(run_dir: Path) -> dict:
    return load_checkpoint(run_dir / "checkpoints" / "last.pt")["model"]


def sigterm_torchrun(run_dir: Path, steps: int) -> int:
    """A two-rank run stopped by SIGTERM to torchrun's agent; the step its checkpoint holds."""
    proc = torchrun(*SAP, f"trainer.max_steps={steps}", f"hydra.run.dir={run_dir}")
    wait_for(run_dir / "metrics.jsonl", proc)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    log = (run_dir / "train.log").read_text()
    assert "stopped by SIGTERM at step" in log, log[-2000:]
    step = load_checkpoint(run_dir / "checkpoints" / "last.pt")["step"]
    assert 0 < step < steps and step % SYNC_EVERY == 0  # the step both ranks agreed on
    return step


@pytest.mark.slow
def test_sigterm_to_torchrun_saves_the_agreed_step(tmp_path):
    sigterm_torchrun(tmp_path / "run", 200000)


@pytest.mark.slow
def test_sigterm_to_torchrun_then_resume_is_bit_identical(tmp_path):
    steps = 6000
    whole = tmp_path / "whole"
    proc = torchrun(*SAP, f"trainer.max_steps={steps}", f"hydra.run.dir={whole}")
    assert proc.wait(timeout=600) == 0, proc.communicate()[1][-3000:]
    cut = tmp_path / "cut"
    sigterm_torchrun(cut, steps)
    resumed = torchrun(*SAP, f"trainer.max_steps={steps}", f"hydra.run.dir={cut}", "trainer.resume=true")
    assert resumed.wait(timeout=600) == 0, resumed.communicate()[1][-3000:]
    a, b = last_params(whole), last_params(cut)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_a_stopped_rank_is_detected_within_the_timeout(tmp_path):
    run_dir = tmp_path / "run"
    proc = torchrun(*SAP, "trainer.max_steps=1000000", f"hydra.run.dir={run_dir}", "trainer.dist_timeout=5")
    wait_for(run_dir / "metrics.jsonl", proc)
    workers = children(proc.pid)
    assert len(workers) == 2
    os.kill(max(workers), signal.SIGSTOP)  # the later-started worker: rank 1
    started = time.monotonic()
    try:
        _, stderr = proc.communicate(timeout=240)
    finally:
        for pid in workers:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert proc.returncode != 0
    assert time.monotonic() - started < 120
    assert "did not answer within trainer.dist_timeout=5 s" in stderr, stderr[-3000:]


needs_submitit = pytest.mark.skipif(not has_submitit(),
                                    reason="needs Hydra's submitit launcher (pip install -e '.[cluster]')")


def sweep(sweep_dir: Path, *args: str) -> subprocess.Popen:
    return popen(str(ROOT / "train.py"), "-m", "hydra/launcher=local", f"hydra.sweep.dir={sweep_dir}",
                 "trainer.resume=auto", *[a for a in SAP if not a.startswith("trainer.progress")],
                 "trainer.progress=false", *args)


@needs_submitit
@pytest.mark.slow
def test_sigterm_through_submitits_local_executor_saves(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = sweep(sweep_dir, "trainer.max_steps=1000000")
    run_dir = sweep_dir / "0"
    wait_for(run_dir / "metrics.jsonl", proc)
    controller = [pid for pid in children(proc.pid) if b"submitit.local._local" in
                  Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(controller) == 1
    os.kill(controller[0], signal.SIGTERM)  # submitit forwards it to the job
    try:
        wait_for(run_dir / "train.log", proc, "stopped by SIGTERM at step")
    finally:  # the sweep's own process polls for the job's result for a while: not needed here
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["step"] > 0


@needs_submitit
@pytest.mark.slow
def test_submitits_preemption_signal_saves_requeues_and_resumes(tmp_path):
    """timeout_min=1: submitit's local executor sends USR2 30 s before the minute is up."""
    sweep_dir = tmp_path / "sweep"
    proc = sweep(sweep_dir, "hydra.launcher.timeout_min=1", "trainer.max_steps=100000000", "trainer.val_every=10000")
    log_path = sweep_dir / "0" / "train.log"
    try:
        wait_for(log_path, proc, "resumed ", timeout=300)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    log = log_path.read_text()
    assert "stopped by SIGUSR2 at step" in log and "Requeued job" in log, log[-3000:]
    step = int(log.split("stopped by SIGUSR2 at step ")[1].split(";")[0])
    assert f"resumed {sweep_dir / '0'} from step {step}" in log
    assert step > 0
