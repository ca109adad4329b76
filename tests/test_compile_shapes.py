"""A compiled step called with new shapes in one process (nvil/accel.py compiles for static shapes).

With torch 2.14.1 on AVX-512 CPUs, Dynamo's automatic dynamic graph of the fused NVIL step corrupted the heap: a
learner compiled at batch 20 and then another at batch 100 in one process died with "malloc(): unaligned tcache
chunk detected" (every run on the machine where it was found). ``accelerate`` now compiles with ``dynamic=False``, so
each shape gets a graph of its own. Each check runs in a fresh process (a corrupted heap must not take pytest down)
and compares the compiled learner's parameters after its updates with the eager learner's from the same seed.
The broken variant, the same script with Dynamo's dynamic graphs allowed and torch's AVX-512 kernels, must fail where
the CPU has AVX-512."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvil.cpu_kernels import cpu_flags

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import functools, sys
import torch
from omegaconf import OmegaConf
from models.inference import LayeredInference
from models.sbn import SBN
from nvil.learners.nvil import NVIL

torch.set_num_threads(1)
if sys.argv[1] == "dynamic":  # the broken variant: Dynamo's automatic dynamic graphs, as before the fix
    compile_ = torch.compile
    torch.compile = lambda fn, dynamic=None, **kw: compile_(fn, **kw)
cfg = OmegaConf.load("configs/learner/nvil.yaml")

def trained(batch, mode):
    torch.manual_seed(0)
    learner = NVIL(SBN(784, [200]), LayeredInference(784, [200]), cfg, torch.device("cpu"), 0)
    learner.accelerate(mode, torch.device("cpu"))
    x = (torch.rand(batch, 784, generator=torch.Generator().manual_seed(batch)) < 0.13).float()
    for _ in range(50):
        learner.step(x)
    return torch.cat([p.detach().flatten() for p in learner.model.parameters()])

worst = 0.0
for batch in (20, 100, 20, 37):
    worst = max(worst, (trained(batch, "compile") - trained(batch, "none")).abs().max().item())
print(f"max |compiled - eager| = {worst:.3g}", flush=True)
sys.exit(0 if worst < 1e-4 else 3)
"""


def run(variant: str, kernel_set: str | None = None) -> subprocess.CompletedProcess:
    """The script in a fresh process; ``kernel_set`` pins torch's CPU kernels (else nvil's choice, nvil/cpu_kernels.py)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("ATEN_CPU_CAPABILITY", None)
    if kernel_set:
        env["ATEN_CPU_CAPABILITY"] = kernel_set
    return subprocess.run([sys.executable, "-c", SCRIPT, variant], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)


def test_compiled_step_takes_new_batch_sizes_and_matches_eager():
    out = run("static")
    assert out.returncode == 0, f"exit {out.returncode}: {out.stdout[-500:]} {out.stderr[-1500:]}"
    assert "max |compiled - eager|" in out.stdout


@pytest.mark.slow
@pytest.mark.skipif("avx512f" not in cpu_flags(), reason="the dynamic graph's heap corruption was seen on AVX-512 CPUs only")
def test_dynamic_graphs_the_broken_variant_fail():
    out = run("dynamic", "avx512")  # where it was seen: torch's AVX-512 kernels (AVX2 ran it clean)
    assert out.returncode != 0, f"dynamic graphs ran clean: {out.stdout[-300:]} (has torch fixed it?)"
