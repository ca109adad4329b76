"""An affine layer on centred sparse inputs as C (``sparse_rows.h``, built into the library of ``nvil.native``): NVIL's
first inference and baseline layers, which read the centred binary data x - m, from the rows of their input-major
weights of the pixels that are on (``nvil.learners.fused``)."""

from __future__ import annotations

import torch

from nvil.accel import opaque_when_compiled
from nvil.cpu_kernels import cpu_flags
from nvil.native import _checked, _kernel, _ptr, threads_for

# Whether the kernels are vectorised by hand here (AVX-512, ``sparse_rows.h``), where they beat the GEMMs they replace;
# elsewhere the compiler's plain loops lose to them: on a Zen 3 (AVX2) an NVIL step at batch 20 was 1.2x slower eager
# and 1.45x slower compiled with them (bench/RESULTS.md, twenty-fourth session). NVIL's learners take them only here.
VECTORISED = "avx512f" in cpu_flags()


def centred_linear(v: torch.Tensor, m: torch.Tensor, wt: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """v wt + base for v = x - m [N, D] with x mostly zero, from the rows of wt [D, H] of the inputs that are on
    (``sparse_rows.h``): the affine layer W v + b with wt = W' (stored input-major, ``nvil.ops.input_major_``) and
    base = b - m wt. The examples in torch.get_num_threads() ranges. Returns [N, H]."""
    dtype = v.dtype
    fn = _kernel("centred_linear_threads", dtype)
    for name, t in (("v", v), ("m", m), ("wt", wt), ("base", base)):
        _checked(t, dtype, name)
    (n, d), h = v.shape, wt.shape[1]
    out = torch.empty(n, h, dtype=dtype)
    if fn(n, threads_for(n, 16), d, h, _ptr(v), _ptr(m), _ptr(wt), _ptr(base), _ptr(out)):
        raise MemoryError(f"centred_linear could not allocate its scratch of {d} inputs")
    return out


@opaque_when_compiled("nvil::centred_linear", lambda v, m, wt, base: v.new_empty(v.shape[0], wt.shape[1]))
def centred_linear_op(v: torch.Tensor, m: torch.Tensor, wt: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """``centred_linear`` of any strides; under ``torch.compile`` the operator ``nvil::centred_linear``
    (``nvil.accel.opaque_when_compiled``)."""
    return centred_linear(v.contiguous(), m.contiguous(), wt.contiguous(), base.contiguous())


def centred_update_(wt: torch.Tensor, v: torch.Tensor, m: torch.Tensor, d: torch.Tensor, alpha: float) -> torch.Tensor:
    """wt += alpha v' d in place, for v = x - m [N, D] with x mostly zero and d [N, H]: the gradient step (or, into a
    zeroed buffer, the gradient) of the weight of ``centred_linear``, as alpha (x' d - m (1' d)) in one pass over
    wt [D, H] (``sparse_rows.h``), its rows in torch.get_num_threads() ranges. Returns wt."""
    dtype = v.dtype
    fn = _kernel("centred_update_threads", dtype)
    for name, t in (("wt", wt), ("v", v), ("m", m), ("d", d)):
        _checked(t, dtype, name)
    (n, D), h = v.shape, wt.shape[1]
    dsum = d.sum(0)
    if fn(D, threads_for(D, 128), n, h, _ptr(v), _ptr(m), _ptr(d), _ptr(dsum), alpha, _ptr(wt)):
        raise MemoryError(f"centred_update_ could not allocate its scratch of {n} examples")
    return wt
