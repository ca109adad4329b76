"""The built wheel is the whole library: installed into a fresh virtual environment and run from a directory
outside the checkout, ``import nvil`` finds its models, estimators, loop and configs, ``nvil.train`` /
``nvil.evaluate`` work from Python, and the console scripts ``nvil-train`` / ``nvil-evaluate`` take the scripts'
arguments. torch and the other dependencies come from this interpreter's site-packages (``--system-site-packages``);
nvil itself only from the wheel, which the test checks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "nvil", "models", "estimators", "configs")
TINY = ["data=synthetic", "model.layers=[4,3]", "trainer.max_steps=40", "trainer.val_every=20",
        "trainer.ckpt_every=20", "trainer.log_every=10", "trainer.progress=false", "trainer.tensorboard=false",
        "trainer.device=cpu", "trainer.val_num_examples=100", "final_eval.enabled=false"]


def run(cmd: list, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd}:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A virtual environment holding the wheel built from this checkout (and nothing of the checkout itself)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a copy of what the wheel is built from: setuptools' build/ would keep stale files
    source.mkdir()
    for part in SOURCES:
        if (ROOT / part).is_dir():
            shutil.copytree(ROOT / part, source / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(ROOT / part, source / part)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp / "dist", source],
        cwd=tmp)
    wheel = next((tmp / "dist").glob("nvil-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for member in ("nvil/models/rbm.py", "nvil/estimators/ais.py", "nvil/app/loop.py", "nvil/configs/train.yaml",
                   "nvil/configs/model/rbm.yaml", "nvil/backend/native/sequential.c"):
        assert member in names, f"{member} is not in the wheel"
    assert not any(n.split("/")[0] in ("models", "estimators", "configs", "tests") for n in names)
    run([sys.executable, "-m", "venv", "--system-site-packages", tmp / "venv"], cwd=tmp)
    run([tmp / "venv" / "bin" / "python", "-m", "pip", "install", "--no-deps", "-q", wheel], cwd=tmp)
    return tmp / "venv"


API = """
import json, sys
import torch
import nvil
from nvil.models import RBM
from nvil.estimators import Exact
assert "site-packages" in nvil.__file__ and "site-packages" in sys.modules["nvil.models"].__file__, nvil.__file__
run = nvil.train(*sys.argv[1:], run_dir="api_run")
result = nvil.evaluate(run.checkpoint, "estimator=exact", "eval.progress=false")
print(json.dumps({"steps": run.metrics["step"], "mean_log_p": result.mean_log_p, "stderr": result.stderr,
                  "rbm_parameters": sum(p.numel() for p in RBM(n_visible=6, n_hidden=3).parameters())}))
"""


@pytest.mark.slow
def test_the_wheel_trains_and_evaluates_from_python(venv, tmp_path):
    out = run([venv / "bin" / "python", "-c", API, *TINY], cwd=tmp_path)
    line = json.loads(out.stdout.strip().splitlines()[-1])
    assert line["steps"] == 40 and line["rbm_parameters"] == 6 * 3 + 6 + 3
    assert -12 * 0.7 < line["mean_log_p"] < 0 and line["stderr"] > 0  # 12 binary pixels: log p in (-12 log 2, 0)
    assert (tmp_path / "api_run" / "checkpoints" / "last.pt").exists()


@pytest.mark.slow
def test_the_console_scripts_run_from_any_directory(venv, tmp_path):
    run([venv / "bin" / "nvil-train", *TINY, "hydra.run.dir=cli_run"], cwd=tmp_path)
    last = tmp_path / "cli_run" / "checkpoints" / "last.pt"
    assert last.exists() and (tmp_path / "cli_run" / "train.log").exists()
    out = run([venv / "bin" / "nvil-evaluate", f"checkpoint={last}", "estimator=exact", "eval.progress=false"],
              cwd=tmp_path)
    line = json.loads(out.stdout.strip().splitlines()[-1])
    assert line["estimator"] == "exact" and line["mean_log_p"] < 0
    bad = subprocess.run([venv / "bin" / "nvil-train", "trainer.cpu_kernels=avx9"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: trainer.cpu_kernels must be one of auto, avx2, avx512, default, torch, got 'avx9'"]
