"""Single-site Gibbs over binary latent units, with the transition probability it needs for Chib.

The target is a weighted sum of ``BinaryDensity`` log densities, log f(h) = sum_t scale_t log f_t(h)
(scale 1 on log P(v, h) for Chib and the harmonic mean; (1 - beta) log Q + beta log P* for AIS). One
sweep visits the units in index order, j = 1..M, and draws h_j from

    P(h_j = 1 | h_-j) = sigmoid(sum_t scale_t Delta_tj(h)),

with Delta_tj the change of log f_t when h_j flips (``models.binary_density``). The running fields
(u + (J + J')h and a_f = h M_f + c_f) are updated by one rank-1 step per flip, so a sweep costs about one
matmul per chain, never a re-evaluation of the whole density per unit; they are recomputed from h at the
start of each sweep so float32 rounding cannot drift.

Each single-site update satisfies detailed balance, so the reverse operator T~ is the same updates in
the opposite order (Murray & Salakhutdinov 2009, Sec. 2.3): ``reverse=True``, or a [chains] bool tensor
for a per-chain direction. With ``force=h_star`` a sweep sets each unit to h*_j instead of sampling and
returns log T(h* <- h) = sum_j log P(h*_j | h*_1..j-1, h_j+1..M) (their Eq. 11); with ``argmax=True`` it
sets each unit to its more probable value (the deterministic hill-climbing that finds a local mode).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from models.binary_density import BinaryDensity
from nvil.mcmc.base import untempered


class _Fields:
    """The running fields of one density for the current h: r = u + (J + J')h, and per softplus factor its
    input a = h M + c and total S = sum_k softplus(a_k). A flip of unit j moves a to a' = a + (1 - 2 h_j) M_j,
    so Delta_j needs one softplus per factor element, sum softplus(a'), and S stands in for the other side."""

    def __init__(self, d: BinaryDensity, h: torch.Tensor) -> None:
        self.d = d
        self.r = d.u + h @ d.J_sym if d.J_sym is not None else d.u
        self.a = [h @ f.M + f.c for f in d.factors]
        self.total = [F.softplus(a).sum(-1) for a in self.a]
        self.pending: list = []

    def log_odds(self, j, h_j: torch.Tensor) -> torch.Tensor:
        per_chain = torch.is_tensor(j)
        delta = self.r.gather(1, j[:, None]).squeeze(1) if per_chain else self.r[:, j]
        self.pending = []
        sign_j = 2 * h_j - 1  # +1 where h_j = 1: a is the "on" input and a' the "off" one
        for k, f in enumerate(self.d.factors):
            if not per_chain and not f.lo <= j < f.hi:
                continue
            m = f.M[j]  # [K], or [chains, K] per chain
            flipped_total = F.softplus(self.a[k] - sign_j[:, None] * m).sum(-1)
            delta = delta + f.sign * sign_j * (self.total[k] - flipped_total)
            self.pending.append((k, m, flipped_total))
        return delta

    def set(self, j, change: torch.Tensor, h_new: torch.Tensor) -> None:
        if self.d.J_sym is not None:
            col = self.d.J_sym[j]  # [M], or [chains, M]
            self.r = self.r + change[:, None] * col
        for k, m, flipped_total in self.pending:
            self.a[k] = self.a[k] + change[:, None] * m
            self.total[k] = torch.where(change != 0, flipped_total, self.total[k])


class SequentialGibbs:
    """The sweep as a kernel (``nvil.mcmc.base.ChibKernel``); its state is h itself, [chains, units].
    ``reverse``: the direction of ``step``, a bool or a [chains] bool tensor (True: T~, units M..1)."""

    def __init__(self, terms: list[tuple[float, BinaryDensity]], reverse=False) -> None:
        self.terms = terms
        self.n_units = terms[0][1].n_units
        self.reversed = reverse

    def init(self, x: torch.Tensor, generator=None) -> torch.Tensor:
        return x.clone()

    def reverse(self) -> "SequentialGibbs":
        return self.oriented(~self.reversed if torch.is_tensor(self.reversed) else not self.reversed)

    def oriented(self, backward) -> "SequentialGibbs":
        """This sweep with chain c going backward (T~) where ``backward[c]``."""
        return SequentialGibbs(self.terms, backward)

    def step(self, h: torch.Tensor, beta=1.0, generator=None) -> tuple[torch.Tensor, dict]:
        """h' ~ T(. <- h) at the tempered target f^beta, each chain in its own direction."""
        return self.sweep(h, reverse=self.reversed, generator=generator, beta=beta)[0], {}

    def log_prob(self, h: torch.Tensor) -> torch.Tensor:
        """The (unnormalised) target log f(h)."""
        return sum(scale * d.log_prob(h) for scale, d in self.terms)

    @torch.no_grad()
    def sweep(self, h: torch.Tensor, *, reverse=False, generator=None, force: torch.Tensor | None = None,
              argmax: bool = False, beta=1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """One sweep from h: (new h, sum_j log P(chosen h_j | rest)), batched over chains, at the target f^beta
        (``beta`` a float or [chains])."""
        h = h.clone()
        n = self.n_units
        fields = [(scale, _Fields(d, h)) for scale, d in self.terms if scale != 0]
        uniform = None if force is not None or argmax else torch.rand(h.shape, generator=generator, device=h.device, dtype=h.dtype)
        log_t = torch.zeros(h.shape[0], dtype=h.dtype, device=h.device)
        per_chain = torch.is_tensor(reverse)
        for i in range(n):
            j = torch.where(reverse, n - 1 - i, i) if per_chain else (n - 1 - i if reverse else i)
            h_j = h.gather(1, j[:, None]).squeeze(1) if per_chain else h[:, j]
            logit = sum(scale * fl.log_odds(j, h_j) for scale, fl in fields)
            if not untempered(beta):
                logit = beta * logit
            if force is not None:
                new = force.gather(1, j[:, None]).squeeze(1) if per_chain else force[:, j]
            elif argmax:
                new = (logit > 0).to(h.dtype)
            else:
                u = uniform.gather(1, j[:, None]).squeeze(1) if per_chain else uniform[:, j]
                new = (u < torch.sigmoid(logit)).to(h.dtype)
            log_t = log_t + torch.where(new > 0, F.logsigmoid(logit), F.logsigmoid(-logit))
            change = new - h_j
            for _, fl in fields:
                fl.set(j, change, new)
            if per_chain:
                h.scatter_(1, j[:, None], new[:, None])
            else:
                h[:, j] = new
        return h, log_t

    def log_transition(self, to: torch.Tensor, frm: torch.Tensor) -> torch.Tensor:
        """log T(to <- frm) of one forward sweep (Murray & Salakhutdinov 2009, Eq. 11)."""
        return self.sweep(frm, force=to)[1]

    def hill_climb(self, h: torch.Tensor, max_sweeps: int = 100, on_sweep=None) -> tuple[torch.Tensor, int]:
        """Deterministic coordinate ascent in log f from h to a local mode (every unit at its more probable
        value given the rest). Returns (mode, sweeps used). ``on_sweep(sweeps so far)`` after each sweep
        (progress: a climb can take as long as the Chib steps after it)."""
        for sweep in range(1, max_sweeps + 1):
            new, _ = self.sweep(h, argmax=True)
            if on_sweep is not None:
                on_sweep(sweep)
            if torch.equal(new, h):
                return new, sweep
            h = new
        return h, max_sweeps
