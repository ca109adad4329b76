"""The one transition-operator protocol every Markov chain here speaks (BlackJAX's ``init`` / ``step`` shape,
with the tempering argument of its tempered SMC kernels).

A kernel is batched over chains (the first dimension of every tensor in its state) and draws its randomness
from an explicit ``torch.Generator``:

- ``init(x, generator) -> state``: the chain state that starts at x (Boltzmann machines draw the hidden units;
  continuous kernels cache what the first step needs, such as HMC's log density and gradient).
- ``step(state, beta, generator) -> (state, info)``: one transition leaving the tempered target p^beta invariant
  (``beta`` a float or a [chains] tensor; 1 is the target itself). ``info`` (a dict or a named tuple) carries the
  diagnostics of this step: acceptance probabilities, swap rates. It is returned beside the state, never kept.
- ``reverse() -> kernel``: the reverse operator T~ (Neal 1996; Murray & Salakhutdinov 2009, Sec. 2.3): the same
  sub-steps in the opposite order, so that T~(x <- x') p(x') = T(x' <- x) p(x). A reversible kernel (MH, HMC,
  tempered transitions) is its own reverse.

Where the Chib-style estimator (Murray & Salakhutdinov 2009, Fig. 1) uses a kernel it also needs
(``ChibKernel``): ``log_transition(to, frm)`` = log T(to <- frm) (their Eq. 11), ``log_prob(state)`` = the
unnormalised log target, and ``oriented(backward)``: the kernel that moves chain c by T~ where ``backward[c]``
and by T elsewhere, so that chains running in different directions still step together.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Kernel(Protocol):
    def init(self, x: torch.Tensor, generator: torch.Generator | None = None) -> Any: ...

    def step(self, state: Any, beta=1.0, generator: torch.Generator | None = None) -> tuple[Any, Any]: ...

    def reverse(self) -> "Kernel": ...


@runtime_checkable
class ChibKernel(Kernel, Protocol):
    def log_transition(self, to: Any, frm: Any) -> torch.Tensor: ...

    def log_prob(self, state: Any) -> torch.Tensor: ...

    def oriented(self, backward: torch.Tensor) -> Kernel: ...


def untempered(beta) -> bool:
    """beta is the float 1: the step may skip the tempering arithmetic (and round exactly as untempered code)."""
    return not torch.is_tensor(beta) and beta == 1


def per_chain(beta, like: torch.Tensor):
    """beta as a float, or as a [chains, 1] tensor that broadcasts against [chains, dim] states."""
    if torch.is_tensor(beta) and beta.dim() == 1:
        return beta.to(like.dtype).unsqueeze(-1)
    return beta
