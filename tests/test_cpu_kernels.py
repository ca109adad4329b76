"""torch's CPU kernel set (nvil/cpu_kernels.py): AVX2 where the CPU has AVX-512, unless the user chose.

The choice itself is tested on given flags; in fresh processes, that importing nvil first gives the AVX2 kernels
and that a user's ``ATEN_CPU_CAPABILITY`` wins. The reason for it is tested too: a compiled HMC transition of the
Gaussian belief net of ``bench/profile_hot_loops.py`` (784-64-64, 1,000 chains, L = 10), which corrupted the heap
under torch's AVX-512 kernels with torch 2.14.1, runs clean under nvil's choice and makes the eager chain's moves;
the broken variant (``ATEN_CPU_CAPABILITY=avx512``) must fail on a CPU with AVX-512 (marked slow: it documents
torch's bug, and starts passing when torch fixes it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvil.cpu_kernels import VARIABLE, cpu_flags, prefer_avx2

ROOT = Path(__file__).resolve().parents[1]
AVX512 = "avx512f" in cpu_flags()


def test_avx2_is_chosen_only_on_avx512_cpus_and_a_users_choice_is_kept():
    env = {}
    assert prefer_avx2(env, {"avx2", "avx512f", "fma"}) == "avx2" and env == {VARIABLE: "avx2"}
    env = {}
    assert prefer_avx2(env, {"avx2", "fma"}) is None and env == {}      # no AVX-512: torch's own pick is AVX2
    env = {}
    assert prefer_avx2(env, set()) is None and env == {}                # no /proc/cpuinfo (macOS): nothing
    env = {VARIABLE: "avx512"}
    assert prefer_avx2(env, {"avx2", "avx512f"}) is None and env == {VARIABLE: "avx512"}


def python(code: str, kernel_set: str | None = None) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter at the repository root; ``kernel_set`` sets ATEN_CPU_CAPABILITY (else unset)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(VARIABLE, None)
    if kernel_set:
        env[VARIABLE] = kernel_set
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(not AVX512, reason="the choice only changes anything on a CPU with AVX-512")
def test_importing_nvil_first_gives_torchs_avx2_kernels_unless_the_user_set_them():
    probe = "import nvil, torch; print(torch.ones(2).exp().sum().item(), torch.backends.cpu.get_cpu_capability())"
    assert python(probe).stdout.split()[-1] == "AVX2"
    assert python(probe, "avx512").stdout.split()[-1] == "AVX512"
    # The training entry point too (it imports hydra and estimators before anything of its own).
    assert python("import train, torch; print(torch.backends.cpu.get_cpu_capability())").stdout.split()[-1] == "AVX2"


HMC_SCRIPT = r"""
import torch
import nvil
from models.gaussian import GaussianBeliefNet
from nvil.mcmc.hmc import HMC

torch.set_num_threads(1)
torch.manual_seed(0)
net = GaussianBeliefNet(784, [64, 64])
x = (torch.rand(1000, 784, generator=torch.Generator().manual_seed(1)) < 0.13).float()
start = net.sample_prior(1000, torch.Generator().manual_seed(2))

def chain(mode):
    hmc, g = HMC(lambda s: net.log_joint(x, s), 10, accel=mode), torch.Generator().manual_seed(3)
    state = hmc.init(start)
    for _ in range(5):
        state = hmc.step(state, generator=g, step_size=0.01)[0]
    return state.position

close = ((chain("compile") - chain("none")).abs().amax(-1) < 1e-3).float().mean().item()
print(f"chains within 1e-3 of eager: {close:.3f}", flush=True)
raise SystemExit(0 if close >= 0.99 else 3)
"""


def test_compiled_hmc_runs_clean_under_nvils_kernels_and_makes_the_eager_moves():
    out = python(HMC_SCRIPT)
    assert out.returncode == 0, f"exit {out.returncode}: {out.stdout[-300:]} {out.stderr[-1500:]}"


@pytest.mark.slow
@pytest.mark.skipif(not AVX512, reason="torch's AVX-512 kernels exist only on a CPU with AVX-512")
def test_compiled_hmc_under_torchs_avx512_kernels_the_broken_variant_fails():
    out = python(HMC_SCRIPT, "avx512")
    assert out.returncode != 0, f"the AVX-512 build ran clean: {out.stdout[-300:]} (has torch fixed it?)"
