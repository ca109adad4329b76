"""Training runs under the faults of a shared cluster, with real processes and real signals.

- SIGTERM, SIGUSR1 and SIGINT at a random step: the run finishes the step, writes last.pt, says in one line how to
  continue and exits with 128 + the signal's number; the resumed run ends bit-identical to an uninterrupted one.
- One writer per run directory: a second run into the directory, or a resume while the run lives, is refused with
  the holder's PID; a refused command leaves nothing behind (not even ``.hydra/``).
- A full disk (a small tmpfs), a read-only run directory (a read-only bind mount), both where the machine allows
  mounts, and the same errors injected as ``OSError`` everywhere: one ``error:`` line naming the path, exit 2, the
  last good checkpoint kept.
- Killed writers' temporary files are removed at resume; a checkpoint without its loop or RNG state is one line;
  a non-finite validation score stops the run.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import ROOT, SYNTHETIC, run_script
from nvil.core.checkpoint import load_checkpoint, save_checkpoint
from nvil.core.files import WRITE_FAILURES

run = run_script
SBN = [*SYNTHETIC, "model=sbn", "trainer.ckpt_every=100000", "trainer.val_every=500", "trainer.log_every=50"]
# The signalled run's length: the signal comes after step 1 (the first logged step), so the run is stopped well
# before its end, and the resumed run still passes two validations (val_every=500).
STEPS = 1000


def start(run_dir: Path, *args: str, steps: int = STEPS) -> subprocess.Popen:
    """``python train.py`` in a process of its own (its own session, so a signal reaches it alone)."""
    env = dict(os.environ, HYDRA_FULL_ERROR="0", OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *SBN, f"trainer.max_steps={steps}",
                             f"hydra.run.dir={run_dir}", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for_steps(run_dir: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Until the run has logged a training step (metrics.jsonl has a line)."""
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before the signal: {proc.communicate()[1][-2000:]}")
        if metrics.exists() and metrics.stat().st_size:
            return
        time.sleep(0.02)
    raise AssertionError("the run logged no step")


def one_line(stderr: str, *fragments: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def parameters(path: Path) -> dict[str, torch.Tensor]:
    payload = load_checkpoint(path)
    return {**payload["model"], **{f"q.{k}": v for k, v in (payload["inference"] or {}).items()}}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, torch.Tensor]:
    run_dir = tmp_path_factory.mktemp("whole") / "run"
    proc = run("train.py", *SBN, f"trainer.max_steps={STEPS}", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr
    return parameters(run_dir / "checkpoints" / "last.pt")


@pytest.fixture(scope="module")
def finished_40(tmp_path_factory) -> Path:
    """A run of 40 steps that ended normally; the tests that resume or refuse a finished run take a copy."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    proc = run("train.py", *SBN, "trainer.max_steps=40", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr
    return run_dir


def copy_run(source: Path, run_dir: Path) -> Path:
    shutil.copytree(source, run_dir)
    return run_dir


@pytest.mark.parametrize("signum", [signal.SIGTERM, pytest.param(signal.SIGUSR1, marks=pytest.mark.slow),
                                    pytest.param(signal.SIGINT, marks=pytest.mark.slow)])
def test_a_signal_saves_the_step_and_the_resume_is_bit_identical(tmp_path, signum, uninterrupted):
    run_dir = tmp_path / "run"
    proc = start(run_dir)
    wait_for_steps(run_dir, proc)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, stderr
    line = one_line(stderr, "at step ", "continue with: python train.py", "trainer.resume=true")
    assert "Ctrl-C" in line if signum == signal.SIGINT else signal.Signals(signum).name in line
    step = load_checkpoint(run_dir / "checkpoints" / "last.pt")["step"]
    assert 0 < step < STEPS and f"at step {step};" in line  # ckpt_every=100000: only the signal wrote it
    resumed = run("train.py", *SBN, f"trainer.max_steps={STEPS}", f"hydra.run.dir={run_dir}", "trainer.resume=true")
    assert resumed.returncode == 0, resumed.stderr
    after = parameters(run_dir / "checkpoints" / "last.pt")
    assert all(torch.equal(after[k], uninterrupted[k]) for k in uninterrupted)


@pytest.mark.slow
def test_a_second_writer_and_a_live_resume_are_refused_with_the_holders_pid(tmp_path):
    run_dir = tmp_path / "run"
    first = start(run_dir, "seed=0", steps=100000)
    try:
        wait_for_steps(run_dir, first)
        for extra in (["seed=1"], ["trainer.resume=true"]):
            second = run("train.py", *SBN, "trainer.max_steps=100000", f"hydra.run.dir={run_dir}", *extra)
            assert second.returncode == 2
            one_line(second.stderr, "error:", str(run_dir), "in use by another job", f"PID {first.pid} on ")
        assert "seed: 0" in (run_dir / "config.yaml").read_text()
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert first.returncode == 128 + signal.SIGTERM
    steps = [line.split(",")[0] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == len(set(steps))  # one writer: no step logged twice
    assert not (run_dir / ".nvil.lock").exists()  # released with the run


@pytest.mark.slow
def test_two_runs_started_together_leave_one_consistent_run(tmp_path):
    run_dir = tmp_path / "run"
    procs = [start(run_dir, f"seed={s}", steps=3000) for s in (0, 1)]
    outs = [p.communicate(timeout=180) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], [o[1][-2000:] for o in outs]
    loser = outs[[p.returncode for p in procs].index(2)][1]
    one_line(loser, "error:", str(run_dir))
    payload = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert f"seed: {payload['config']['seed']}" in (run_dir / "config.yaml").read_text()


def test_a_refused_command_writes_nothing(tmp_path, finished_40):
    run_dir = tmp_path / "new"
    proc = run("train.py", *SBN, "trainer.batch_size=0", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2 and not run_dir.exists()
    done = copy_run(finished_40, tmp_path / "done")
    before = sorted(p.relative_to(done) for p in done.rglob("*"))
    refused = run("train.py", *SBN, "trainer.max_steps=40", "model.layers=[5]", f"hydra.run.dir={done}",
                  "trainer.resume=true")
    assert refused.returncode == 2
    assert sorted(p.relative_to(done) for p in done.rglob("*")) == before
    assert not (done / ".hydra" / "resumes.yaml").exists()


def test_a_killed_writers_temporary_files_are_removed_at_resume(tmp_path, finished_40):
    run_dir = copy_run(finished_40, tmp_path / "run")
    orphan = run_dir / "checkpoints" / ".last.pt.99999.tmp"
    orphan.write_bytes(b"half a checkpoint")
    os.utime(orphan, (time.time() - 60, time.time() - 60))
    proc = run("train.py", *SBN, "trainer.max_steps=80", f"hydra.run.dir={run_dir}", "trainer.resume=true")
    assert proc.returncode == 0, proc.stderr
    assert not orphan.exists()


@pytest.mark.parametrize("section", ["loop", "rng", "learner"])
def test_a_checkpoint_without_its_loop_or_rng_is_one_line_at_resume(tmp_path, finished_40, section):
    run_dir = copy_run(finished_40, tmp_path / "run")
    last = run_dir / "checkpoints" / "last.pt"
    payload = load_checkpoint(last)
    del payload[section]
    save_checkpoint(last, payload)
    proc = run("train.py", *SBN, "trainer.max_steps=80", f"hydra.run.dir={run_dir}", "trainer.resume=true")
    assert proc.returncode == 2
    one_line(proc.stderr, "error:", "cannot resume", section)


def test_a_non_finite_validation_score_stops_the_run(tmp_path, monkeypatch):
    import nvil.app.loop as loop

    monkeypatch.setattr(loop, "validate", lambda *a, **k: {"val/elbo": float("nan")})
    run_dir = tmp_path / "run"
    proc = run("train.py", *SBN, "trainer.max_steps=40", "trainer.val_every=20", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2
    one_line(proc.stderr, "error: training diverged", "val/elbo", "nan")
    assert not (run_dir / "checkpoints" / "best.pt").exists()


# ---- write failures ---------------------------------------------------------------------------------------------
def refuse(code: int, when):
    """A stand-in that raises ``OSError(code)`` where ``when(path)`` holds, else calls the original."""

    def wrap(original):
        def fake(path, *args, **kwargs):
            if when(str(path)):
                raise OSError(code, os.strerror(code), str(path))
            return original(path, *args, **kwargs)

        return fake

    return wrap


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_a_refused_checkpoint_write_is_one_line_and_keeps_the_last_good_one(tmp_path, monkeypatch, code):
    import nvil.app.snapshot as snapshot

    calls = []

    def save(path, payload):
        calls.append(path)
        if len(calls) > 2:  # best.pt and last.pt at step 20, then the disk fills
            raise OSError(code, os.strerror(code), str(path) + ".tmp")
        save_checkpoint(path, payload)

    monkeypatch.setattr(snapshot, "save_checkpoint", save)
    run_dir = tmp_path / "run"
    proc = run("train.py", *SBN, "trainer.max_steps=60", "trainer.ckpt_every=20", "trainer.val_every=20",
               f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2
    one_line(proc.stderr, "error: cannot write checkpoint", WRITE_FAILURES[code][0], "last good checkpoint is kept at",
             "trainer.resume=true")
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["step"] == 20


@pytest.mark.parametrize("target", ["metrics.jsonl", "run/config.yaml", ".hydra", "tb"])
def test_any_refused_write_of_the_run_is_one_line(tmp_path, monkeypatch, target):
    import builtins

    import tensorboard.summary.writer.record_writer as record_writer

    run_dir = tmp_path / "run"
    if target == "tb":  # on TensorBoard's writer thread: surfaces at the next call, one line, no thread traceback
        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(record_writer.RecordWriter, "write", write)
    elif target == "metrics.jsonl":
        monkeypatch.setattr(builtins, "open", refuse(errno.ENOSPC, lambda p: target in p)(builtins.open))
    else:  # the run's config.yaml (target "/config.yaml"), .hydra/*.yaml
        original = OmegaConf.save

        def save(config, f, resolve=False):
            if target in str(f):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
            return original(config, f, resolve)

        monkeypatch.setattr(OmegaConf, "save", staticmethod(save))
    proc = run("train.py", *SBN, "trainer.max_steps=200", "trainer.tensorboard=true", "trainer.log_every=10",
               f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2, proc.stderr
    one_line(proc.stderr, "error: cannot write", "the disk is full")


# ---- real file systems: a tmpfs that fills, a read-only bind mount -----------------------------------------------
def mount(*args: str) -> None:
    try:
        subprocess.run(["mount", *args], check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"this machine does not allow mounts here ({type(e).__name__}); the injected-OSError tests "
                    "cover the same paths")


@pytest.fixture
def small_disk(tmp_path):
    where = tmp_path / "disk"
    where.mkdir()
    mount("-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where))
    yield where
    subprocess.run(["umount", str(where)], capture_output=True)


@pytest.fixture
def read_only(tmp_path):
    source, where = tmp_path / "source", tmp_path / "ro"
    source.mkdir()
    where.mkdir()
    yield source, where, lambda: (mount("--bind", str(source), str(where)),
                                  mount("-o", "remount,ro,bind", str(where)))
    subprocess.run(["umount", str(where)], capture_output=True)


def test_a_full_disk_is_one_line_and_keeps_the_last_good_checkpoint(small_disk):
    run_dir = small_disk / "run"
    proc = run("train.py", *SBN, "trainer.max_steps=100000", "trainer.log_every=1", "trainer.ckpt_every=200",
               "trainer.val_every=200", "trainer.tensorboard=true", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2
    one_line(proc.stderr, "error: cannot write", "the disk is full", str(run_dir))
    last = run_dir / "checkpoints" / "last.pt"
    if last.exists():
        assert load_checkpoint(last)["step"] % 200 == 0


def test_a_read_only_run_directory_is_one_line(read_only, tmp_path, finished_40):
    source, where, seal = read_only
    copy_run(finished_40, source / "run")
    seal()
    for args in ([f"hydra.run.dir={where / 'new'}"], [f"hydra.run.dir={where / 'run'}", "trainer.resume=true"]):
        proc = run("train.py", *SBN, "trainer.max_steps=80", *args)
        assert proc.returncode == 2
        one_line(proc.stderr, "error: cannot write the run directory", "read-only", "hydra.run.dir")
    assert load_checkpoint(where / "run" / "checkpoints" / "last.pt")["step"] == 40
