"""The affine layer on centred sparse inputs (nvil/native/sparse_rows.h) against the dense products it replaces.

v = x - m with x binary (some examples with no input on, some inputs with m_j = 0 and never on): centred_linear must
give v W' + b and centred_update_ wt + alpha v' d, in float64 to rounding and in float32 to float32's, for output
widths that fill whole SIMD registers, part of one, and one unit; in one thread or several (the same values: each
output row is summed the same way whatever the split); and as the operator ``torch.compile`` calls in its graph.
A kernel that forgets the offset's rank-one part fails the same comparison.
"""

from __future__ import annotations

import pytest
import torch

from nvil.native import sparse_rows

WIDTHS = [1, 7, 16, 17, 100, 129, 200]


def case(n: int = 20, d: int = 150, h: int = 200, dtype=torch.float64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(n, d, generator=g) < 0.15).to(dtype)
    x[3] = 0                                     # an example with no input on
    m = torch.rand(d, generator=g).to(dtype) * 0.4
    m[:10] = 0                                   # inputs that are never on (the border pixels' mean 0)
    x[:, :10] = 0
    w = torch.randn(h, d, generator=g).to(dtype)
    b = torch.randn(h, generator=g).to(dtype)
    dout = torch.randn(n, h, generator=g).to(dtype)
    return x - m, m, w, b, dout


def tolerance(dtype):
    return dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("h", WIDTHS)
def test_centred_linear_equals_the_dense_affine_layer(h, dtype):
    v, m, w, b, _ = case(h=h, dtype=dtype)
    wt = w.t().contiguous().clone()  # its own memory (for h = 1 the transpose is already contiguous: a view of w)
    out = sparse_rows.centred_linear(v, m, wt, b - m @ wt)
    torch.testing.assert_close(out, v @ w.t() + b, **tolerance(dtype))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("h", WIDTHS)
def test_centred_update_equals_the_dense_gradient_step(h, dtype):
    v, m, w, _, dout = case(h=h, dtype=dtype)
    wt = w.t().contiguous().clone()  # its own memory (for h = 1 the transpose is already contiguous: a view of w)
    sparse_rows.centred_update_(wt, v, m, dout, -0.3)
    torch.testing.assert_close(wt, (w - 0.3 * dout.t() @ v).t(), **tolerance(dtype))


def test_a_kernel_without_the_rank_one_part_fails():
    """Power: x' d alone (the uncentred product: what the kernel computes with the offset's term left out) is far
    from v' d at these tolerances."""
    v, m, w, _, dout = case()
    wt = w.t().contiguous().clone()  # its own memory (for h = 1 the transpose is already contiguous: a view of w)
    sparse_rows.centred_update_(wt, v + m, torch.zeros_like(m), dout, -0.3)  # x' d: the rank-one term m (1' d) dropped
    with pytest.raises(AssertionError):
        torch.testing.assert_close(wt, (w - 0.3 * dout.t() @ v).t(), **tolerance(torch.float64))


def test_threads_split_the_work_without_changing_the_values():
    v, m, w, b, dout = case(n=64, d=784, h=200, dtype=torch.float32)
    results = []
    threads = torch.get_num_threads()
    try:
        for t in (1, 3):
            torch.set_num_threads(t)
            wt = w.t().contiguous().clone()  # its own memory (for h = 1 the transpose is already contiguous: a view of w)
            out = sparse_rows.centred_linear(v, m, wt, b - m @ wt)
            results.append((out, sparse_rows.centred_update_(wt, v, m, dout, 0.01)))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_the_operator_runs_inside_a_compiled_graph():
    v, m, w, b, _ = case(h=100, dtype=torch.float32)
    wt = w.t().contiguous().clone()  # its own memory (for h = 1 the transpose is already contiguous: a view of w)

    def layer(v, m, wt, b):
        return torch.tanh(sparse_rows.centred_linear_op(v, m, wt, b - m @ wt))

    compiled = torch.compile(layer, fullgraph=True)  # fullgraph: the operator must not break the graph
    torch.testing.assert_close(compiled(v, m, wt, b), torch.tanh(v @ w.t() + b), **tolerance(torch.float32))
