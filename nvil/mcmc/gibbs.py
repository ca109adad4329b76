"""Block Gibbs for Boltzmann machines: h ~ p_beta(h | x), then x ~ p_beta(x | h).

Each sub-step satisfies detailed balance with respect to p_beta, so the reverse operator T~ (Neal 1996;
Salakhutdinov 2009, Sec. 3.1) is the same sub-steps in the opposite order: x | h first, then h | x,
and for a semi-RBM the pixels swept in the opposite order too.
"""

from __future__ import annotations

from models.rbm import State


class BlockGibbs:
    def __init__(self, model, reverse: bool = False) -> None:
        self.model = model
        self.reversed = reverse

    def step(self, state: State, beta=1.0, generator=None) -> tuple[State, dict]:
        m = self.model
        if not self.reversed:
            h = m.sample_h(state.x, beta, generator)
            x = m.sample_x_given_h(h, beta, generator, x=state.x)
        else:
            x = m.sample_x_given_h(state.h, beta, generator, x=state.x, reverse=True)
            h = m.sample_h(x, beta, generator)
        return State(x, h), {}

    def reverse(self) -> "BlockGibbs":
        return BlockGibbs(self.model, not self.reversed)
