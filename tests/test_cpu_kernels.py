"""torch's CPU kernel set (nvil/backend/cpu_kernels.py): AVX2 where the CPU has AVX-512 unless the user chose, and a compile
cache of its own for each set.

The choice is tested on given flags and environments; in fresh processes, that importing nvil changes nothing, that
the entry points' choice (``trainer.cpu_kernels=auto``) gives the AVX2 kernels and that a user's
``ATEN_CPU_CAPABILITY`` or ``trainer.cpu_kernels=avx512`` wins. The cache: torch.compile's on-disk cache is keyed without the
kernel set, so block Gibbs compiled under one set and replayed under the other from a shared cache draws wrong states
(or corrupts the heap). The test compiles under ``avx512`` into torch's default cache, then runs nvil's default
(AVX2, its own cache) and checks the compiled chain against the eager one; the broken variant shares the cache and
must fail."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvil.backend.cpu_kernels import CACHE_VARIABLE, VARIABLE, choose_kernels, cpu_flags, inductor_cache, requested

ROOT = Path(__file__).resolve().parents[1]
AVX512 = "avx512f" in cpu_flags()


def test_avx2_is_chosen_only_on_avx512_cpus_a_users_choice_is_kept_and_each_set_has_its_cache():
    env = {}
    assert choose_kernels("auto", env, {"avx2", "avx512f", "fma"}) == "avx2"
    assert env == {VARIABLE: "avx2", CACHE_VARIABLE: inductor_cache("avx2")}
    env = {}
    assert choose_kernels("auto", env, {"avx2", "fma"}) is None and env == {}  # no AVX-512: torch picks AVX2 itself
    env = {}
    assert choose_kernels("auto", env, set()) is None and env == {}            # no /proc/cpuinfo (macOS): nothing
    env = {}
    assert choose_kernels("torch", env, {"avx2", "avx512f"}) is None and env == {}  # torch's own pick
    env = {}
    assert choose_kernels("avx512", env, {"avx2", "avx512f"}) == "avx512"         # asked for by name
    assert env == {VARIABLE: "avx512", CACHE_VARIABLE: inductor_cache("avx512")}
    env = {VARIABLE: "avx512"}
    assert choose_kernels("auto", env, {"avx2", "avx512f"}) == "avx512"           # the user's variable wins
    assert env == {VARIABLE: "avx512", CACHE_VARIABLE: inductor_cache("avx512")}
    env = {VARIABLE: "avx512", CACHE_VARIABLE: "/mine"}
    assert choose_kernels("auto", env, {"avx2", "avx512f"}) == "avx512" and env[CACHE_VARIABLE] == "/mine"
    # a child that inherited an nvil parent's AVX2 cache but runs AVX-512 gets the AVX-512 cache
    env = {VARIABLE: "avx512", CACHE_VARIABLE: inductor_cache("avx2")}
    assert choose_kernels("auto", env, {"avx2", "avx512f"}) == "avx512"
    assert env[CACHE_VARIABLE] == inductor_cache("avx512")
    env = {VARIABLE: "avx512", CACHE_VARIABLE: inductor_cache("avx2") + "/sub"}  # not ours: kept
    assert choose_kernels("auto", env, {"avx2", "avx512f"}) == "avx512" and env[CACHE_VARIABLE].endswith("/sub")
    assert inductor_cache("avx2") != inductor_cache("avx512")


def test_the_command_line_choice_is_read_before_hydra():
    assert requested(["model=rbm", "trainer.cpu_kernels=avx512"], "trainer.cpu_kernels") == "avx512"
    assert requested(["+trainer.cpu_kernels=torch"], "trainer.cpu_kernels") == "torch"
    assert requested(["eval.cpu_kernels=avx2"], "trainer.cpu_kernels") == "auto"


def python(code: str, kernel_set: str | None = None, **extra: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter at the repository root; ``kernel_set`` sets ATEN_CPU_CAPABILITY (else unset),
    ``extra`` more variables (TMPDIR, TORCHINDUCTOR_CACHE_DIR)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(VARIABLE, None)
    env.pop(CACHE_VARIABLE, None)
    if kernel_set:
        env[VARIABLE] = kernel_set
    env.update(extra)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.skipif(not AVX512, reason="the choice only changes anything on a CPU with AVX-512")
def test_the_entry_points_choose_avx2_kernels_importing_nvil_does_not():
    probe = "import torch; print(torch.ones(2).exp().sum().item(), torch.backends.cpu.get_cpu_capability())"
    assert python("import nvil, nvil.models, nvil.estimators; " + probe).stdout.split()[-1] == "AVX512"
    entry = "import sys; sys.argv[1:] = {}; from nvil.app import entry; entry._choose('trainer.cpu_kernels'); "
    assert python(entry.format([]) + probe).stdout.split()[-1] == "AVX2"
    assert python(entry.format(["trainer.cpu_kernels=avx512"]) + probe).stdout.split()[-1] == "AVX512"
    assert python(entry.format([]) + probe, "avx512").stdout.split()[-1] == "AVX512"  # the user's variable


GIBBS_SCRIPT = r"""
from nvil.backend.cpu_kernels import choose_kernels
choose_kernels()  # as the entry points do
import torch
from nvil.models.rbm import BoltzmannMachine
from nvil.mcmc import BlockGibbs

torch.manual_seed(0)
rbm = BoltzmannMachine(12, 6)
with torch.no_grad():
    for p in (rbm.W, rbm.b, rbm.c):
        p.normal_(0, 0.5)
start = rbm.init_chains((torch.rand(8, 12, generator=torch.Generator().manual_seed(1)) < 0.4).float(),
                        torch.Generator().manual_seed(2))
states = {}
for mode in ("none", "compile"):
    g = torch.Generator().manual_seed(3)
    states[mode], _ = BlockGibbs(rbm, accel=mode).step(start, 0.9, g)
same = all(torch.equal(a, b) for a, b in zip(states["none"], states["compile"]))
print(torch.backends.cpu.get_cpu_capability(), "compiled chain == eager chain:", same, flush=True)
raise SystemExit(0 if same else 3)
"""


def avx512_then_nvil(tmp_path, share_the_cache: bool) -> subprocess.CompletedProcess:
    """Compile under torch's AVX-512 kernels into torch's default cache (as a user's earlier work left it), then run
    the script with nvil's defaults (AVX2), in nvil's own cache or, the broken variant, in that default cache."""
    tmp = {"TMPDIR": str(tmp_path)}
    default_cache = python("import os; os.environ.pop('ATEN_CPU_CAPABILITY', None); from torch._inductor.runtime."
                           "cache_dir_utils import default_cache_dir; print(default_cache_dir())", **tmp).stdout.split()[-1]
    assert default_cache.startswith(str(tmp_path))
    first = python(GIBBS_SCRIPT, "avx512", **tmp, TORCHINDUCTOR_CACHE_DIR=default_cache)
    assert first.returncode == 0, first.stdout[-300:] + first.stderr[-1000:]
    return python(GIBBS_SCRIPT, **tmp, **({"TORCHINDUCTOR_CACHE_DIR": default_cache} if share_the_cache else {}))


@pytest.mark.slow  # two processes that compile: beside its broken variant, below
@pytest.mark.skipif(not AVX512, reason="two kernel sets exist only on a CPU with AVX-512")
def test_compiled_gibbs_after_an_avx512_compile_in_the_default_cache_matches_eager(tmp_path):
    second = avx512_then_nvil(tmp_path, share_the_cache=False)
    assert second.returncode == 0, second.stdout[-300:] + second.stderr[-1000:]
    assert second.stdout.split()[0] == "AVX2"


@pytest.mark.slow
@pytest.mark.skipif(not AVX512, reason="two kernel sets exist only on a CPU with AVX-512")
def test_one_cache_shared_by_both_kernel_sets_the_broken_variant_fails(tmp_path):
    second = avx512_then_nvil(tmp_path, share_the_cache=True)
    assert second.returncode != 0, f"the shared cache gave the eager chain: {second.stdout[-200:]} (torch fixed it?)"
