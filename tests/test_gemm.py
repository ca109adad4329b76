"""nvil.backend.gemm: float32 CPU products through oneDNN equal torch's, are taken where they should be, and fall back where
they must (autograd, other dtypes, small products); the backend's choice and its one-line error."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from nvil.backend import gemm
from nvil.core.errors import ConfigError

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.fixture
def backend(monkeypatch):
    """Set NVIL_GEMM and re-read it; the module's choice is restored afterwards."""
    before = gemm.backend()

    def choose(name: str) -> str:
        monkeypatch.setenv(gemm.VARIABLE, name)
        return gemm.choose_backend()

    yield choose
    monkeypatch.setattr(gemm, "_backend", before)


@pytest.fixture
def calls(monkeypatch):
    """Count the calls of the two oneDNN operators (the power of the equality tests: the path was taken)."""
    counts = {"linear": 0, "add": 0}
    linear, add = gemm.onednn_linear, gemm.onednn_linear_add

    def counted_linear(*args):
        counts["linear"] += 1
        return linear(*args)

    def counted_add(*args):
        counts["add"] += 1
        return add(*args)

    monkeypatch.setattr(gemm, "onednn_linear", counted_linear)
    monkeypatch.setattr(gemm, "onednn_linear_add", counted_add)
    return counts


def close(x: torch.Tensor, ref: torch.Tensor) -> bool:
    """Equal up to float32 rounding of sums of up to ~800 terms of unit size."""
    return torch.allclose(x, ref, rtol=1e-5, atol=2e-4 * ref.abs().max().item() ** 0.5 + 1e-4)


def operands(m=120, k=784, n=500, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.rand(m, k, generator=g) < 0.3).float()  # binary states, as the chains' rows
    b = torch.randn(k, n, generator=g) * 0.1
    return a, b, torch.randn(n, generator=g), g


@needs_onednn
def test_products_equal_torch_and_take_onednn(backend, calls):
    backend("onednn")
    a, b, bias, g = operands()
    assert a.numel() * b.shape[1] >= gemm.MIN_MACS
    assert close(gemm.matmul(a, b), a @ b)
    assert close(gemm.matmul(a, b.T.contiguous().T), a @ b)        # a transposed view as the weight
    assert close(gemm.matmul(a.view(4, 30, -1), b), a.view(4, 30, -1) @ b)  # a batch of rows
    assert close(gemm.addmm(bias, a, b), torch.addmm(bias, a, b))
    assert close(gemm.addmm(bias, a, b, alpha=0.37), torch.addmm(bias, a, b, alpha=0.37))
    full = torch.randn(a.shape[0], b.shape[1], generator=g)
    assert close(gemm.addmm(full, a, b, alpha=-1), torch.addmm(full, a, b, alpha=-1))
    assert calls == {"linear": 5, "add": 1}
    # the weight step in place: W += alpha v' p (PCD's statistics), W itself updated, no other tensor
    w = torch.randn(784, 500, generator=g)
    p = torch.rand(a.shape[0], 500, generator=g)
    ref = w.clone().addmm_(a.T, p, alpha=-0.01)
    ptr = w.data_ptr()
    assert gemm.addmm_(w, a.T, p, alpha=-0.01) is w and w.data_ptr() == ptr
    assert close(w, ref)
    assert calls["add"] == 2


@needs_onednn
def test_a_wrong_operand_fails_the_same_check(backend):
    """The tolerance of ``close`` has power: the transposed weight's product (b' where b was meant) fails it."""
    backend("onednn")
    a, b, _, _ = operands(k=500, n=500)
    assert not close(gemm.onednn_linear(a, b, None), a @ b)
    assert close(gemm.onednn_linear(a, b.t(), None), a @ b)


@needs_onednn
def test_falls_back_where_it_must(backend, calls):
    backend("onednn")
    a, b, bias, _ = operands()
    small = a[:2, :100], b[:100, :50]
    assert torch.equal(gemm.matmul(*small), small[0] @ small[1])               # below MIN_MACS
    assert torch.equal(gemm.matmul(a.double(), b.double()), a.double() @ b.double())  # float64
    big = torch.randn(784, 20000)
    assert torch.equal(gemm.matmul(a[0], big), a[0] @ big)                      # a vector times a matrix
    w = b.clone().requires_grad_()
    y = gemm.addmm(bias, a, w)                                                   # autograd through the weight
    y.square().sum().backward()
    assert y.grad_fn is not None and close(w.grad, a.T @ (2 * torch.addmm(bias, a, b)))
    with torch.no_grad():                                                        # the same weight outside autograd
        assert close(gemm.addmm(bias, a, w), torch.addmm(bias, a, b))
    assert calls == {"linear": 1, "add": 0}
    backend("aten")
    assert torch.equal(gemm.matmul(a, b), a @ b) and calls["linear"] == 1


@needs_onednn
def test_compiled_graph_calls_the_operator(backend):
    backend("onednn")
    a, b, bias, _ = operands()

    def sweep(x, u):
        return gemm.addmm(bias, x, b, alpha=0.5).sigmoid_().gt_(u)

    u = torch.rand(a.shape[0], b.shape[1], generator=torch.Generator().manual_seed(3))
    compiled = torch.compile(sweep, fullgraph=True)
    assert torch.equal(compiled(a, u), sweep(a, u))


def test_backend_choice(backend, monkeypatch):
    monkeypatch.setattr(gemm, "cpu_flags", lambda: {"avx2", "avx512f"})
    monkeypatch.setattr(gemm, "cpu_vendor", lambda: "GenuineIntel")
    assert backend("auto") == "aten"                     # MKL runs AVX-512 on Intel's CPUs
    monkeypatch.setattr(gemm, "cpu_vendor", lambda: "AuthenticAMD")
    assert backend("auto") == ("onednn" if torch.backends.mkldnn.is_available() else "aten")
    monkeypatch.setattr(gemm, "cpu_flags", lambda: {"avx2"})
    assert backend("auto") == "aten"                     # AVX2 only: MKL's code is as wide as oneDNN's
    assert backend("ATEN") == "aten"
    with pytest.raises(ConfigError, match="NVIL_GEMM='blas' is not one of auto, onednn, aten"):
        backend("blas")


def test_bad_backend_is_one_line_error_in_the_script(monkeypatch):
    """What ``python evaluate.py`` does with NVIL_GEMM=blas, run in this process: the import-time reading
    (``strict=False``) leaves the backend as it was, and the script stops with one error line naming the value."""
    from conftest import run_script

    before = gemm.backend()
    monkeypatch.setenv(gemm.VARIABLE, "blas")
    assert gemm.choose_backend(strict=False) == before and gemm.backend() == before
    proc = run_script("evaluate.py", "checkpoint=nowhere.pt", env={"NVIL_GEMM": "blas"})
    err = proc.stderr.strip()
    assert proc.returncode != 0 and err.startswith("error: ") and "\n" not in err, err
    assert "NVIL_GEMM='blas'" in err and "Traceback" not in proc.stderr
    assert gemm.backend() == before


@pytest.mark.slow
def test_bad_backend_is_one_line_error():
    """The same in a process of its own, where the bad value is already in the environment at import."""
    env = dict(os.environ, NVIL_GEMM="blas", HYDRA_FULL_ERROR="0")
    proc = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "checkpoint=nowhere.pt"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    err = proc.stderr.strip()
    assert proc.returncode != 0 and err.startswith("error: ") and "\n" not in err, err
    assert "NVIL_GEMM='blas'" in err and "Traceback" not in proc.stderr
