"""Block Gibbs for Boltzmann machines: h ~ p_beta(h | x), then x ~ p_beta(x | h).

Each sub-step satisfies detailed balance with respect to p_beta, so the reverse operator T~ (Neal 1996;
Salakhutdinov 2009, Sec. 3.1) is the same sub-steps in the opposite order: x | h first, then h | x,
and for a semi-RBM the pixels swept in the opposite order too.

The model is anything with the tempered conditionals of ``nvil.models.rbm.BoltzmannMachine`` (``sample_h``,
``sample_x_given_h``, ``hidden_input``, ``init_chains``): the machine itself, or the intermediate distributions of
AIS (``nvil.estimators.ais_rbm.TemperedRBM``, the machine with a base-rate model mixed in).

``accel`` (``nvil.backend.accel``): with ``compile`` or ``cudagraphs``, binary RBMs without labels or lateral weights
(``BoltzmannMachine.fused_gibbs``) run each sweep as one compiled kernel, matmul + sigmoid + comparison fused.
The uniforms are drawn first, from the same generator and in the same order as the eager sub-steps draw them,
so the random stream is the same in every mode. Other models run eagerly whatever ``accel`` says.
A model may carry a ``visible_offset`` b_A: its visible logits are then beta (b + W h) + (1 - beta) b_A.

For AIS on an RBM (``nvil.estimators.ais_rbm.RBMPath``), which draws its own uniforms: ``forward_sweep_eager``, the
sweep in fewer passes over memory when not compiled, and ``sweep_uniforms``, a sweep's uniforms from parallel
random streams on the CPU.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from nvil.backend import gemm, native
from nvil.backend.accel import accelerate, check_mode, compiled
from nvil.core.ops import chunks
from nvil.models.rbm import State, as_beta, temper


def _visible_logits(h, beta, W, b, offset):
    """beta (b + W h), plus (1 - beta) ``offset`` where there is one (beta a number, or a tensor as ``as_beta``)."""
    field = temper(beta, gemm.addmm(b, h, W.T))
    return field if offset is None else field + (1 - as_beta(beta, field)) * offset


def forward_sweep(x, a, u_h, u_x, beta, W, b, c, offset=None):
    """h ~ p_beta(h | x) then x' ~ p_beta(x | h), from uniforms u_h, u_x; a = a(x) or None."""
    if a is None:
        a = gemm.addmm(c, x, W)
    h = (u_h < torch.sigmoid(beta * a)).to(x.dtype)
    x = (u_x < torch.sigmoid(_visible_logits(h, beta, W, b, offset))).to(x.dtype)
    return x, h


def reverse_sweep(h, u_x, u_h, beta, W, b, c, offset=None):
    """x ~ p_beta(x | h) then h' ~ p_beta(h | x); also returns a(x) = c + x'W."""
    x = (u_x < torch.sigmoid(_visible_logits(h, beta, W, b, offset))).to(h.dtype)
    a = gemm.addmm(c, x, W)
    h = (u_h < torch.sigmoid(beta * a)).to(h.dtype)
    return x, h, a


def forward_sweep_eager(x, a, u_h, u_x, beta: float, W, b, c, offset=None):
    """``forward_sweep`` for a Python-number beta, in fewer passes over memory when run eagerly: the visible
    logits beta (b + W h) + (1 - beta) b_A as one ``addmm``, each probability compared in place (u < p written as
    p.gt_(u), 1. or 0. in p's own buffer: a bool result's copy to float costs more than the sigmoid). The same
    draws as ``forward_sweep`` for the same uniforms, up to the rounding of the logits."""
    if a is None:
        a = gemm.addmm(c, x, W)
    h = torch.mul(a, beta).sigmoid_().gt_(u_h)
    bias = beta * b if offset is None else beta * b + (1 - beta) * offset
    return gemm.addmm(bias, h, W.T, alpha=beta).sigmoid_().gt_(u_x), h


class BlockGibbs:
    def __init__(self, model, reverse: bool = False, accel: str = "none") -> None:
        self.model = model
        self.reversed = reverse
        self.accel = check_mode(accel, model.W.device)
        self._kernel = None
        if compiled(accel) and model.fused_gibbs:
            self._kernel = accelerate(reverse_sweep if reverse else forward_sweep, accel, model.W.device)
            self._offset = model.visible_offset

    def init(self, x: torch.Tensor, generator=None) -> State:
        """Chains at x with h ~ p(h | x) at beta = 1 (the model's ``init_chains``)."""
        return self.model.init_chains(x, generator)

    @torch.no_grad()
    def step(self, state: State, beta=1.0, generator=None, hidden_input: torch.Tensor | None = None) -> tuple[State, dict]:
        """One sweep. ``hidden_input``: a(state.x) = c + x'W when the caller already has it (saves a matmul in the
        forward order). The reverse order ends with h | x and returns that a(x) of the new x in
        ``info["hidden_input"]``, for a caller that weighs the new state (tempered transitions). Outside autograd,
        as every transition operator here (the draws are discrete; no graph is kept, and the products take
        ``nvil.backend.gemm``'s faster path)."""
        if self._kernel is not None:
            return self._fused_step(state, beta, generator, hidden_input)
        m = self.model
        if not self.reversed:
            h = m.sample_h(state.x, beta, generator, hidden_input)
            x = m.sample_x_given_h(h, beta, generator, x=state.x)
            return State(x, h), {}
        x = m.sample_x_given_h(state.h, beta, generator, x=state.x, reverse=True)
        a = m.hidden_input(x)
        h = m.sample_h(x, beta, generator, a)
        return State(x, h), {"hidden_input": a}

    def _fused_step(self, state: State, beta, generator, hidden_input) -> tuple[State, dict]:
        m, x = self.model, state.x
        n, dev, dt = x.shape[0], x.device, x.dtype
        beta = as_beta(beta, x)
        draw_h = lambda: torch.rand((n, m.n_hidden), generator=generator, device=dev, dtype=dt)  # noqa: E731
        draw_x = lambda: torch.rand((n, m.n_pixels), generator=generator, device=dev, dtype=dt)  # noqa: E731
        if not self.reversed:
            u_h = draw_h()
            u_x = draw_x()
            x, h = self._kernel(x, hidden_input, u_h, u_x, beta, m.W, m.b, m.c, self._offset)
            return State(x, h), {}
        u_x = draw_x()
        u_h = draw_h()
        x, h, a = self._kernel(state.h, u_x, u_h, beta, m.W, m.b, m.c, self._offset)
        return State(x, h), {"hidden_input": a}

    def reverse(self) -> "BlockGibbs":
        return BlockGibbs(self.model, not self.reversed, self.accel)


# ---- uniforms for many chains, drawn in parallel ------------------------------------------------------------

ROWS_PER_STREAM = 256  # chains per random stream: the draws depend on the number of chains, not on the threads
# (process id, workers) -> pool: a forked child, which has none of its parent's pool threads, makes its own.
_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}


def sweep_uniforms(n: int, widths, generator=None, device="cpu", dtype=torch.float32) -> tuple[torch.Tensor, ...]:
    """One [n, w] tensor of U[0, 1) draws per width in ``widths`` (a block-Gibbs sweep's u_h and u_x), a function of
    ``generator``'s state, n and the widths only.

    On the CPU, torch's generator (one mt19937, ~3.5 ns a number, serial) would cost a 784-500 AIS step at 1,000
    chains as much as one of its two matmuls. Here one 63-bit seed is drawn from ``generator``; each block of
    ``ROWS_PER_STREAM`` chains gets its own PCG64 stream (numpy, ~2.2 ns a number; independent streams from
    ``SeedSequence.spawn``) and the blocks are drawn on ``torch.get_num_threads()`` threads. The uniforms are
    24-bit (53-bit for float64) multiples, as torch.rand's. Other devices and dtypes: ``torch.rand``, in order."""
    device = torch.device(device)
    if device.type != "cpu" or dtype not in (torch.float32, torch.float64):
        return tuple(torch.rand((n, w), generator=generator, device=device, dtype=dtype) for w in widths)
    seed = native.seed_from(generator)
    out = tuple(torch.empty((n, w), dtype=dtype) for w in widths)
    arrays = [u.numpy() for u in out]
    blocks = list(chunks(n, ROWS_PER_STREAM))
    streams = np.random.SeedSequence(seed).spawn(len(blocks))

    def fill(i: int) -> None:
        rng, (s0, s1) = np.random.Generator(np.random.PCG64(streams[i])), blocks[i]
        for u in arrays:
            rng.random(out=u[s0:s1], dtype=u.dtype)

    workers = min(len(blocks), torch.get_num_threads())
    if workers <= 1:
        for i in range(len(blocks)):
            fill(i)
    else:
        key = (os.getpid(), workers)
        pool = _POOLS.get(key) or _POOLS.setdefault(key, ThreadPoolExecutor(workers, "sweep_uniforms"))
        list(pool.map(fill, range(len(blocks))))
    return out
