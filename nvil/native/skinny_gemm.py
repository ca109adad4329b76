"""Products with a few rows as C (``skinny_gemm.h``, built into the library of ``nvil.native``): NVIL's decoder
forward product and its SGD step at small batches, where MKL runs at about half of what the core does (``nvil.gemm``
routes them here)."""

from __future__ import annotations

import torch

from nvil.accel import opaque_when_compiled
from nvil.native import _checked, _kernel, _ptr, threads_for

BLOCK = {torch.float32: 96, torch.float64: 48}  # the columns of one register block (6 registers)


def _product(dtype: torch.dtype, rows: int, inner: int, cols: int, *args) -> None:
    """The kernel over column ranges of whole register blocks, in torch.get_num_threads() OpenMP threads
    (``skinny_gemm_threads``; ``args``: a, its row and inner strides, alpha, b, bias, init, c)."""
    block = BLOCK[dtype]
    blocks = -(-cols // block)
    _kernel("skinny_gemm_threads", dtype)(blocks, threads_for(blocks, 2), block, rows, inner, cols, *args)


def linear(x: torch.Tensor, wt: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x wt + bias for x [N, K] with N small, wt [K, M] (a weight stored input-major, ``nvil.ops.input_major_``),
    bias [M] or None. Returns [N, M]."""
    dtype = x.dtype
    for name, t in (("x", x), ("wt", wt), ("bias", bias)):
        _checked(t, dtype, name)
    (n, k), m = x.shape, wt.shape[1]
    out = torch.empty(n, m, dtype=dtype)
    _product(dtype, n, k, m, _ptr(x), k, 1, 1.0, _ptr(wt), _ptr(bias), None, _ptr(out))
    return out


@opaque_when_compiled("nvil::skinny_linear", lambda x, wt, bias: x.new_empty(x.shape[0], wt.shape[1]))
def linear_op(x: torch.Tensor, wt: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``linear`` of any strides; under ``torch.compile`` the operator ``nvil::skinny_linear``
    (``nvil.accel.opaque_when_compiled``)."""
    return linear(x.contiguous(), wt.contiguous(), None if bias is None else bias.contiguous())


def update_(wt: torch.Tensor, v: torch.Tensor, d: torch.Tensor, alpha: float) -> torch.Tensor:
    """wt += alpha v' d in place for wt [K, M], v [N, K] and d [N, M] with N small: the SGD step (or, with alpha the
    step's scale into a zeroed buffer, the gradient) of a layer stored input-major with input v and dL/d(output) d,
    in one pass over wt. Returns wt."""
    for name, t in (("wt", wt), ("v", v), ("d", d)):
        _checked(t, wt.dtype, name)
    step_(wt, v, d, alpha)
    return wt


def step_(wt: torch.Tensor, v: torch.Tensor, d: torch.Tensor, alpha: float) -> None:
    """``update_`` for tensors already checked (contiguous, one dtype, on the CPU: ``nvil.gemm._takes_skinny``)."""
    (n, k), m = v.shape, wt.shape[1]
    _product(wt.dtype, k, n, m, _ptr(v), 1, k, alpha, _ptr(d), None, _ptr(wt), _ptr(wt))
