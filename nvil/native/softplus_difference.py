"""AIS's weight increment for an RBM as C (``softplus_difference.h``, built into the library of ``nvil.native``)."""

from __future__ import annotations

import torch

from nvil.native import _checked, _ptr, library, threads_for


def softplus_difference(a: torch.Tensor, beta_lo: float, beta_hi: float) -> torch.Tensor:
    """sum_j softplus(beta_hi a_j) - softplus(beta_lo a_j) per row of a [rows, width] (float32), 0 <= beta_lo <=
    beta_hi: AIS's weight increment for an RBM (``estimators.ais_rbm.softplus_difference``, the same form) in one
    pass with vectorised polynomials for exp, expm1 and log1p, summed in double (``softplus_difference.h``). The rows
    in torch.get_num_threads() OpenMP threads (torch's pool). Returns float64 [rows]."""
    fn = library().softplus_difference_threads_f32
    _checked(a, torch.float32, "a")
    rows, width = a.shape
    out = torch.empty(rows, dtype=torch.float64)
    fn(rows, width, _ptr(a), beta_lo, beta_hi - beta_lo, _ptr(out), threads_for(rows, 64))
    return out
