"""Data-parallel training and sharded evaluation with torchrun: two CPU processes (gloo) against one process.

- learner=exact_ml has no randomness, so 2 ranks with 10 examples each must reproduce one process with the
  minibatch of 20 to float rounding (DDP averages the gradients of the two halves), and the sharded evaluation
  must equal the unsharded one exactly;
- NVIL's running moments, parameters and MCEM's chain table agree on every rank (tests/ddp_worker.py);
- NVIL trained on 2 ranks ends where single-process runs with the same total batch end, within their
  seed-to-seed spread;
- SAP's persistent particles are sharded per rank and travel in rank 0's checkpoint: a run interrupted and
  resumed under torchrun ends exactly where the uninterrupted run ends.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT, SYNTHETIC, make_cfg, run_script

import nvil.app.main as train_module
from nvil.core.checkpoint import load_checkpoint
from nvil.app.evaluation import EvalSpec, evaluate_checkpoint

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed")

QUIET = ["trainer.device=cpu", "trainer.progress=false", "trainer.tensorboard=false", "print_config=false"]
BASE = [o for o in SYNTHETIC if not o.startswith("model.layers")]
RBM = [*BASE, "model=rbm", "model.n_hidden=6", "learner=exact_ml", "learner.lr=0.05", "trainer.batch_size=20",
       "trainer.max_steps=40", "trainer.val_every=20", "trainer.ckpt_every=20"]


def torchrun(script: str, *args: str, nproc: int = 2, cwd=ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, HYDRA_FULL_ERROR="0", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(ROOT / script), *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def single(script: str, *args: str) -> subprocess.CompletedProcess:
    """One process's run of ``SCRIPT *args``, in this process (``conftest.run_script``)."""
    return run_script(script, *args, cwd=ROOT)


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def assert_one_line_error(proc, *fragments):
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr.split(errors[0])[0][-500:]
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


@pytest.mark.slow
def test_ranks_agree_on_statistics_parameters_and_chains(tmp_path):
    ok(torchrun("tests/ddp_worker.py", str(tmp_path / "ok")))
    assert (tmp_path / "ok").read_text() == "ok"


@pytest.mark.parametrize("collect", [True, False], ids=["cleanup", "broken_without_gc"])
def test_cleanup_destroys_the_group_after_its_ddp_wrappers(tmp_path, monkeypatch, collect):
    """A learner's DistributedDataParallel wrapper sits in a reference cycle (learner._ddp.module is the learner),
    so it outlives the learner until the garbage collector runs; a Gloo group it still holds at interpreter
    shutdown aborted finished two-rank runs (SIGABRT) about once in 20. ``cleanup`` must leave no wrapper alive
    when it destroys the group; without its collection (the broken variant) the wrapper is still there."""
    import gc

    import torch.distributed as dist
    from omegaconf import OmegaConf
    from torch.nn.parallel import DistributedDataParallel

    from nvil.models import build_model
    from nvil.core import distributed
    from nvil.learners import build_learner

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    alive_at_destroy = []
    destroy = dist.destroy_process_group

    def recording_destroy(*args, **kwargs):
        alive_at_destroy.append(sum(type(o) is DistributedDataParallel for o in gc.get_objects()))
        destroy(*args, **kwargs)

    monkeypatch.setattr(dist, "destroy_process_group", recording_destroy)
    if not collect:
        monkeypatch.setattr(distributed.gc, "collect", lambda *a: 0)
    gc.disable()  # no automatic collection between dropping the learner and the cleanup
    try:
        model, inference = build_model(OmegaConf.create({"name": "sbn", "layers": [3], "inference": {}}), 4)
        learner = build_learner(OmegaConf.load(ROOT / "configs" / "learner" / "nvil.yaml"), model, inference,
                                torch.device("cpu"), 0)
        learner.distribute(distributed.Dist(), torch.device("cpu"))
        learner.step((torch.rand(6, 4) < 0.5).float())
        del learner, model, inference
        distributed.cleanup()
    finally:
        gc.enable()
        if dist.is_initialized():
            destroy()
    assert alive_at_destroy == ([0] if collect else [1])


@pytest.fixture(scope="module")
def exact_ml_runs(tmp_path_factory):
    """The same exact-gradient RBM run as one process (batch 20) and as 2 ranks (10 each)."""
    root = tmp_path_factory.mktemp("exact_ml")
    ok(single("train.py", *RBM, f"hydra.run.dir={root / 'one'}"))
    two = ok(torchrun("train.py", *RBM, f"hydra.run.dir={root / 'two'}"))
    return root, two


@pytest.mark.slow
def test_two_ranks_reproduce_one_process_with_the_same_total_batch(exact_ml_runs):
    root, two = exact_ml_runs
    one = load_checkpoint(root / "one" / "checkpoints" / "last.pt")
    both = load_checkpoint(root / "two" / "checkpoints" / "last.pt")
    assert one["step"] == both["step"] == 40
    for name, value in one["model"].items():
        assert torch.allclose(value, both["model"][name], atol=1e-5), name
    logged = [json.loads(line) for line in (root / "two" / "metrics.jsonl").read_text().splitlines()]
    log_p = [m["train/log_p_exact_batch"] for m in logged if "train/log_p_exact_batch" in m]
    assert log_p[-1] > log_p[0] + 0.1  # the runs did learn, so equal parameters mean something
    # only rank 0 wrote, and its checkpoint holds both ranks' own state
    assert both["world_size"] == 2 and len(both["ranks"]) == 2 and "world_size" not in one
    assert not torch.equal(both["ranks"][0]["learner"]["generator"], both["ranks"][1]["learner"]["generator"])
    assert len(json_lines(two.stdout)) == 1  # rank 0 alone reports
    assert sorted(p.name for p in (root / "two" / "checkpoints").iterdir()) == ["best.pt", "last.pt"]


@pytest.mark.slow
def test_sharded_evaluation_equals_the_unsharded_one(exact_ml_runs):
    root, _ = exact_ml_runs
    ckpt = root / "one" / "checkpoints" / "last.pt"
    args = [f"checkpoint={ckpt}", "estimator=ais", "estimator.num_chains=50", "estimator.num_betas=200",
            "estimator.batch_size=100", "eval.progress=false", "eval.device=cpu", f"eval.output={root / 'e.jsonl'}"]
    one = json_lines(ok(single("evaluate.py", *args)).stdout)[0]
    two = json_lines(ok(torchrun("evaluate.py", *args)).stdout)
    assert len(two) == 1 and two[0]["num_processes"] == 2
    assert two[0]["num_examples"] == one["num_examples"] == 500
    assert two[0]["mean_log_p"] == one["mean_log_p"] and two[0]["stderr"] == one["stderr"]


def test_sharded_importance_sampled_bound_equals_the_unsharded_one(tmp_path):
    """Each batch of the IWAE bound draws from a generator seeded by its first row, so 2 ranks give the numbers of
    one process example by example (the batch of 64 does not divide the 500 test cases evenly between ranks)."""
    metrics = train_module.train(make_cfg("train", [*SYNTHETIC, *QUIET, "trainer.max_steps=20"]), tmp_path / "run")
    args = [f"checkpoint={metrics['checkpoint']}", "estimator=iwae", "estimator.num_samples=50",
            "estimator.batch_size=64", "eval.progress=false", "eval.device=cpu", f"eval.output={tmp_path / 'e.jsonl'}"]
    one = json_lines(ok(single("evaluate.py", *args)).stdout)[0]
    two = json_lines(ok(torchrun("evaluate.py", *args)).stdout)[0]
    assert two["num_processes"] == 2 and two["num_examples"] == one["num_examples"] == 500
    assert two["mean_log_p"] == one["mean_log_p"] and two["stderr"] == one["stderr"]


@pytest.mark.slow
def test_ranks_share_one_default_run_directory(tmp_path):
    """Without hydra.run.dir each rank would stamp its own time into outputs/<date>/<time>: rank 0's is used."""
    ok(torchrun("train.py", *SYNTHETIC, *QUIET, "trainer.max_steps=10", cwd=tmp_path))
    runs = [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir()]
    assert len(runs) == 1 and (runs[0] / "checkpoints" / "last.pt").exists()
    assert (runs[0] / ".hydra").is_dir()  # written by rank 0 alone


@pytest.mark.slow
def test_manual_shards_under_torchrun_are_refused(exact_ml_runs):
    root, _ = exact_ml_runs
    proc = torchrun("evaluate.py", f"checkpoint={root / 'one' / 'checkpoints' / 'last.pt'}", "estimator=exact",
                    "eval.shard=0", "eval.num_shards=2", "eval.device=cpu")
    assert_one_line_error(proc, "eval.shard / eval.num_shards", "leave them unset")


@pytest.mark.slow
def test_resuming_with_another_number_of_processes_is_refused(exact_ml_runs):
    root, _ = exact_ml_runs
    proc = single("train.py", *RBM, f"hydra.run.dir={root / 'two'}", "trainer.resume=true", "trainer.max_steps=60")
    assert_one_line_error(proc, "written by 2 process(es)", "--nproc_per_node=2")


@pytest.mark.slow
def test_learner_without_data_parallelism_is_refused(tmp_path):
    proc = torchrun("train.py", *BASE, "model=dbn", "model.layers=[6,4]", "learner=greedy",
                    f"hydra.run.dir={tmp_path}")
    assert_one_line_error(proc, "learner=greedy does not run data-parallel")


@pytest.mark.slow
def test_sap_particles_are_sharded_and_resume_exactly(tmp_path):
    sap = [*BASE, "model=rbm", "model.n_hidden=30", "learner=sap", "learner.num_particles=40",
           "trainer.batch_size=20", "trainer.val_every=20", "trainer.ckpt_every=20"]
    ok(torchrun("train.py", *sap, "trainer.max_steps=40", f"hydra.run.dir={tmp_path / 'straight'}"))
    ok(torchrun("train.py", *sap, "trainer.max_steps=20", f"hydra.run.dir={tmp_path / 'resumed'}"))
    ok(torchrun("train.py", *sap, "trainer.max_steps=40", "trainer.resume=true", f"hydra.run.dir={tmp_path / 'resumed'}"))
    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")
    shards = [r["learner"]["particles_x"] for r in a["ranks"]]
    assert [s.shape[0] for s in shards] == [20, 20] and not torch.equal(shards[0], shards[1])
    for name, value in a["model"].items():
        assert torch.equal(value, b["model"][name]), name
    for ra, rb in zip(a["ranks"], b["ranks"]):
        assert torch.equal(ra["learner"]["particles_x"], rb["learner"]["particles_x"])


@pytest.mark.slow
def test_nvil_on_two_ranks_ends_where_one_process_ends(tmp_path):
    """Test-set IWAE bound (K = 100, fixed seed) after 600 updates with a total batch of 20: 2 ranks x 10 against
    single processes with batch 20 and different seeds; the difference must lie within 4 standard deviations of
    the single-process spread."""
    nvil = [*SYNTHETIC, "trainer.batch_size=20", "trainer.max_steps=600", "trainer.val_every=200",
            "trainer.ckpt_every=200", "learner.lr=0.003"]
    iwae = make_cfg("train", ["final_eval.estimator.num_samples=100"]).final_eval.estimator

    def score(ckpt) -> float:
        return evaluate_checkpoint(ckpt, iwae, EvalSpec(
            split="test", seed=0, device="cpu", progress=False, output=str(tmp_path / "e.jsonl"))).mean

    singles = []
    for seed in range(4):
        cfg = make_cfg("train", [*nvil, f"seed={seed}"])
        metrics = train_module.train(cfg, tmp_path / f"one{seed}")
        singles.append(score(metrics["checkpoint"]))
    ok(torchrun("train.py", *nvil, "seed=0", f"hydra.run.dir={tmp_path / 'two'}"))
    both = score(tmp_path / "two" / "checkpoints" / "last.pt")
    mean = sum(singles) / len(singles)
    sd = math.sqrt(sum((s - mean) ** 2 for s in singles) / (len(singles) - 1))
    assert abs(both - mean) <= 4 * sd * math.sqrt(1 + 1 / len(singles)), (both, singles)
