"""Block Gibbs for Boltzmann machines: h ~ p_beta(h | x), then x ~ p_beta(x | h).

Each sub-step satisfies detailed balance with respect to p_beta, so the reverse operator T~ (Neal 1996;
Salakhutdinov 2009, Sec. 3.1) is the same sub-steps in the opposite order: x | h first, then h | x,
and for a semi-RBM the pixels swept in the opposite order too.

The model is anything with the tempered conditionals of ``models.rbm.BoltzmannMachine`` (``sample_h``,
``sample_x_given_h``, ``hidden_input``, ``init_chains``): the machine itself, or the intermediate distributions of
AIS (``estimators.ais_rbm.TemperedRBM``, the machine with a base-rate model mixed in).

``accel`` (``nvil.accel``): with ``compile`` or ``cudagraphs``, binary RBMs without labels or lateral weights
(``BoltzmannMachine.fused_gibbs``) run each sweep as one compiled kernel, matmul + sigmoid + comparison fused.
The uniforms are drawn first, from the same generator and in the same order as the eager sub-steps draw them,
so the random stream is the same in every mode. Other models run eagerly whatever ``accel`` says.
A model may carry a ``visible_offset`` b_A: its visible logits are then beta (b + W h) + (1 - beta) b_A.
"""

from __future__ import annotations

import torch

from models.rbm import State, as_beta
from nvil.accel import accelerate, check_mode


def _visible_logits(h, beta, W, b, offset):
    """beta (b + W h), plus (1 - beta) ``offset`` where there is one."""
    field = beta * (b + h @ W.T)
    return field if offset is None else field + (1 - beta) * offset


def forward_sweep(x, a, u_h, u_x, beta, W, b, c, offset=None):
    """h ~ p_beta(h | x) then x' ~ p_beta(x | h), from uniforms u_h, u_x; a = a(x) or None."""
    if a is None:
        a = c + x @ W
    h = (u_h < torch.sigmoid(beta * a)).to(x.dtype)
    x = (u_x < torch.sigmoid(_visible_logits(h, beta, W, b, offset))).to(x.dtype)
    return x, h


def reverse_sweep(h, u_x, u_h, beta, W, b, c, offset=None):
    """x ~ p_beta(x | h) then h' ~ p_beta(h | x); also returns a(x) = c + x'W."""
    x = (u_x < torch.sigmoid(_visible_logits(h, beta, W, b, offset))).to(h.dtype)
    a = c + x @ W
    h = (u_h < torch.sigmoid(beta * a)).to(h.dtype)
    return x, h, a


class BlockGibbs:
    def __init__(self, model, reverse: bool = False, accel: str = "none") -> None:
        self.model = model
        self.reversed = reverse
        self.accel = check_mode(accel, model.W.device)
        self._kernel = None
        if accel != "none" and model.fused_gibbs:
            self._kernel = accelerate(reverse_sweep if reverse else forward_sweep, accel, model.W.device)
            self._offset = model.visible_offset

    def init(self, x: torch.Tensor, generator=None) -> State:
        """Chains at x with h ~ p(h | x) at beta = 1 (the model's ``init_chains``)."""
        return self.model.init_chains(x, generator)

    def step(self, state: State, beta=1.0, generator=None, hidden_input: torch.Tensor | None = None) -> tuple[State, dict]:
        """One sweep. ``hidden_input``: a(state.x) = c + x'W when the caller already has it (saves a matmul in the
        forward order). The reverse order ends with h | x and returns that a(x) of the new x in
        ``info["hidden_input"]``, for a caller that weighs the new state (tempered transitions)."""
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
