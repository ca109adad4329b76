"""The sequential (single-site) Gibbs sweep of ``sequential.c`` as one Triton kernel launch per sweep, on CUDA.

Its measured gain over the eager sweep (``bench/sequential_sweeps.py``) is in ``nvil.backend.registry`` (entry
``triton_sweep``).

Eagerly a sweep over M units is M rounds of a dozen small kernel launches (launch-bound); here one program per chain runs the units in a loop inside the kernel, with that chain's
running softplus probabilities p = sigmoid(a), s = sigmoid(-a) of every factor in registers (all factors packed side
by side into K columns, each column knowing its factor's units lo..hi-1 and coefficient scale_t * sign_f). Unit j's
log-odds is (``sequential.c``, Murray & Salakhutdinov 2009 Sec. 2.3)

    logit_j = beta_c [r_j - sign_j sum_k coef_k log(s_k + p_k e_jk)],    sign_j = 2 h_j - 1,

e_j the flip-table row exp(+-M_j) (``up`` where h_j = 0, ``down`` where h_j = 1); the new h_j is drawn (pick <
sigmoid(logit)), forced (pick) or the argmax; where it flips, p <- p e / den, s <- s / den (den = s + p e) in the
columns of the factors unit j enters, and r moves by (h_j' - h_j) J_j. The same arithmetic as the C kernel except
that each log(den_k) is taken separately (a GPU's log costs no more than its multiply), so chains agree with the eager
and C sweeps up to float rounding.

``lateral_sweep`` is the semi-RBM's pixel sweep the same way (a program per chain, the running lateral input v L in
registers, moved by (v_j' - v_j) L_j after each flip; the thresholds are the eager sweep's).

``accel=auto`` (the estimators' default) selects them for CUDA tensors where Triton imports; elsewhere, or where the
packed factors are wider than ``MAX_COLUMNS``, the sweep runs eagerly as before. ``TRITON_INTERPRET=1`` (set before the
first sweep) runs the same kernel in Triton's interpreter on CPU tensors, which is how the tests check it without a GPU.
"""

from __future__ import annotations

import os

import torch

MAX_COLUMNS = 16384  # packed factor columns held in registers per chain; wider densities sweep eagerly
MODES = {"sample": 0, "force": 1, "argmax": 2}
_kernel = None


def available() -> bool:
    """Whether Triton imports here (the CUDA sweep's only requirement beyond a CUDA device)."""
    try:
        import triton  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means: no Triton sweep
        return False
    return True


def wanted(mode: str, device) -> bool:
    """Whether a sequential sweep on ``device`` runs as this kernel: ``accel=auto`` on a CUDA device with Triton (or
    any device under ``TRITON_INTERPRET=1``, the tests' CPU check)."""
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    return mode == "auto" and (torch.device(device).type == "cuda" or interpret) and available()


def _build():
    import triton
    import triton.language as tl

    @triton.jit
    def sweep_kernel(h_ptr, r_ptr, picks_ptr, beta_ptr, reverse_ptr, logits_ptr, J_ptr,
                     p_ptr, s_ptr, tab_ptr, lo_ptr, hi_ptr, coef_ptr, M, K,
                     MODE: tl.constexpr, HAS_BETA: tl.constexpr, HAS_J: tl.constexpr,
                     BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr):
        c = tl.program_id(0).to(tl.int64)
        k = tl.arange(0, BLOCK_K)
        in_k = k < K
        p = tl.load(p_ptr + c * K + k, mask=in_k, other=0.0)
        s = tl.load(s_ptr + c * K + k, mask=in_k, other=1.0)
        lo = tl.load(lo_ptr + k, mask=in_k, other=0)
        hi = tl.load(hi_ptr + k, mask=in_k, other=0)
        coef = tl.load(coef_ptr + k, mask=in_k, other=0.0)
        back = tl.load(reverse_ptr + c) != 0
        row = c * M
        for i in range(0, M):
            j = tl.where(back, M - 1 - i, i).to(tl.int64)
            h_j = tl.load(h_ptr + row + j)
            on = h_j > 0
            active = (lo <= j) & (j < hi)
            e = tl.load(tab_ptr + on.to(tl.int64) * M * K + j * K + k, mask=active, other=1.0)
            pe = p * e
            den = pe + s
            gain = tl.sum(tl.where(active, coef * tl.log(den), 0.0), axis=0)
            logit = tl.load(r_ptr + row + j) - tl.where(on, gain, -gain)
            if HAS_BETA:
                logit = tl.load(beta_ptr + c) * logit
            if MODE == 0:
                new = tl.where(tl.load(picks_ptr + row + j) < 1.0 / (1.0 + tl.exp(-logit)), 1.0, 0.0)
            elif MODE == 1:
                new = tl.load(picks_ptr + row + j)
            else:
                new = tl.where(logit > 0, 1.0, 0.0)
            new = new.to(h_j.dtype)
            flip = new != h_j
            moved = tl.where(flip, active, False)
            p = tl.where(moved, pe / den, p)
            s = tl.where(moved, s / den, s)
            tl.store(logits_ptr + row + j, logit.to(h_j.dtype))
            tl.store(h_ptr + row + j, new)
            if HAS_J:
                if flip:
                    delta = new - h_j
                    for m0 in range(0, M, BLOCK_M):
                        m = m0 + tl.arange(0, BLOCK_M)
                        in_m = m < M
                        r = tl.load(r_ptr + row + m, mask=in_m, other=0.0)
                        tl.store(r_ptr + row + m, r + delta * tl.load(J_ptr + j * M + m, mask=in_m, other=0.0),
                                 mask=in_m)
                tl.debug_barrier()  # r_j of the next unit is read by every thread of the program

    @triton.jit
    def lateral_kernel(v_ptr, r_ptr, field_ptr, t_ptr, jscale_ptr, L_ptr, M, REVERSE: tl.constexpr,
                       BLOCK: tl.constexpr):
        c = tl.program_id(0).to(tl.int64)
        k = tl.arange(0, BLOCK)
        in_k = k < M
        row = c * M
        v = tl.load(v_ptr + row + k, mask=in_k, other=0.0)
        r = tl.load(r_ptr + row + k, mask=in_k, other=0.0)
        beta = tl.load(jscale_ptr + c)
        for i in range(0, M):
            if REVERSE:
                j = M - 1 - i
            else:
                j = i
            here = k == j
            v_j = tl.load(v_ptr + row + j)  # unit j's state before its own visit: v_ptr is written only at the end
            r_j = tl.sum(tl.where(here, r, 0.0), axis=0)
            new = tl.where(tl.load(field_ptr + row + j) + beta * r_j > tl.load(t_ptr + row + j), 1.0, 0.0)
            delta = (new - v_j).to(v.dtype)
            v = tl.where(here, new.to(v.dtype), v)
            row_j = tl.load(L_ptr + j * M + k, mask=tl.where(delta != 0, in_k, False), other=0.0)
            r = r + delta * row_j
        tl.store(v_ptr + row + k, v, mask=in_k)

    return sweep_kernel, lateral_kernel


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def sequential_sweep(h: torch.Tensor, r: torch.Tensor, *, mode: str, picks=None, beta=None, reverse=None, logits=None,
                     J=None, factors=()) -> bool:
    """One sweep over the units of every chain, in place on h [chains, M] (the arguments of
    ``nvil.backend.native.sequential_sweep``: r the quadratic field, per factor (p, s, up, down, lo, hi, R, coef); ``logits``
    is filled). Returns False, having changed nothing, where the packed factors are wider than ``MAX_COLUMNS``."""
    global _kernel
    chains, M = h.shape
    K = sum(f[0].shape[1] for f in factors)
    if K > MAX_COLUMNS:
        return False
    if _kernel is None:
        _kernel = _build()
    dev, dt = h.device, h.dtype
    p = torch.cat([f[0] for f in factors], 1).contiguous() if factors else torch.zeros(chains, 1, dtype=dt, device=dev)
    s = torch.cat([f[1] for f in factors], 1).contiguous() if factors else torch.ones(chains, 1, dtype=dt, device=dev)
    tab = torch.ones(2, M, max(K, 1), dtype=dt, device=dev)
    lo, hi, coef, at = [], [], [], 0
    for f in factors:
        width = f[0].shape[1]
        tab[0, :, at:at + width], tab[1, :, at:at + width] = f[2], f[3]
        lo.append(torch.full((width,), f[4], dtype=torch.int32))
        hi.append(torch.full((width,), f[5], dtype=torch.int32))
        coef.append(torch.full((width,), float(f[7]), dtype=dt))
        at += width
    lo, hi, coef = ((torch.cat(x) if x else torch.zeros(1, dtype=x_dtype)).to(dev)
                    for x, x_dtype in ((lo, torch.int32), (hi, torch.int32), (coef, dt)))
    reverse = torch.zeros(chains, dtype=torch.uint8, device=dev) if reverse is None else reverse.to(dev)
    block_k = _next_power_of_2(max(K, 16))
    _kernel[0][(chains,)](h, r, h if picks is None else picks, h if beta is None else beta, reverse,
                       logits if logits is not None else torch.empty_like(h), h if J is None else J,
                       p, s, tab, lo, hi, coef, M, max(K, 1),
                       MODE=MODES[mode], HAS_BETA=beta is not None, HAS_J=J is not None,
                       BLOCK_K=block_k, BLOCK_M=min(1024, _next_power_of_2(max(M, 16))),
                       num_warps=max(4, min(16, block_k // 256)))
    return True


def lateral_sweep(v: torch.Tensor, field: torch.Tensor, thresholds: torch.Tensor, beta, reverse: bool,
                  lateral: torch.Tensor) -> bool:
    """One sequential sweep over laterally coupled binary units (the semi-RBM's pixels given h), in place on v
    [chains, M]: unit j on where field_j + beta (v L)_j > thresholds_j, in index order (``reverse``: the opposite),
    the running lateral input v L kept in registers and moved by (v_j' - v_j) L_j after each flip (L symmetric, zero
    diagonal). The same decisions as ``nvil.models.visible.blocked_sweep`` for the same thresholds, up to rounding.
    ``beta``: a scalar or one per chain. Returns False, having changed nothing, where M exceeds ``MAX_COLUMNS``."""
    global _kernel
    chains, M = v.shape
    if M > MAX_COLUMNS:
        return False
    if _kernel is None:
        _kernel = _build()
    jscale = torch.as_tensor(beta, dtype=v.dtype, device=v.device).reshape(-1).expand(chains).contiguous()
    block = _next_power_of_2(max(M, 16))
    _kernel[1][(chains,)](v, (v @ lateral).contiguous(), field.contiguous(), thresholds.contiguous(), jscale,
                          lateral.contiguous(), M, REVERSE=bool(reverse), BLOCK=block,
                          num_warps=max(4, min(16, block // 256)))
    return True
