"""The CUDA whole-sweep kernel (``nvil.backend.native.triton_sweep``) makes the reference's chains.

Without a GPU the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, set before the kernel is built) on CPU
tensors: the same program, so its arithmetic and control flow are checked on every machine. Against the
running-softplus loop of ``test_sequential_fast`` (``ReferenceSweep``): the same states and log T (Murray &
Salakhutdinov 2009, Eq. 11) in float64, forward, reverse and per-chain directions, tempered, two weighted terms (the
per-example AIS target), forced and argmax; wide factors with pairwise terms. The kernel given the factors' signs
flipped fails the same check; too wide a density falls back to the eager sweep. On a CUDA machine the compiled kernel
is checked against the eager CUDA sweep in float32.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nvil.mcmc.sequential_gibbs import SequentialGibbs
from nvil.backend.native import triton_sweep
from test_sequential_fast import (DT, ReferenceSweep, density, pixel_case, reference_pixel_sweep, start, sweep_case,
                                  wide_density)

# Triton's interpreter on CPU tensors takes most of a minute to build the kernels: with -m slow (and on CUDA machines
# tests/test_cuda.py checks the compiled kernel).
pytestmark = [pytest.mark.skipif(not triton_sweep.available(), reason="needs Triton"), pytest.mark.slow]
MAX_COLUMNS = triton_sweep.MAX_COLUMNS


MODES = ("sample", "force", "argmax", "tempered", "two_terms")
CASES = [f"{mode}-{direction}" for mode in MODES for direction in ("forward", "per_chain")] + [
    "wide", "wrong_sign", "too_wide"]
PIXEL_CASES = ["pixel-forward", "pixel-reverse", "pixel-per_chain_beta", "pixel-no_lateral"]


def pixel(name: str) -> dict:
    """The semi-RBM's pixel sweep as the kernel (``lateral_sweep``) against the per-pixel loop, the same uniforms;
    ``no_lateral``: the kernel given beta = 0 (the broken variant)."""
    field, s0, lateral = pixel_case()
    u = torch.rand(field.shape, generator=torch.Generator().manual_seed(5), dtype=DT)
    reverse = name.endswith("reverse")
    beta = torch.linspace(0.2, 1.0, 12, dtype=DT)[:, None] if name.endswith("beta") else torch.tensor(1.0, dtype=DT)
    v = s0.clone()
    ran = triton_sweep.lateral_sweep(v, field, torch.log(u) - torch.log1p(-u),
                                     beta * 0 if name.endswith("no_lateral") else beta, reverse, lateral)
    ref = reference_pixel_sweep(field, s0, u, lateral, beta, reverse)
    return {"same_states": torch.equal(v, ref), "log_t_gap": 0.0, "moved": not torch.equal(v, s0), "ran": [ran]}


def case(name: str, ran: list) -> dict:
    """One comparison of the kernel's sweep with the reference's (same generator seed): whether the states agree,
    the largest log T difference, whether the sweep moved, and what the kernel returned (``ran``)."""
    h0, kw = start(), {}
    terms = ref_terms = [(1.0, density())]
    if name in ("wide", "wrong_sign"):
        h0 = (torch.rand(24, 15, generator=torch.Generator().manual_seed(1), dtype=DT) < 0.5).to(DT)
        terms = ref_terms = [(0.4, wide_density(seed=3)), (0.6, wide_density())]
        kw = {"reverse": torch.arange(24) % 3 == 0, "beta": torch.linspace(0.3, 1.0, 24, dtype=DT)}
        if name == "wrong_sign":
            terms = [(0.4, wide_density(seed=3)), (0.6, wide_density())]
            for _, d in terms:
                for f in d.factors:
                    f.sign = -f.sign
    elif name == "too_wide":
        triton_sweep.MAX_COLUMNS = 8
        kw = {"force": start(seed=2)}
    else:
        terms, kw = sweep_case(*name.split("-"))
        ref_terms = terms
    del ran[:]
    h_fast, t_fast = SequentialGibbs(terms, accel="auto").sweep(h0, generator=torch.Generator().manual_seed(11), **kw)
    h_ref, t_ref = ReferenceSweep(ref_terms).sweep(h0, generator=torch.Generator().manual_seed(11), **kw)
    triton_sweep.MAX_COLUMNS = MAX_COLUMNS
    return {"same_states": torch.equal(h_fast, h_ref), "log_t_gap": (t_fast - t_ref).abs().max().item(),
            "moved": not torch.equal(h_fast, h0), "ran": list(ran)}


def worker() -> None:
    """Every case in this process, the kernel in Triton's interpreter (TRITON_INTERPRET=1 must be set before Triton
    is first imported, so the test runs this in a child process); one JSON line."""
    ran, kernel = [], triton_sweep.sequential_sweep
    triton_sweep.sequential_sweep = lambda *a, **kw: ran.append(kernel(*a, **kw)) or ran[-1]
    print(json.dumps({**{name: case(name, ran) for name in CASES}, **{name: pixel(name) for name in PIXEL_CASES}}))


@pytest.fixture(scope="module")
def interpreted() -> dict:
    if torch.cuda.is_available():  # the images' older Triton interpreters differ; there the compiled kernel is checked
        pytest.skip("CUDA machine: the compiled kernel is checked against the reference below instead")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, __file__, "--worker"], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).parent, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", CASES[:10])
def test_kernel_matches_the_running_softplus_loop(interpreted, name):
    """Sampled, forced, argmax, tempered per chain and two weighted terms, forward and per-chain directions."""
    r = interpreted[name]
    assert r["ran"] == [True] and r["same_states"] and r["log_t_gap"] < 1e-10
    assert r["moved"] or name.startswith("argmax")


def test_kernel_on_wide_factors_with_pairwise_terms(interpreted):
    """K = 37 + 9 + 40 packed columns per term (not a power of two), two terms, units in two layers with pairwise
    terms (J), reverse directions per chain, tempering per chain."""
    r = interpreted["wide"]
    assert r["ran"] == [True] and r["same_states"] and r["moved"] and r["log_t_gap"] < 1e-10


def test_kernel_with_a_wrong_sign_fails(interpreted):
    """Power: the kernel given the factors' coefficients with the wrong sign is not the reference's chain."""
    r = interpreted["wrong_sign"]
    assert r["ran"] == [True] and not r["same_states"]


@pytest.mark.parametrize("name", PIXEL_CASES[:3])
def test_pixel_kernel_matches_the_per_pixel_loop(interpreted, name):
    """The semi-RBM's sweep (``lateral_sweep``): forward, reverse, per-chain beta; the per-pixel loop's chain."""
    r = interpreted[name]
    assert r["ran"] == [True] and r["same_states"] and r["moved"]


def test_pixel_kernel_without_the_lateral_input_fails(interpreted):
    r = interpreted["pixel-no_lateral"]
    assert r["ran"] == [True] and not r["same_states"]


def test_too_wide_a_density_sweeps_eagerly(interpreted):
    """Past ``MAX_COLUMNS`` the kernel declines before touching h, and the eager sweep gives the reference's chain."""
    r = interpreted["too_wide"]
    assert r["ran"] == [False] and r["same_states"] and r["log_t_gap"] < 1e-10


def test_only_auto_on_cuda_selects_the_kernel(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not triton_sweep.wanted("auto", "cpu") and not triton_sweep.wanted("none", "cuda")
    assert not triton_sweep.wanted("compile", "cuda") and triton_sweep.wanted("auto", "cuda")


def on_cuda(d, dtype):
    to = lambda t: None if t is None else t.to("cuda", dtype)  # noqa: E731
    return type(d)(d.n_units, to(d.u), to(d.const), to(d.J), [type(f)(to(f.M), to(f.c), f.sign, f.lo, f.hi)
                                                              for f in d.factors])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", MODES)
def test_compiled_kernel_matches_the_running_softplus_loop(mode, monkeypatch):
    """The compiled kernel on the GPU in float64, per-chain directions, fed the reference's uniforms: the reference's
    chain and log T."""
    triton_sweep._kernel = None
    terms, kw = sweep_case(mode, "per_chain")
    picks = torch.rand(start().shape, generator=torch.Generator().manual_seed(11), dtype=DT)
    h_ref, t_ref = ReferenceSweep(terms).sweep(start(), generator=torch.Generator().manual_seed(11), **kw)
    cuda_kw = {k: v.cuda() for k, v in kw.items() if torch.is_tensor(v)} | {k: v for k, v in kw.items()
                                                                          if not torch.is_tensor(v)}
    gibbs, h0 = SequentialGibbs([(s, on_cuda(d, DT)) for s, d in terms], accel="auto"), start().cuda()
    monkeypatch.setattr(torch, "rand", lambda *a, **k: picks.cuda())  # the sweep's one draw: its uniforms
    h_fast, t_fast = gibbs.sweep(h0, **cuda_kw)
    monkeypatch.undo()
    assert torch.equal(h_fast.cpu(), h_ref)
    torch.testing.assert_close(t_fast.cpu(), t_ref, rtol=1e-10, atol=1e-10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("reverse", [False, True])
def test_compiled_pixel_kernel_matches_the_per_pixel_loop(reverse):
    """The compiled pixel sweep on the GPU in float64, per-chain beta: the per-pixel loop's chain."""
    triton_sweep._kernel = None
    field, s0, lateral = pixel_case()
    u = torch.rand(field.shape, generator=torch.Generator().manual_seed(5), dtype=DT)
    beta = torch.linspace(0.2, 1.0, 12, dtype=DT)[:, None]
    v = s0.cuda()
    assert triton_sweep.lateral_sweep(v, field.cuda(), (torch.log(u) - torch.log1p(-u)).cuda(), beta.cuda(), reverse,
                                      lateral.cuda())
    assert torch.equal(v.cpu(), reference_pixel_sweep(field, s0, u, lateral, beta, reverse))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_kernel_agrees_with_the_eager_cuda_sweep():
    """float32 on the GPU, two wide factors with pairwise terms: the same decisions as the eager CUDA sweep but for
    rounding ties, log T to float rounding."""
    triton_sweep._kernel = None
    d = on_cuda(wide_density(chains=300, scale=0.7), torch.float32)
    h0 = (torch.rand(300, 15, generator=torch.Generator().manual_seed(1)) < 0.5).float().cuda()
    h_fast, t_fast = SequentialGibbs([(1.0, d)], accel="auto").sweep(h0, force=h0.flip(0))
    h_ref, t_ref = SequentialGibbs([(1.0, d)]).sweep(h0, force=h0.flip(0))
    assert torch.equal(h_fast, h_ref)
    torch.testing.assert_close(t_fast, t_ref, rtol=1e-5, atol=1e-4)
    h_fast, _ = SequentialGibbs([(1.0, d)], accel="auto").sweep(h0, generator=torch.Generator("cuda").manual_seed(3))
    h_ref, _ = SequentialGibbs([(1.0, d)]).sweep(h0, generator=torch.Generator("cuda").manual_seed(3))
    assert (h_fast != h_ref).float().mean() < 1e-3


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    worker()
