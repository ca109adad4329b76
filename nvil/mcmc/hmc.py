"""Hybrid (Hamiltonian) Monte Carlo, batched over chains (Duane, Kennedy, Pendleton & Roweth 1987;
Neal 2011, "MCMC using Hamiltonian dynamics").

The state is [chains, dim]: one chain per row, all chains moved at once, each accepted or rejected on
its own. With potential U(q) = -log p(q) and kinetic energy K(p) = 0.5 * sum(p^2 * inv_mass) (a diagonal
mass matrix M), H(q, p) = U(q) + K(p). One transition (Neal 2011, Sec. 5.3.2) draws p ~ N(0, M), runs L
leapfrog steps (Eq. 5.18-5.20) and accepts the end point with probability min(1, exp(-Delta H)); the
final negation of p is dropped, as K is even and p is redrawn next time. The log density and its
gradient at the current position are cached in the state, so each transition costs exactly L gradients, and the
log density itself is needed only at the end point: L - 1 gradients and one value-and-gradient.

The target is any log density, differentiated by autograd (``Autograd``), or one that gives its own gradient
(``Differentiable``: a model's closed form, such as ``GaussianNet.posterior``), which is then used instead.

Everything runs on the device of ``position`` and never syncs the host: rejection is a ``torch.where``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Protocol, runtime_checkable

import torch

from nvil.backend.accel import accelerate, compiled
from nvil.core.ops import value_and_grad  # noqa: F401 (the autograd fallback's gradient; nvil.mcmc.hmc.value_and_grad)
from nvil.mcmc.base import per_chain, untempered

LogDensity = Callable[[torch.Tensor], torch.Tensor]  # [chains, dim] -> [chains]


class HMCState(NamedTuple):
    position: torch.Tensor     # [chains, dim]
    log_density: torch.Tensor  # [chains], the target's log density at position (cached, never recomputed)
    grad: torch.Tensor         # [chains, dim], its gradient (cached)


class HMCInfo(NamedTuple):
    accept_prob: torch.Tensor    # [chains], min(1, exp(-Delta H)); 0 where Delta H is not finite
    accepted: torch.Tensor       # [chains] bool
    divergent: torch.Tensor      # [chains] bool: Delta H > divergence_threshold or not finite
    energy_change: torch.Tensor  # [chains], Delta H = H(proposal) - H(current)


@runtime_checkable
class Differentiable(Protocol):
    """A log density [chains, dim] -> [chains] that gives its own gradient wrt the position (detached, no
    parameter's ``.grad`` touched): ``grad(q)`` [chains, dim] and ``value_and_grad(q)``."""

    def __call__(self, q: torch.Tensor) -> torch.Tensor: ...

    def grad(self, q: torch.Tensor) -> torch.Tensor: ...

    def value_and_grad(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


class Autograd:
    """Any log density as a ``Differentiable``: its gradient by autograd (the general fallback). ``keep_grads``:
    return a copy of each gradient (under ``accel=cudagraphs`` the backward pass is replayed from a CUDA graph
    too, and its output lives in memory that the next replay overwrites, while HMC keeps the last gradient)."""

    def __init__(self, log_density: LogDensity, keep_grads: bool = False) -> None:
        self.log_density = log_density
        self.keep_grads = keep_grads

    def __call__(self, q: torch.Tensor) -> torch.Tensor:
        return self.log_density(q)

    def grad(self, q: torch.Tensor) -> torch.Tensor:
        return self.value_and_grad(q)[1]

    def value_and_grad(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        value, grad = value_and_grad(self.log_density, q)
        return (value, grad.clone()) if self.keep_grads else (value, grad)


class Accelerated:
    """A ``Differentiable`` whose ``grad`` and ``value_and_grad`` are compiled by ``nvil.backend.accel``."""

    def __init__(self, target: Differentiable, mode: str) -> None:
        self.log_density = target
        self.grad = accelerate(target.grad, mode)
        self.value_and_grad = accelerate(target.value_and_grad, mode)

    def __call__(self, q: torch.Tensor) -> torch.Tensor:
        return self.log_density(q)


def differentiable(log_density, accel: str = "none") -> Differentiable:
    """``log_density`` with its gradient: its own where it is ``Differentiable``, else autograd's. ``accel``
    compiles what computes the gradient: the target's own functions, or the log density autograd runs through."""
    if isinstance(log_density, Differentiable):
        return Accelerated(log_density, accel) if compiled(accel) else log_density
    return Autograd(accelerate(log_density, accel), keep_grads=accel == "cudagraphs")


def kinetic_energy(momentum: torch.Tensor, inv_mass: torch.Tensor | None = None) -> torch.Tensor:
    """K(p) = 0.5 * sum_i p_i^2 / m_i = p^T M^-1 p / 2 for a diagonal M, per chain: [chains]."""
    sq = momentum.square() if inv_mass is None else momentum.square() * inv_mass
    return 0.5 * sq.sum(-1)


def leapfrog(log_density: LogDensity | Differentiable, position: torch.Tensor, momentum: torch.Tensor,
             grad: torch.Tensor, step_size, num_steps: int, inv_mass: torch.Tensor | None = None, beta=1.0):
    """``num_steps`` leapfrog steps of size eps from (q, p), given grad = grad log p(q) (Neal 2011, Eq. 5.18-5.20),
    under the tempered potential U = -beta log p (``beta`` a float or [chains, 1]).

    step_size: a float, or a [chains, 1] tensor (anything broadcastable to [chains, dim]). inv_mass: None
    (identity) or the diagonal of M^-1, [dim] or [chains, dim]. The inner momentum half-steps are merged
    into full steps, so this costs ``num_steps`` gradient evaluations and no more, and the log density is
    evaluated at the end point only (``Differentiable.grad`` before it).
    Returns (position, momentum, log_density, grad) at the end point, log_density and grad untempered.
    """
    if num_steps < 1:
        raise ValueError(f"leapfrog needs num_steps >= 1, got {num_steps}")
    target = differentiable(log_density)
    kick = step_size if untempered(beta) else step_size * beta  # -dU/dq = beta grad log p, so p moves eps beta grad
    q = position
    p = _axpy(momentum, 0.5 * kick, grad)  # half step in momentum, Eq. 5.18 (a new tensor: p is ours from here on)
    for i in range(num_steps):
        q = _axpy(q, step_size, p if inv_mass is None else p * inv_mass)  # full step in position, Eq. 5.19
        if i < num_steps - 1:
            _axpy(p, kick, target.grad(q), out=p)  # two half steps in momentum (Eq. 5.20, then Eq. 5.18 of the next)
        else:
            log_p, grad = target.value_and_grad(q)
            _axpy(p, 0.5 * kick, grad, out=p)  # final half step in momentum, Eq. 5.20
    return q, p, log_p, grad


def _axpy(y: torch.Tensor, a, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """y + a x in one pass (``out=y``: in place), ``a`` a float or a tensor broadcasting against x."""
    return torch.addcmul(y, a, x, out=out) if torch.is_tensor(a) else torch.add(y, x, alpha=a, out=out)


class HMC:
    """The HMC transition kernel (``nvil.mcmc.base.Kernel``): ``init(position) -> state``,
    ``step(state, beta, generator, step_size=...) -> (state, info)``; reversible, so ``reverse()`` is itself.

    log_density: Callable[[Tensor [chains, dim]], Tensor [chains]], an unnormalised log density that
    treats rows independently, differentiated by autograd unless it is ``Differentiable`` (gives its own gradient).
    inv_mass: None (M = I) or the diagonal of M^-1, [dim] or [chains, dim].
    step_size: the default eps of ``step`` (a float or [chains]); a step may pass its own (MCEM adapts it).
    """

    def __init__(self, log_density: LogDensity, num_leapfrog: int = 5, inv_mass: torch.Tensor | None = None,
                 divergence_threshold: float = 1000.0, accel: str = "none", step_size=None) -> None:
        if num_leapfrog < 1:
            raise ValueError(f"num_leapfrog must be >= 1, got {num_leapfrog}")
        # accel (nvil.backend.accel) compiles the target's own gradient functions, or else the log density, forward and
        # backward (autograd through the compiled graph); the transition itself, and its random draws, stay eager.
        self.log_density = differentiable(log_density, accel)
        self.num_leapfrog = num_leapfrog
        self.inv_mass = inv_mass
        self.divergence_threshold = divergence_threshold
        self.step_size = step_size

    def init(self, position: torch.Tensor, generator: torch.Generator | None = None) -> HMCState:
        """The state at ``position`` with its log density and gradient (no random draw)."""
        log_p, grad = self.log_density.value_and_grad(position)
        return HMCState(position.detach(), log_p, grad)

    def reverse(self) -> "HMC":
        """HMC with a fresh momentum each step satisfies detailed balance (Neal 2011, Sec. 3.2): T~ = T."""
        return self

    def step(self, state: HMCState, beta=1.0, generator: torch.Generator | None = None, *,
             step_size=None) -> tuple[HMCState, HMCInfo]:
        """One HMC transition per chain (Neal 2011, Sec. 5.3.2) leaving p^beta invariant.

        p ~ N(0, M) as randn / sqrt(inv_mass), L leapfrog steps, then each chain accepts with probability
        min(1, exp(-Delta H)) against its own uniform; both draws use ``generator``. step_size: a float or
        a [chains] tensor (one step size per chain), else the kernel's own. beta: a float or [chains]; the
        state keeps the untempered log density and gradient. Rejected chains keep their position, log_density
        and grad exactly.
        """
        step_size = self.step_size if step_size is None else step_size
        if step_size is None:
            raise ValueError("HMC.step needs a step_size (here or in the constructor)")
        q = state.position
        inv_mass = None if self.inv_mass is None else self.inv_mass.to(q)
        eps = step_size
        if torch.is_tensor(eps):
            eps = eps.to(q)
            eps = eps.unsqueeze(-1) if eps.dim() == 1 else eps  # [chains] -> [chains, 1]
        noise = torch.randn(q.shape, generator=generator, device=q.device, dtype=q.dtype)
        p = noise if inv_mass is None else noise / inv_mass.sqrt()  # p ~ N(0, M), M = diag(1 / inv_mass)
        tempered = (lambda log_p: log_p) if untempered(beta) else (lambda log_p: beta * log_p)
        q_new, p_new, log_p_new, grad_new = leapfrog(self.log_density, q, p, state.grad, eps, self.num_leapfrog,
                                                     inv_mass, per_chain(beta, q))

        # Delta H = [U(q*) + K(p*)] - [U(q) + K(p)], with U = -beta log p
        h_new = kinetic_energy(p_new, inv_mass) - tempered(log_p_new)
        energy_change = h_new - (kinetic_energy(p, inv_mass) - tempered(state.log_density))
        finite = torch.isfinite(energy_change)
        accept_prob = torch.where(finite, torch.exp(torch.clamp(-energy_change, max=0.0)), 0.0)
        u = torch.rand(accept_prob.shape, generator=generator, device=q.device, dtype=q.dtype)
        accepted = u < accept_prob
        divergent = ~finite | (energy_change > self.divergence_threshold)

        a = accepted.unsqueeze(-1)
        new_state = HMCState(torch.where(a, q_new, q), torch.where(accepted, log_p_new, state.log_density),
                             torch.where(a, grad_new, state.grad))
        return new_state, HMCInfo(accept_prob, accepted, divergent, energy_change)
