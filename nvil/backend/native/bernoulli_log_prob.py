"""A Bernoulli layer's log-probability per row as C (``bernoulli_log_prob.h``, built into the library of
``nvil.backend.native``): the K-sample bounds' largest elementwise passes, on a CPU. Its measured gain is in
``nvil.backend.registry`` (entry ``bernoulli_log_prob``)."""

from __future__ import annotations

import torch

from nvil.backend import native
from nvil.backend.native import _ptr, library, threads_for
from nvil.core import ops

REPEATS = 4  # logits whose rows repeat this often or more have their softplus terms summed once per distinct row
MIN_ELEMENTS = 4096  # below this the call's set-up outweighs torch's three kernels (a [20, 784] layer has 15,680)


def bernoulli_log_prob(logits: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``nvil.core.ops.bernoulli_log_prob`` (the definition), as one C pass (``in_c``) where that applies: large
    float32 CPU logits outside autograd, the K-sample bounds' and block Gibbs's largest elementwise passes. The same
    values up to float32 rounding (tests/test_bernoulli_log_prob.py)."""
    out = in_c(logits, value)
    return out if out is not None else ops.bernoulli_log_prob(logits, value)


def periodic_rows(t: torch.Tensor, shape: torch.Size) -> torch.Tensor | None:
    """``t`` (broadcast to ``shape``) as a contiguous [period, width] block whose rows repeat along the rows of
    ``shape``, or None where it is not one: its leading dimensions of size 1 or stride 0 dropped (the
    ``x.unsqueeze(0).expand(K, ...)`` of the K-sample bounds), the rest contiguous and equal to the trailing shape."""
    while t.dim() > 1 and (t.shape[0] == 1 or t.stride(0) == 0):
        t = t[0]
    if t.dim() == 0 or not t.is_contiguous() or tuple(t.shape) != tuple(shape[len(shape) - t.dim():]):
        return None
    return t.reshape(-1, shape[-1])


def in_c(logits: torch.Tensor, value: torch.Tensor) -> torch.Tensor | None:
    """sum_j value_j a_j - softplus(a_j) over the last dimension (``nvil.core.ops.bernoulli_log_prob``) in one pass with
    vectorised polynomials for exp and log1p, summed in double, in torch.get_num_threads() OpenMP threads (torch's
    pool) over the rows: float32, of the broadcast leading shape. None where it does not apply (not float32 CPU
    tensors; fewer than ``MIN_ELEMENTS`` terms; an operand whose rows do not repeat in the broadcast shape; an input
    that requires grad under grad mode, which autograd differentiates through torch's form; a step being compiled,
    where Inductor fuses torch's form; a machine where the kernels do not build): the caller's torch form, the same
    values up to float32 rounding."""
    if (logits.dtype != torch.float32 or value.dtype != torch.float32 or logits.device.type != "cpu"
            or value.device.type != "cpu" or torch.compiler.is_compiling()
            or (torch.is_grad_enabled() and (logits.requires_grad or value.requires_grad))):
        return None
    shape = torch.broadcast_shapes(logits.shape, value.shape)
    if len(shape) == 0 or shape.numel() < MIN_ELEMENTS:
        return None
    a, v = periodic_rows(logits, shape), periodic_rows(value, shape)
    if a is None or v is None or not native.wanted("auto", "cpu"):
        return None
    out = torch.empty(shape[:-1], dtype=torch.float32)
    rows, width, period = out.numel(), shape[-1], a.shape[0]
    zero = None  # log p(0) of each distinct row of logits, where they repeat (q's first layer, a factorial prior)
    if period * REPEATS <= rows:
        zero, zeros = torch.empty(period, dtype=torch.float32), torch.zeros(1, width)  # held through the call
        library().bernoulli_log_prob_threads_f32(period, width, _ptr(a), period, _ptr(zeros), 1, None, _ptr(zero),
                                                 threads_for(period, 256))
    library().bernoulli_log_prob_threads_f32(rows, width, _ptr(a), period, _ptr(v), v.shape[0], _ptr(zero),
                                             _ptr(out), threads_for(rows, 256))
    return out
