"""Metropolis-Hastings over continuous states, batched over chains, with the transition density that the
Chib-style estimator needs (Murray & Salakhutdinov 2009, appendix).

Two proposals, each with a per-chain step size eps:

- ``random_walk``: h' ~ N(h, eps^2 I);
- ``langevin``: h' ~ N(h + eps^2 / 2 grad log f(h), eps^2 I), the Metropolis-adjusted Langevin algorithm. It
  is HMC with a single leapfrog step (momentum p ~ N(0, I), h' = h + eps^2 / 2 grad + eps p), the one HMC whose
  transition density has a closed form.

Accepting with probability a(h -> h') = min(1, f(h') q(h | h') / (f(h) q(h' | h))) makes each kernel reversible
with respect to f, so its reverse operator T~ is itself. The transition density of an accepted move is

    T(h' <- h) = q(h' | h) a(h -> h')          (h' != h),

and a rejection leaves a point mass at h: T(h <- h) is infinite as a density. ``log_transition`` returns +inf
there, which makes that run's Chib estimate of p(v) exactly 0 (still unbiased; the appendix's caveat).

``adapt_step_size`` tunes each chain's eps in a warm-up run of its own (dual averaging towards an acceptance
rate); the kernel that is then used with the returned eps is fixed, so it is still an ordinary MH kernel.
"""

from __future__ import annotations

import math

import torch

from nvil.mcmc.adapt import DualAveraging
from nvil.mcmc.base import per_chain, untempered
from nvil.mcmc.hmc import value_and_grad

PROPOSALS = ("langevin", "random_walk")


class MetropolisHastings:
    """The MH kernel (``nvil.mcmc.base.ChibKernel``); its state is the position h itself, [chains, dim]."""

    def __init__(self, log_prob, step_size, proposal: str = "langevin") -> None:
        if proposal not in PROPOSALS:
            raise ValueError(f"proposal must be one of {PROPOSALS}, got {proposal!r}")
        self.log_prob_fn, self.proposal = log_prob, proposal
        self.step_size = step_size  # float or [chains]

    def _eps(self, h: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(self.step_size, dtype=h.dtype, device=h.device).reshape(-1, 1).expand(h.shape[0], 1)

    def init(self, x: torch.Tensor, generator=None) -> torch.Tensor:
        return x.detach()

    def reverse(self) -> "MetropolisHastings":
        """MH is reversible with respect to its target: T~ = T."""
        return self

    def oriented(self, backward: torch.Tensor) -> "MetropolisHastings":
        return self

    def log_prob(self, h: torch.Tensor) -> torch.Tensor:
        """The target log f(h)."""
        with torch.no_grad():
            return self.log_prob_fn(h)

    def _mean(self, h: torch.Tensor, eps: torch.Tensor, beta=1.0):
        """(proposal mean from h, beta log f(h)) for the tempered target f^beta."""
        if self.proposal == "random_walk":
            log_f = self.log_prob(h)
            return h, log_f if untempered(beta) else beta * log_f
        log_f, grad = value_and_grad(self.log_prob_fn, h)
        if not untempered(beta):
            log_f, grad = beta * log_f, per_chain(beta, h) * grad
        return h + 0.5 * eps**2 * grad, log_f

    @staticmethod
    def _log_q(to: torch.Tensor, mean: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """log N(to; mean, eps^2 I)."""
        d = to.shape[-1]
        return -0.5 * (((to - mean) / eps) ** 2).sum(-1) - d * (torch.log(eps.squeeze(-1)) + 0.5 * math.log(2 * math.pi))

    def _log_accept(self, frm, to, eps, mean_frm=None, log_f_frm=None, beta=1.0):
        """(log a(frm -> to), log q(to | frm))."""
        if mean_frm is None:
            mean_frm, log_f_frm = self._mean(frm, eps, beta)
        mean_to, log_f_to = self._mean(to, eps, beta)
        log_q_fwd = self._log_q(to, mean_frm, eps)
        log_ratio = log_f_to + self._log_q(frm, mean_to, eps) - log_f_frm - log_q_fwd
        log_a = torch.clamp(torch.nan_to_num(log_ratio, nan=-math.inf), max=0.0)
        return log_a, log_q_fwd

    def step(self, h: torch.Tensor, beta=1.0, generator=None) -> tuple[torch.Tensor, dict]:
        """One MH transition per chain leaving f^beta invariant: (new h, {"accept_prob": a(h -> h') [chains]})."""
        eps = self._eps(h)
        mean, log_f = self._mean(h, eps, beta)
        proposal = mean + eps * torch.randn(h.shape, generator=generator, device=h.device, dtype=h.dtype)
        log_a, _ = self._log_accept(h, proposal, eps, mean, log_f, beta)
        u = torch.rand(h.shape[0], generator=generator, device=h.device, dtype=h.dtype)
        accept = torch.log(u) < log_a
        return torch.where(accept[:, None], proposal, h), {"accept_prob": log_a.exp()}

    def log_transition(self, to: torch.Tensor, frm: torch.Tensor) -> torch.Tensor:
        """log T(to <- frm): log q(to | frm) + log a(frm -> to), and +inf where to == frm (a rejection's point mass)."""
        eps = self._eps(frm)
        log_a, log_q = self._log_accept(frm, to, eps)
        stayed = (to == frm).all(-1)
        return torch.where(stayed, torch.full_like(log_q, math.inf), log_q + log_a)


@torch.no_grad()
def adapt_step_size(log_prob, h: torch.Tensor, step_size, target_accept: float, proposal: str = "langevin",
                    num_steps: int = 100, generator=None):
    """Per-chain MH step sizes from a warm-up run of ``num_steps`` MH transitions started at ``h``: dual
    averaging (Hoffman & Gelman 2014, Alg. 5; ``nvil.mcmc.adapt.DualAveraging``) of each chain's acceptance
    probability towards ``target_accept``, from the initial ``step_size`` (a float or [chains]). Returns (the
    averaged step size exp(x_bar) [chains], the mean acceptance probability of the warm-up [chains]). The
    warm-up's states are thrown away: only eps leaves."""
    da = DualAveraging(target_accept=float(target_accept))
    eps0 = torch.as_tensor(step_size, dtype=h.dtype, device=h.device).expand(h.shape[0]).clone()
    state = da.init(eps0)
    accept_sum = torch.zeros(h.shape[0], dtype=h.dtype, device=h.device)
    for _ in range(num_steps):
        mh = MetropolisHastings(log_prob, da.step_size(state), proposal)
        h, info = mh.step(h, 1.0, generator)
        accept = torch.nan_to_num(info["accept_prob"], nan=0.0)
        state = da.update(state, accept)
        accept_sum = accept_sum + accept
    return da.final_step_size(state), accept_sum / max(1, num_steps)
