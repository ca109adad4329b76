"""Denormals flushed to zero while training and evaluating (nvil/backend/denormals.py): on inside, restored outside,
checked config, every worker thread of a fresh process, and the training loop and evaluator wrapped in it."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import ROOT, SYNTHETIC, make_cfg
from nvil.backend.denormals import flushed_denormals, flushing
from nvil.core.errors import ConfigError

def product() -> float:
    """A denormal (1.47e-39, below float32's smallest normal 1.18e-38, made from its bits) times one: 0 when
    denormals are flushed."""
    return (torch.tensor([1 << 20], dtype=torch.int32).view(torch.float32) * 1.0).item()


def test_flushed_inside_and_restored_after():
    assert product() != 0 and not flushing()  # the process default: IEEE gradual underflow
    with flushed_denormals(True) as supported:
        if not supported:
            pytest.skip("this CPU has no flush-to-zero mode")
        assert product() == 0 and flushing()
    assert product() != 0 and not flushing()


def test_disabled_leaves_denormals_alone():
    """The broken variant of the test above: with the flag off the same product stays denormal."""
    with flushed_denormals(False):
        assert product() != 0 and not flushing()


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_non_boolean_is_a_config_error(value):
    with pytest.raises(ConfigError, match="eval.flush_denormal must be true or false"):
        with flushed_denormals(value, "eval.flush_denormal"):
            pass


PROBE = """
import sys, torch
sys.path.insert(0, {root!r})
from nvil.backend.denormals import flushed_denormals, flushing
torch.set_num_threads(2)
if {pool_first}:
    torch.ones(1 << 20).mul_(2.0)  # a parallel op: torch's worker threads start before the mode is set
with flushed_denormals(True):
    print(flushing(all_threads=True))
"""


@pytest.fixture(scope="module")
def probes() -> dict[bool, subprocess.CompletedProcess]:
    """The probe in a fresh process of its own for each order (the mode set before or after the pool starts), the
    two processes started together."""
    procs = {first: subprocess.Popen([sys.executable, "-c", PROBE.format(root=str(ROOT), pool_first=first)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for first in (False, True)}
    done = {}
    for first, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        done[first] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


@pytest.mark.parametrize("pool_first, expected", [(False, "True"), (True, "False")])
def test_worker_threads_inherit_the_mode_when_set_first(probes, pool_first, expected):
    """Set before any parallel op (as train.py and evaluate.py do), every worker thread flushes; set after the
    pool has started, only the calling thread does, and the all-threads probe says so."""
    out = probes[pool_first]
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected


def test_training_loop_and_evaluator_run_flushed(tmp_path, monkeypatch):
    """The loop's model check and the estimator run inside the flushed block (and ``false`` turns it off); the
    caller's mode is back afterwards."""
    from nvil.estimators import bounds
    from nvil.app.evaluation import EvalSpec, evaluate_checkpoint
    from nvil.app.loop import fit

    modes = []
    cfg = make_cfg("train", [*SYNTHETIC, "trainer.max_steps=2"])
    fit(cfg, tmp_path / "hook", check=lambda model, inference, data: modes.append(flushing()))
    cfg = make_cfg("train", [*SYNTHETIC, "trainer.max_steps=2", "trainer.flush_denormal=false"])
    fit(cfg, tmp_path / "hook_off", check=lambda model, inference, data: modes.append(flushing()))
    assert modes == [True, False]
    assert not flushing()

    original = bounds.log_weights
    during = []

    def recording(*args, **kwargs):
        during.append(flushing())
        return original(*args, **kwargs)

    monkeypatch.setattr(bounds, "log_weights", recording)
    est = make_cfg("evaluate", ["estimator=elbo", "estimator.num_samples=2"]).estimator
    ckpt = tmp_path / "hook" / "checkpoints" / "last.pt"
    for flag in (True, False):
        evaluate_checkpoint(ckpt, est, EvalSpec(num_examples=10, device="cpu", progress=False,
                                                output=str(tmp_path / "scores.jsonl"), flush_denormal=flag))
    assert during and during[0] is True and during[-1] is False
    assert not flushing()


@pytest.mark.slow
def test_bench_times_both_modes_and_rejects_bad_options(capsys):
    """``bench/denormals.py`` continues a committed checkpoint in both modes and prints their ratio (3 updates
    here: a smoke run of the README's command); unknown cases are a usage error."""
    bench = str(ROOT / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import denormals as bench_denormals

    with pytest.raises(SystemExit):
        bench_denormals.parse_args(["--cases", "nvil_sbn999"])
    bench_denormals.main(["--cases", "rebar", "--rounds", "1", "--scale", "0.001"])
    out = capsys.readouterr().out
    assert "rebar round 0 flush_denormal=True" in out and "rebar round 0 flush_denormal=False" in out
    row = next(line for line in out.splitlines() if line.startswith("| rebar |"))
    assert row.split("|")[3].strip() == "3" and row.split("|")[6].strip().endswith("x")
