"""Parallel tempering (replica exchange) for Boltzmann machines.

K replicas per chain at beta_0 < ... < beta_{K-1} = 1, stored temperature-major in one batch of
K x chains states, so one block-Gibbs sweep moves every replica at its own beta. Then neighbouring
temperatures (k, k+1) propose to swap states, the even pairs on even steps and the odd pairs on odd
steps, accepting with probability min(1, exp((beta_k - beta_{k+1}) (log p*(x_{k+1}) - log p*(x_k)))).
The replicas at beta = 1 are samples from the model. ``SwapRates`` sums each pair's acceptances over the steps
between two reports, so every pair has a rate although each step proposes only half of them.
"""

from __future__ import annotations

import torch

from nvil.mcmc.gibbs import BlockGibbs
from nvil.mcmc.tempered import check_ladder
from nvil.models.rbm import State


class ParallelTempering:
    """A kernel (``nvil.mcmc.base.Kernel``) on the K x chains replica state. ``reversed``: the reverse operator,
    the same sub-steps in the opposite order (the swaps first, then the reverse block-Gibbs sweep)."""

    def __init__(self, model, betas: torch.Tensor, backward: bool = False) -> None:
        self.betas = check_ladder(betas, "parallel tempering needs", dtype=torch.float32)
        self.model = model
        self.gibbs = BlockGibbs(model)
        self.reversed = backward

    def reverse(self) -> "ParallelTempering":
        pt = ParallelTempering(self.model, self.betas, not self.reversed)
        pt.gibbs = self.gibbs.reverse()
        return pt

    @property
    def num_temps(self) -> int:
        return self.betas.numel()

    def init(self, x: torch.Tensor, generator=None) -> State:
        """Every replica of chain i starts at x[i]."""
        xs = x.repeat(self.num_temps, 1)
        return State(xs, self.model.sample_h(xs, 1.0, generator))

    def target(self, state: State) -> State:
        """The replicas at beta = 1 (the last temperature block)."""
        n = state.x.shape[0] // self.num_temps
        return State(state.x[-n:], state.h[-n:])

    @torch.no_grad()
    def step(self, state: State, beta=1.0, generator=None, parity: int = 0) -> tuple[State, dict]:
        """A block-Gibbs sweep of every replica at its own temperature, then swaps of the pairs of ``parity``
        (reversed: the swaps first). The target of the last replicas is p^beta (the ladder scaled by ``beta``)."""
        K = self.num_temps
        n = state.x.shape[0] // K
        betas = self.betas.to(state.x.device, state.x.dtype)
        if beta != 1:
            betas = beta * betas
        if self.reversed:
            state, info = self._swap(state, betas, generator, parity)
            return self.gibbs.step(state, betas.repeat_interleave(n), generator)[0], info
        state, _ = self.gibbs.step(state, betas.repeat_interleave(n), generator)
        return self._swap(state, betas, generator, parity)

    def _swap(self, state: State, betas: torch.Tensor, generator, parity: int) -> tuple[State, dict]:
        """Replica exchange between neighbouring temperatures (k, k + 1) with k = parity mod 2, 4, ..."""
        K = self.num_temps
        n = state.x.shape[0] // K
        log_p = self.model.log_unnormalised(state).view(K, n)
        lo = torch.arange(parity % 2, K - 1, 2, device=state.x.device)  # the pairs (k, k+1) proposed now
        if lo.numel() == 0:  # two temperatures, an odd step: no pair proposed
            return state, {"swap_rate": torch.full((K - 1,), float("nan"), device=state.x.device)}
        hi = lo + 1
        log_r = (betas[lo] - betas[hi]).unsqueeze(-1) * (log_p[hi] - log_p[lo])
        u = torch.rand(log_r.shape, generator=generator, device=log_r.device, dtype=log_r.dtype)
        swap = torch.log(u) < log_r  # [pairs, n]
        # Permutation of replica slots: for accepted pairs, slot k takes k+1's state and vice versa.
        # The pairs are disjoint, so each slot is written once.
        slots = torch.arange(K * n, device=state.x.device).view(K, n)
        index = slots.clone()
        index[lo] = torch.where(swap, slots[hi], slots[lo])
        index[hi] = torch.where(swap, slots[lo], slots[hi])
        index = index.view(-1)
        rate = torch.full((K - 1,), float("nan"), device=state.x.device, dtype=torch.float32)
        rate[lo] = swap.float().mean(-1)
        return State(state.x[index], state.h[index]), {"swap_rate": rate}


class SwapRates:
    """Each adjacent pair's swap acceptance rate over the PT steps since the last ``report``.

    A step proposes the even pairs or the odd ones (``ParallelTempering.step``'s ``swap_rate`` is NaN for the
    others), so one step's rates cover about half of the K - 1 pairs; summed here, step by step, every pair has one
    as soon as both parities have run. A pair not proposed since the last report (one step between reports) keeps
    its last rate, so each report names every pair that has ever been proposed."""

    def __init__(self, num_pairs: int) -> None:
        self.accepted = torch.zeros(num_pairs, dtype=torch.float64)  # sum over proposing steps of the chains' mean
        self.proposed = torch.zeros(num_pairs, dtype=torch.float64)  # steps that proposed the pair
        self.last = torch.full((num_pairs,), float("nan"), dtype=torch.float64)

    def add(self, swap_rate: torch.Tensor) -> None:
        """One step's ``swap_rate`` [pairs] (NaN: the pair was not proposed)."""
        rate = swap_rate.detach().double()
        if self.accepted.device != rate.device:  # kept where the chains are: no host sync per step
            self.accepted, self.proposed, self.last = (t.to(rate.device)
                                                       for t in (self.accepted, self.proposed, self.last))
        proposed = ~torch.isnan(rate)
        self.accepted += torch.where(proposed, rate, 0.0)
        self.proposed += proposed.double()

    def report(self) -> dict[str, torch.Tensor]:
        """{"k-(k+1)": rate} for every pair proposed so far, each over its proposals since the last report; resets."""
        fresh = self.proposed > 0
        self.last = torch.where(fresh, self.accepted / self.proposed.clamp(min=1), self.last)
        self.accepted.zero_()
        self.proposed.zero_()
        known = (~torch.isnan(self.last)).tolist()
        return {f"{k}-{k + 1}": self.last[k].float() for k in range(len(known)) if known[k]}
