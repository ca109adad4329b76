"""Single-site Gibbs over binary latent units, with the transition probability it needs for Chib.

The target is a weighted sum of ``BinaryDensity`` log densities, log f(h) = sum_t scale_t log f_t(h)
(scale 1 on log P(v, h) for Chib and the harmonic mean; (1 - beta) log Q + beta log P* for AIS). One
sweep visits the units in index order, j = 1..M, and draws h_j from

    P(h_j = 1 | h_-j) = sigmoid(sum_t scale_t Delta_tj(h)),

with Delta_tj the change of log f_t when h_j flips (``nvil.models.binary_density``). The running fields are
updated in place after each flip, batched over chains, so a sweep never re-evaluates a density per unit;
they are recomputed from h at the start of each sweep so rounding cannot drift from one sweep to the next.
The quadratic term keeps r = u + (J + J')h (a rank-1 step per flip). A softplus factor keeps, instead of its
input a = h M + c, the probabilities p = sigmoid(a) and s = sigmoid(-a): a flip moving a_k by m_k changes
softplus(a_k) by log(s_k + p_k e^{m_k}) (a sum of two positive terms, exact to rounding for any a), and
moves p_k to p_k e^{m_k} / (s_k + p_k e^{m_k}), s_k to s_k / (s_k + p_k e^{m_k}). So Delta_j costs a
multiply, an add and a fraction of a log per factor element, where softplus(a +- m) costs an exp and a log1p;
the K logs are further cut to K / 2^levels by multiplying 2^levels of the den_k first (``flip_tables``).
``unit_update`` is that whole single-site update (log-odds, choice, moves) as one function of tensors:
eager by default (updating only the rows of the chains that are on / flipped), or with ``accel="compile"``
(``nvil.backend.accel``) one fused kernel per unit, compiled once per kind of sweep (sample, force, argmax), or with
``accel="native"`` the whole sweep as one C call (``nvil.backend.native``, CPU; ``native_sweep``), the same arithmetic.

Each single-site update satisfies detailed balance, so the reverse operator T~ is the same updates in
the opposite order (Murray & Salakhutdinov 2009, Sec. 2.3): ``reverse=True``, or a [chains] bool tensor
for a per-chain direction. With ``force=h_star`` a sweep sets each unit to h*_j instead of sampling and
returns log T(h* <- h) = sum_j log P(h*_j | h*_1..j-1, h_j+1..M) (their Eq. 11); with ``argmax=True`` it
sets each unit to its more probable value (the deterministic hill-climbing that finds a local mode).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nvil.backend import native
from nvil.backend.accel import accelerate
from nvil.backend.native import triton_sweep
from nvil.mcmc.base import untempered
from nvil.models.binary_density import BinaryDensity


def log_prod_sum(den: torch.Tensor, levels: int) -> torch.Tensor:
    """sum_k log(den_k) over the last dimension of a [chains, K] tensor, as the logs of products of 2^levels
    terms, halving ``levels`` times (contiguous halves: compiled, this fuses into one loop, where a product over
    a middle dimension of a view does not)."""
    for _ in range(levels):
        half = den.shape[-1] // 2
        den = den[:, :half] * den[:, half:]
    return torch.log(den).sum(-1)


def unit_update(base, h_j, pick, mode: str, beta, coefs, ps, ss, ups, downs, levels: tuple):
    """The single-site update of unit j in every chain: its log-odds base - sign_j sum_f coef_f gain_f (base: the
    terms' weighted r_j; gain_f = sum_k softplus(a'_k) - softplus(a_k) = sum_k log(s_k + p_k e^{m_k}), m = M_j
    where h_j = 0 and -M_j where h_j = 1, ``ups`` / ``downs`` the rows exp(+-M_j)), tempered by ``beta``; the new
    h_j (``mode``: ``sample`` u < sigmoid(logit) with ``pick`` = u, ``force`` ``pick`` itself, ``argmax``); and
    p, s moved where h_j flipped. Returns (new h_j, logit, ps, ss). A function of tensors (``nvil.backend.accel``)."""
    on = (h_j > 0)[:, None]
    sign_j = 2 * h_j - 1  # +1 where h_j = 1: the flip turns unit j off
    logit, moves = base, []
    for i in range(len(ps)):
        p_e = times_row(ps[i], on, downs[i], ups[i])
        den = p_e + ss[i]
        logit = logit - coefs[i] * sign_j * log_prod_sum(den, levels[i]).to(base.dtype)
        moves.append((p_e, den))
    if beta is not None:
        logit = beta * logit
    if mode == "force":
        new = pick
    elif mode == "argmax":
        new = (logit > 0).to(h_j.dtype)
    else:
        new = (pick < torch.sigmoid(logit)).to(h_j.dtype)
    flipped = (new != h_j)[:, None]
    moved = [move_rows(flipped, ps[i], ss[i], p_e, den) for i, (p_e, den) in enumerate(moves)]
    return new, logit, [p for p, _ in moved], [s for _, s in moved]


def times_row(p: torch.Tensor, on: torch.Tensor, down: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """p * (down where ``on`` else up), ``on`` [chains, 1]: one fused select when compiled; eagerly, a product
    with ``up`` redone for the chains that are on (a broadcast select is slow on the CPU)."""
    if torch.compiler.is_compiling():
        return p * torch.where(on, down, up)
    out = p * up
    rows = on.squeeze(1).nonzero().squeeze(1)
    return out.index_copy_(0, rows, p.index_select(0, rows) * (down.index_select(0, rows) if down.dim() == 2 else down))


def move_rows(flipped: torch.Tensor, p: torch.Tensor, s: torch.Tensor, p_e: torch.Tensor, den: torch.Tensor):
    """(p, s) with p <- p e^m / den and s <- s / den in the chains that flipped (eagerly: in place, their rows)."""
    if torch.compiler.is_compiling():
        return torch.where(flipped, p_e / den, p), torch.where(flipped, s / den, s)
    rows = flipped.squeeze(1).nonzero().squeeze(1)
    den = den.index_select(0, rows)
    return (p.index_copy_(0, rows, p_e.index_select(0, rows).div_(den)),
            s.index_copy_(0, rows, s.index_select(0, rows).div_(den)))


_UNIT_UPDATE = {"none": unit_update}


def native_sweep(fields: list["_Fields"], h: torch.Tensor, reverse, picks, mode: str, beta,
                 kernel=native.sequential_sweep) -> torch.Tensor | None:
    """The sweep of ``SequentialGibbs.sweep`` as one call of a whole-sweep kernel (``nvil.backend.native``'s C on the CPU,
    ``nvil.backend.native.triton_sweep`` on CUDA): the terms' quadratic fields summed (r = sum_t scale_t (u_t + J_t h),
    J = sum_t scale_t J_t), every active softplus factor with coef = scale_t sign_f. Updates h in place and returns
    the per-unit logits; None where a flip table is kept in a wider dtype than h (|M| too large for it), with no
    terms, or where the kernel declines (returns False), all of which the eager sweep handles."""
    if not fields:
        return None
    factors = []
    for fl in fields:
        for k, f in enumerate(fl.d.factors):
            up, down, _ = fl.tables[k]
            if up.dtype != h.dtype:
                return None
            factors.append((fl.p[k], fl.s[k], up, down, f.lo, f.hi, f.products_per_log(h.dtype), fl.scale * f.sign))
    r = sum(fl.scale * fl.r for fl in fields).expand_as(h).contiguous()
    Js = [fl.scale * fl.d.J_sym for fl in fields if fl.d.J_sym is not None]
    chains = h.shape[0]
    if torch.is_tensor(reverse):
        reverse = reverse.to(torch.uint8).expand(chains).contiguous()
    else:
        reverse = torch.full((chains,), int(bool(reverse)), dtype=torch.uint8, device=h.device)
    if beta is not None:
        beta = beta.to(h.dtype).expand(chains).contiguous()
    logits = torch.empty_like(h)
    done = kernel(h, r, mode=mode, picks=None if picks is None else picks.to(h.dtype).contiguous(), beta=beta,
                  reverse=reverse, logits=logits, J=sum(Js).contiguous() if Js else None, factors=factors)
    return None if done is False else logits


class _Fields:
    """The running fields of one density for the current h: r = u + (J + J')h, and per softplus factor
    p = sigmoid(h M + c) and s = sigmoid(-(h M + c)), with its flip tables exp(+-M)."""

    def __init__(self, scale: float, d: BinaryDensity, h: torch.Tensor) -> None:
        self.scale, self.d = scale, d
        self.r = d.u + h @ d.J_sym if d.J_sym is not None else d.u
        self.tables = [f.flip_tables(h.dtype) for f in d.factors]
        a = [(h @ f.M + f.c).to(t[0].dtype) for f, t in zip(d.factors, self.tables)]
        self.p = [torch.sigmoid(x) for x in a]
        self.s = [torch.sigmoid(-x) for x in a]

    def active(self, j) -> list[int]:
        """The factors unit j enters (every one when j differs between chains)."""
        return [k for k, f in enumerate(self.d.factors) if torch.is_tensor(j) or f.lo <= j < f.hi]


class SiteSweep:
    """What every single-site sweep kernel derives from its ``sweep``, ``oriented`` and ``reversed``: the
    ``nvil.mcmc.base.ChibKernel`` methods (``SequentialGibbs`` here, ``nvil.mcmc.flip_gibbs.FlipGibbs``)."""

    def init(self, x: torch.Tensor, generator=None) -> torch.Tensor:
        return x.clone()

    def reverse(self):
        return self.oriented(~self.reversed if torch.is_tensor(self.reversed) else not self.reversed)

    def step(self, h: torch.Tensor, beta=1.0, generator=None) -> tuple[torch.Tensor, dict]:
        """h' ~ T(. <- h) at the tempered target f^beta, each chain in its own direction."""
        return self.sweep(h, reverse=self.reversed, generator=generator, beta=beta)[0], {}

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


class SequentialGibbs(SiteSweep):
    """The sweep as a kernel (``nvil.mcmc.base.ChibKernel``); its state is h itself, [chains, units].
    ``reverse``: the direction of ``step``, a bool or a [chains] bool tensor (True: T~, units M..1)."""

    def __init__(self, terms: list[tuple[float, BinaryDensity]], reverse=False, accel: str = "none") -> None:
        self.terms = terms
        self.n_units = terms[0][1].n_units
        self.reversed = reverse
        self.accel = accel
        if accel not in _UNIT_UPDATE:
            _UNIT_UPDATE[accel] = accelerate(unit_update, accel)
        self.unit = _UNIT_UPDATE[accel]

    def oriented(self, backward) -> "SequentialGibbs":
        """This sweep with chain c going backward (T~) where ``backward[c]``."""
        return SequentialGibbs(self.terms, backward, self.accel)

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
        fields = [_Fields(scale, d, h) for scale, d in self.terms if scale != 0]
        mode = "force" if force is not None else "argmax" if argmax else "sample"
        picks = force if force is not None else None if argmax else torch.rand(
            h.shape, generator=generator, device=h.device, dtype=h.dtype)
        beta = None if untempered(beta) else torch.as_tensor(beta, dtype=h.dtype, device=h.device)
        kernel = triton_sweep.sequential_sweep if triton_sweep.wanted(self.accel, h.device) else (
            native.sequential_sweep if native.wanted(self.accel, h.device) else None)
        if kernel is not None:
            logits = native_sweep(fields, h, reverse, picks, mode, beta, kernel)
            if logits is not None:
                return h, F.logsigmoid(torch.where(h > 0, logits, -logits)).sum(-1)
        coefs = {}  # per set of active factors: scale_t * sign_f, one tensor (no recompilation as scales change)
        logits = torch.empty_like(h)  # log P(h_j = 1 | rest) - log P(h_j = 0 | rest), for log T at the end
        per_chain = torch.is_tensor(reverse)
        for i in range(n):
            j = torch.where(reverse, n - 1 - i, i) if per_chain else (n - 1 - i if reverse else i)
            col = j[:, None] if per_chain else None
            at = (lambda t: t.gather(1, col).squeeze(1)) if per_chain else (lambda t: t[:, j])  # noqa: E731
            row = (lambda t: t.index_select(0, j)) if per_chain else (lambda t: t[j])  # noqa: E731
            active = [(fl, k) for fl in fields for k in fl.active(j)]
            key = tuple((id(fl), k) for fl, k in active)
            if key not in coefs:
                coefs[key] = torch.tensor([fl.scale * fl.d.factors[k].sign for fl, k in active], dtype=h.dtype,
                                          device=h.device)
            h_j = at(h)
            base = sum(fl.scale * at(fl.r) for fl in fields)
            pick = None if picks is None else at(picks)
            new, logit, ps, ss = self.unit(
                base, h_j, pick, mode, beta, coefs[key], [fl.p[k] for fl, k in active], [fl.s[k] for fl, k in active],
                [row(fl.tables[k][0]) for fl, k in active], [row(fl.tables[k][1]) for fl, k in active],
                tuple(fl.tables[k][2] for fl, k in active))
            for (fl, k), p, s in zip(active, ps, ss):
                fl.p[k], fl.s[k] = p, s
            for fl in fields:
                if fl.d.J_sym is not None:
                    fl.r = torch.addcmul(fl.r, (new - h_j)[:, None], row(fl.d.J_sym))
            if per_chain:
                h.scatter_(1, col, new[:, None])
                logits.scatter_(1, col, logit[:, None])
            else:
                h[:, j] = new
                logits[:, j] = logit
        return h, F.logsigmoid(torch.where(h > 0, logits, -logits)).sum(-1)
