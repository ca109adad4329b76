"""The products with a few rows (nvil/native/skinny_gemm.h) against torch's, and nvil.gemm's routing to them.

``skinny_gemm.linear`` must give x wt + b and ``update_`` wt + alpha v' d, in float64 to rounding and in float32 to
float32's, for row counts that fill whole register blocks of 4, part of one, and one row, and column counts that
fill whole registers, part of one, and part of a block of six; in one thread or several (the same values: the
threads split the columns, each summed the same way); with the AVX-512 kernel and the plain loops (the library built
for AVX2); and as the operator ``torch.compile`` calls in its graph. A kernel that leaves the last partial register
alone fails the same comparison. ``nvil.gemm`` sends an input-major weight's products with few rows there and every
other product to torch or oneDNN.
"""

from __future__ import annotations

import pytest
import torch

from nvil import gemm, native
from nvil.cpu_kernels import cpu_flags
from nvil.native import skinny_gemm

ROWS = [1, 3, 4, 20, 23]
COLS = [16, 100, 200, 784]

needs_native = pytest.mark.skipif(not native.wanted("auto", "cpu"), reason="the native kernels do not build here")
pytestmark = needs_native


def case(rows: int, inner: int, cols: int, dtype=torch.float64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(rows, inner, generator=g) < 0.5).to(dtype)   # binary, as a layer of h
    wt = torch.randn(inner, cols, generator=g).to(dtype)
    b = torch.randn(cols, generator=g).to(dtype)
    d = torch.randn(rows, cols, generator=g).to(dtype)
    return x, wt, b, d


def tolerance(dtype):
    return dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("rows", ROWS)
def test_linear_equals_torch(rows, cols, dtype):
    x, wt, b, _ = case(rows, 200, cols, dtype)
    torch.testing.assert_close(skinny_gemm.linear(x, wt, b), x @ wt + b, **tolerance(dtype))
    torch.testing.assert_close(skinny_gemm.linear(x, wt, None), x @ wt, **tolerance(dtype))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("rows", ROWS)
def test_update_equals_torch(rows, cols, dtype):
    v, wt, _, d = case(rows, 200, cols, dtype)
    expected = wt - 0.3 * v.t() @ d
    torch.testing.assert_close(skinny_gemm.update_(wt, v, d, -0.3), expected, **tolerance(dtype))


def test_a_kernel_that_skips_the_partial_register_fails():
    """Power: the columns of the last partial register left as they were (the kernel run to the last whole one) are
    far from the product at these tolerances."""
    x, wt, b, _ = case(20, 200, 100)
    out = torch.zeros(20, 100, dtype=torch.float64)
    fn = native._kernel("skinny_gemm", torch.float64)
    fn(20, 200, 100, 0, 96, x.data_ptr(), 200, 1, 1.0, wt.data_ptr(), b.data_ptr(), None, out.data_ptr())
    torch.testing.assert_close(out[:, :96], (x @ wt + b)[:, :96], **tolerance(torch.float64))  # the rest is right
    with pytest.raises(AssertionError):
        torch.testing.assert_close(out, x @ wt + b, **tolerance(torch.float64))


def test_threads_split_the_columns_without_changing_the_values():
    x, wt, b, d = case(20, 200, 784, torch.float32)
    threads = torch.get_num_threads()
    results = []
    try:
        for t in (1, 3):
            torch.set_num_threads(t)
            results.append((skinny_gemm.linear(x, wt, b), skinny_gemm.update_(wt.clone(), x, d, 0.01)))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_the_operator_runs_inside_a_compiled_graph():
    x, wt, b, _ = case(20, 200, 784, torch.float32)
    compiled = torch.compile(lambda x, wt, b: torch.sigmoid(skinny_gemm.linear_op(x, wt, b)), fullgraph=True)
    torch.testing.assert_close(compiled(x, wt, b), torch.sigmoid(x @ wt + b), **tolerance(torch.float32))


@pytest.mark.skipif("avx512f" not in cpu_flags(), reason="the AVX-512 kernel is the one built here already")
def test_the_plain_loops_of_an_avx2_build_agree(tmp_path, monkeypatch):
    """The library built for AVX2 (-march=x86-64-v3, as on a CPU without AVX-512) runs the plain loops of
    skinny_gemm.h and sparse_rows.h: the same products."""
    from nvil.native import sparse_rows
    monkeypatch.setenv("NVIL_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "FLAGS", tuple("-march=x86-64-v3" if f == "-march=native" else f for f in native.FLAGS))
    monkeypatch.setattr(native, "_library", None)
    for dtype in (torch.float64, torch.float32):
        x, wt, b, d = case(23, 200, 100, dtype)
        torch.testing.assert_close(skinny_gemm.linear(x, wt, b), x @ wt + b, **tolerance(dtype))
        torch.testing.assert_close(skinny_gemm.update_(wt.clone(), x, d, -0.3), wt - 0.3 * x.t() @ d,
                                   **tolerance(dtype))
        m = torch.full((200,), 0.2, dtype=dtype)
        v = x - m
        torch.testing.assert_close(sparse_rows.centred_linear(v, m, wt, b - m @ wt), v @ wt + b, **tolerance(dtype))
        torch.testing.assert_close(sparse_rows.centred_update_(wt.clone(), v, m, d, -0.3), wt - 0.3 * v.t() @ d,
                                   **tolerance(dtype))


def input_major(out_features: int, in_features: int, dtype=torch.float32) -> torch.nn.Linear:
    layer = torch.nn.Linear(in_features, out_features).to(dtype)
    layer.weight.data = layer.weight.data.t().contiguous().t()
    return layer


@pytest.fixture
def counted(monkeypatch):
    """nvil.gemm on the skinny route where this CPU allows it, with the kernel's calls counted."""
    if not gemm.skinny_available():
        pytest.skip("products with few rows take torch's product on this CPU (no AVX-512 or not oneDNN's backend)")
    calls = []
    for name in ("linear", "step_"):
        original = getattr(skinny_gemm, name)
        monkeypatch.setattr(skinny_gemm, name, lambda *a, f=original, n=name: calls.append(n) or f(*a))
    return calls


def test_gemm_routes_an_input_major_layer_with_few_rows(counted):
    layer, h, d = input_major(784, 200), (torch.rand(20, 200) < 0.5).float(), torch.randn(20, 784)
    with torch.no_grad():
        torch.testing.assert_close(gemm.linear(h, layer.weight, layer.bias), layer(h), **tolerance(torch.float32))
        expected = layer.weight - 0.1 * d.t() @ h
        gemm.addmm_(layer.weight, d.t(), h, alpha=-0.1)
        torch.testing.assert_close(layer.weight, expected, **tolerance(torch.float32))
        grad = torch.empty_like(layer.weight)
        gemm.addmm_(grad, d.t(), h, alpha=0.5, beta=0)
        torch.testing.assert_close(grad, 0.5 * d.t() @ h, **tolerance(torch.float32))
    assert counted == ["linear", "step_", "step_"]


def test_gemm_leaves_every_other_product_to_torch(counted):
    h = (torch.rand(20, 200) < 0.5).float()
    with torch.no_grad():
        gemm.linear(h, torch.nn.Linear(200, 784).weight, None)                    # stored out-major
        gemm.linear(torch.rand(gemm.SKINNY_ROWS + 1, 200), input_major(784, 200).weight, None)  # too many rows
        gemm.linear(h, input_major(gemm.SKINNY_COLS - 1, 200).weight, None)      # too few outputs
        with pytest.raises(RuntimeError):                                          # mixed dtypes: torch's error
            gemm.linear(h, input_major(784, 200, torch.float64).weight, None)
    layer = input_major(784, 200)
    gemm.linear(h.requires_grad_(), layer.weight, layer.bias).sum().backward()   # under autograd
    assert counted == [] and layer.weight.grad is not None
