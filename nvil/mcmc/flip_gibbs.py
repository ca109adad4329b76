"""Sequential Gibbs over binary units of any log density: the general single-site sweep.

For a target log f(h) = sum_t scale_t log f_t(h) over h in {0, 1}^M given only as functions (``log_prob(h)`` per
chain: a user's log p(x, h), the prior or the proposal q(h | x)), unit j is updated from

    log P(h_j = 1 | h_-j) - log P(h_j = 0 | h_-j) = log f(h with h_j = 1) - log f(h with h_j = 0),

one evaluation of the target per unit (the state with unit j flipped; log f of the current state is carried
along), so a sweep costs M evaluations on all chains at once. It is the same kernel as
``nvil.mcmc.sequential_gibbs.SequentialGibbs`` (Murray & Salakhutdinov 2009, Sec. 3; T and its reverse T~ of
Eq. 11), which computes the conditional from a density's structure (``BinaryDensity``: pairwise and softplus
terms) instead; both draw one uniform per unit per sweep in the same order, so from the same generator they make
the same moves. ``site_gibbs`` picks the structured one where every term has that structure
(``nvil.backend.registry``: ``structured_sequential_gibbs``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nvil.mcmc.base import untempered
from nvil.mcmc.sequential_gibbs import SequentialGibbs, SiteSweep
from nvil.models.binary_density import BinaryDensity


class FlipGibbs(SiteSweep):
    """The sweep over the target sum_t scale_t log f_t(h), each f_t any object with ``n_units`` and
    ``log_prob(h) -> [chains]`` (``LogDensity``);
    a ``nvil.mcmc.base.ChibKernel`` whose state is h [chains, n_units]. ``reverse``: the direction of ``step``, a
    bool or a [chains] bool tensor (True: T~, units M..1)."""

    def __init__(self, terms: list, reverse=False) -> None:
        self.terms = terms
        self.n_units = terms[0][1].n_units
        self.reversed = reverse

    def oriented(self, backward) -> "FlipGibbs":
        """This sweep with chain c going backward (T~) where ``backward[c]``."""
        return FlipGibbs(self.terms, backward)

    def log_prob(self, h: torch.Tensor) -> torch.Tensor:
        """The (unnormalised) target log f(h)."""
        return sum(scale * d.log_prob(h) for scale, d in self.terms if scale != 0)

    @torch.no_grad()
    def sweep(self, h: torch.Tensor, *, reverse=False, generator=None, force: torch.Tensor | None = None,
              argmax: bool = False, beta=1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """One sweep from h: (new h, sum_j log P(chosen h_j | rest)) at the target f^beta (``beta`` a float or
        [chains]); ``force``: the states to move to (their log T), ``argmax``: each unit to its likelier value."""
        h = h.clone()
        n = self.n_units
        picks = force if force is not None else None if argmax else torch.rand(
            h.shape, generator=generator, device=h.device, dtype=h.dtype)
        beta = None if untempered(beta) else torch.as_tensor(beta, dtype=torch.float64, device=h.device)
        current = self.log_prob(h).double()
        logits = torch.empty(h.shape, dtype=torch.float64, device=h.device)
        per_chain = torch.is_tensor(reverse)
        rows = torch.arange(h.shape[0], device=h.device)
        for i in range(n):
            j = torch.where(reverse, n - 1 - i, i) if per_chain else torch.full_like(rows, n - 1 - i if reverse else i)
            h_j = h[rows, j]
            flipped = h.clone()
            flipped[rows, j] = 1 - h_j
            log_f_flip = self.log_prob(flipped).double()
            logit = torch.where(h_j > 0, current - log_f_flip, log_f_flip - current)  # log f(h_j=1) - log f(h_j=0)
            if beta is not None:
                logit = beta * logit
            if force is not None:
                new = force[rows, j]
            elif argmax:
                new = (logit > 0).to(h.dtype)
            else:
                new = (picks[rows, j] < torch.sigmoid(logit).to(h.dtype)).to(h.dtype)
            moved = new != h_j
            current = torch.where(moved, log_f_flip, current)
            h[rows, j] = new
            logits[rows, j] = logit
        return h, F.logsigmoid(torch.where(h > 0, logits, -logits)).sum(-1)


class LogDensity:
    """log f(h) for h [chains, n_units] from a function: a term of ``FlipGibbs``'s target."""

    def __init__(self, log_prob, n_units: int) -> None:
        self.log_prob, self.n_units = log_prob, n_units


def site_gibbs(terms: list, accel: str = "none", reverse=False):
    """The sequential-Gibbs kernel on sum_t scale_t log f_t: ``SequentialGibbs`` (conditionals from the structure,
    swept in C or Triton by ``accel``) where every f_t is a ``BinaryDensity``, else ``FlipGibbs``."""
    if all(isinstance(d, BinaryDensity) for _, d in terms):
        return SequentialGibbs(terms, reverse, accel)
    return FlipGibbs(terms, reverse)
