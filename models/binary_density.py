"""Log densities over binary latent vectors in the one form that single-site Gibbs can update cheaply.

Every binary belief net's log P(v, h) for a fixed v, its inference network's log Q(h | v), and a DBN's
log P*(v, h_1) with the top layer summed out are all of the form

    log f(h) = const + h'u + h'J h + sum_f s_f sum_k softplus((h M_f)_k + c_fk),    h in {0, 1}^M,

because log Bernoulli(t; sigmoid(a)) = t a - softplus(a) and every logit a is linear in h: u collects the
terms linear in h (biases, W'v), J the products of two latent units (a layer's logits times its own
units; zero diagonal), and each softplus factor one layer's log-normaliser (s_f = -1) or a summed-out
RBM layer (s_f = +1, -F_top). Flipping unit j then changes log f by

    u_j + (J + J')_j h + sum_f s_f sum_k [softplus(a_fk + (1 - h_j) M_fjk) - softplus(a_fk - h_j M_fjk)],

which costs O(M + K) given the running fields a_f = h M_f + c_f: the incremental update
``nvil.mcmc.sequential_gibbs`` uses. Tensors u, const and c_f carry one row per chain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from nvil.core.errors import ConfigError


@dataclass
class SoftplusFactor:
    M: torch.Tensor  # [units, K], zero outside rows lo..hi-1
    c: torch.Tensor  # [chains, K]
    sign: float
    lo: int
    hi: int
    _tables: dict = field(default_factory=dict, repr=False, compare=False)

    def flip_tables(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(exp(M), exp(-M), levels), cached per dtype (so M must not change afterwards): the factors by which
        a flip of unit j multiplies exp(a), for the running-probability form of Delta_j in
        ``nvil.mcmc.sequential_gibbs``, in ``dtype`` (float64 where exp(|M|) would leave ``dtype``'s range).
        ``levels``: sum_k log(den_k) may take one log per product of 2^levels of its K terms (each den_k lies in
        [exp(-|M_jk|), exp(|M_jk|)], so 2^levels of them stay well inside the dtype's range; at most 3, K
        divisible by 2^levels)."""
        if dtype not in self._tables:
            reach = self.reach()
            work = dtype if reach < 0.5 * math.log(torch.finfo(dtype).max) else torch.float64
            room = -0.5 * math.log(torch.finfo(work).tiny)
            levels = 0
            while levels < 3 and self.M.shape[1] % 2 ** (levels + 1) == 0 and 2 ** (levels + 1) * reach <= room:
                levels += 1
            M = self.M.to(work)
            self._tables[dtype] = (torch.exp(M), torch.exp(-M), levels)
        return self._tables[dtype]

    def reach(self) -> float:
        """max |M|: how far one flip can move any a_k (cached, so M must not change afterwards)."""
        if "reach" not in self._tables:
            self._tables["reach"] = self.M.abs().max().item() if self.M.numel() else 0.0
        return self._tables["reach"]

    def products_per_log(self, dtype: torch.dtype, most: int = 64) -> int:
        """How many den_k of one flip (each in [exp(-|M|), exp(|M|)]) may be multiplied before taking a log with the
        product still well inside ``dtype``'s normal range (the native sweep's running products; at most ``most``)."""
        key = ("products_per_log", dtype)
        if key not in self._tables:
            reach = self.reach()
            room = 0.9 * min(math.log(torch.finfo(dtype).max), -math.log(torch.finfo(dtype).tiny))
            self._tables[key] = int(max(1, min(most, room // reach if reach > 0 else most)))
        return self._tables[key]


@dataclass
class BinaryDensity:
    n_units: int
    u: torch.Tensor  # [chains, units]
    const: torch.Tensor  # [chains]
    J: torch.Tensor | None = None  # [units, units], zero diagonal
    factors: list[SoftplusFactor] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.J_sym = None if self.J is None else self.J + self.J.T

    def log_prob(self, h: torch.Tensor) -> torch.Tensor:
        out = self.const + (h * self.u).sum(-1)
        if self.J is not None:
            out = out + ((h @ self.J) * h).sum(-1)
        for f in self.factors:
            out = out + f.sign * F.softplus(h @ f.M + f.c).sum(-1)
        return out

    def repeat_interleave(self, runs: int) -> "BinaryDensity":
        """Each example's density repeated ``runs`` times: chains = examples x runs, example-major."""
        rep = lambda t: t.repeat_interleave(runs, 0)  # noqa: E731
        factors = [SoftplusFactor(f.M, rep(f.c), f.sign, f.lo, f.hi) for f in self.factors]
        return BinaryDensity(self.n_units, rep(self.u), rep(self.const), self.J, factors)


class DensityBuilder:
    """Assembles a ``BinaryDensity`` from Bernoulli terms log Bernoulli(target; sigmoid(logits)), with the
    latent units laid out as consecutive slices (layer 1 first)."""

    def __init__(self, n_units: int, chains: int, like: torch.Tensor) -> None:
        self.n_units = n_units
        self.u = torch.zeros(chains, n_units, dtype=like.dtype, device=like.device)
        self.const = torch.zeros(chains, dtype=like.dtype, device=like.device)
        self.J: torch.Tensor | None = None
        self.factors: list[SoftplusFactor] = []

    def _pairwise(self) -> torch.Tensor:
        if self.J is None:
            self.J = torch.zeros(self.n_units, self.n_units, dtype=self.u.dtype, device=self.u.device)
        return self.J

    def bernoulli(self, target, bias: torch.Tensor, sources: list[tuple[slice, torch.Tensor]] = ()) -> None:
        """Add log Bernoulli(target; sigmoid(bias + sum_src W_src h_src)) summed over the target's units.

        ``target`` is a latent slice or a fixed tensor [chains, K] (the visibles); ``bias`` is [K] or
        [chains, K]; each source is (latent slice, W [K, |slice|]). A source may be the target slice
        itself with a strictly lower-triangular W (an autoregressive layer)."""
        bias = bias.expand(self.u.shape[0], -1)
        k = bias.shape[-1]
        if sources:
            M = torch.zeros(self.n_units, k, dtype=self.u.dtype, device=self.u.device)
            for sl, W in sources:
                M[sl] += W.T
            lo, hi = min(sl.start for sl, _ in sources), max(sl.stop for sl, _ in sources)
            self.factors.append(SoftplusFactor(M, bias, -1.0, lo, hi))
        else:
            self.const -= F.softplus(bias).sum(-1)
        if isinstance(target, slice):  # t'(bias + sum W h) with t = h[target]
            self.u[:, target] += bias
            for sl, W in sources:
                if sl == target and torch.any(torch.diagonal(W) != 0):
                    raise ValueError("an autoregressive layer's weights must be strictly lower-triangular")
                self._pairwise()[target, sl] += W
        else:  # fixed target x: x'bias + x'W h
            self.const += (target * bias).sum(-1)
            for sl, W in sources:
                self.u[:, sl] += target @ W

    def softplus_factor(self, sl: slice, W: torch.Tensor, c: torch.Tensor, sign: float) -> None:
        """Add sign * sum_k softplus(c_k + (h[sl] W)_k), W [|sl|, K] (an RBM layer summed out)."""
        M = torch.zeros(self.n_units, W.shape[1], dtype=self.u.dtype, device=self.u.device)
        M[sl] = W
        self.factors.append(SoftplusFactor(M, c.expand(self.u.shape[0], -1), sign, sl.start, sl.stop))

    def linear(self, sl: slice, coef: torch.Tensor) -> None:
        self.u[:, sl] += coef

    def build(self) -> BinaryDensity:
        return BinaryDensity(self.n_units, self.u, self.const, self.J, self.factors)


def layer_slices(layers: list[int]) -> list[slice]:
    out, start = [], 0
    for n in layers:
        out.append(slice(start, start + n))
        start += n
    return out


def require_bernoulli_visibles(model) -> None:
    if getattr(model, "visible", "bernoulli") != "bernoulli":
        raise ConfigError("the Gibbs-based estimators (ais_posterior, chib, harmonic) need Bernoulli visibles; "
                          "for multinomial visibles use estimator=iwae")
