"""Deep Boltzmann machines (Salakhutdinov & Hinton 2009): binary layers v = h_0, h_1, ..., h_L, each joined only to
its neighbours,

    E(v, h) = -sum_l h_{l-1}' W_l h_l - b'v - sum_l c_l' h_l,        p(v, h) = exp(-E) / Z.

No layer touches another of its own parity, so a DBM is an RBM between its even layers x = [v, h_2, h_4, ...] and its
odd layers y = [h_1, h_3, ...], with the blocks of layers that are not neighbours held at zero (``top``). That view
gives the rest:

- the odd layers sum out analytically: p*(x) = exp(-F(x)), F the free energy of ``top``; for two layers,
  log p*(v, h_2) = b'v + c_2'h_2 + sum_j softplus(c_1j + (v'W_1)_j + (W_2 h_2)_j) (Salakhutdinov & Hinton 2009,
  Sec. 3.2: AIS over (v, h_2) with h_1 summed out), and Z is ``top``'s partition function;
- block Gibbs alternates odd | even and even | odd (``top``'s own sweep); tempered transitions run on ``top``;
- per test case the latent units are the even hidden layers (``layers``): log p*(v, h_even) is a ``BinaryDensity``
  (``latent_density``), so the Chib-style estimator and per-example AIS sum over them with h_odd summed out.

Mean-field inference (their Sec. 3.1) q(h) = prod_l prod_j Bernoulli(mu_lj) with the fixed point
mu_l = sigmoid(W_l' mu_{l-1} + W_{l+1} mu_{l+1} + c_l) (``mean_field``) gives the variational bound
log p(v) >= -E(v, mu) + H(mu) - log Z (``variational_bound``: E is linear in each layer and q factorises, so
E_q[E(v, h)] = E(v, mu)).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from nvil.backend.native.bernoulli_log_prob import bernoulli_log_prob
from nvil.models.binary_density import BinaryDensity, DensityBuilder
from nvil.models.protocol import BINARY_LATENTS, TOP_MACHINE, VARIATIONAL_BOUND
from nvil.models.rbm import BoltzmannMachine
from nvil.models.visible import Bernoulli, bernoulli_sample


def binary_entropy(mu: torch.Tensor) -> torch.Tensor:
    """sum_j H(Bernoulli(mu_j)) over the last dimension."""
    return -(torch.special.xlogy(mu, mu) + torch.special.xlogy(1 - mu, 1 - mu)).sum(-1)


class DBM(nn.Module):
    capabilities = frozenset({TOP_MACHINE, VARIATIONAL_BOUND, BINARY_LATENTS})
    data_support = "binary"
    visible_layer = Bernoulli()

    def __init__(self, n_visible: int, sizes: list[int]) -> None:
        super().__init__()
        if len(sizes) < 2:
            raise ValueError("a DBM needs at least two hidden layers (one is an RBM: model=rbm)")
        self.n_visible = int(n_visible)
        self.sizes = [int(n) for n in sizes]
        widths = [self.n_visible] + self.sizes
        self.offsets = []  # layer l -> (parity, start) in x (even) or y (odd)
        ends = [0, 0]
        for l, n in enumerate(widths):
            self.offsets.append((l % 2, ends[l % 2]))
            ends[l % 2] += n
        self.top = BoltzmannMachine(ends[0], ends[1])
        mask = torch.zeros(ends[0], ends[1])
        for l in range(1, len(widths)):
            mask[self.block(l)] = 1.0
        self.register_buffer("mask", mask)
        with torch.no_grad():
            self.top.W.mul_(mask)

    # ---- layout -----------------------------------------------------------------------------------------
    @property
    def widths(self) -> list[int]:
        return [self.n_visible] + self.sizes

    def span(self, l: int) -> slice:
        """Layer l's units inside x (l even) or y (l odd)."""
        start = self.offsets[l][1]
        return slice(start, start + self.widths[l])

    def block(self, l: int) -> tuple[slice, slice]:
        """The rows and columns of ``top.W`` that hold W_l (between layers l - 1 and l): W_l itself when l is odd,
        its transpose when l is even."""
        lo, hi = (l - 1, l) if l % 2 else (l, l - 1)
        return self.span(lo), self.span(hi)

    def weight(self, l: int) -> torch.Tensor:
        """W_l [n_{l-1}, n_l] (a view of ``top.W``)."""
        w = self.top.W[self.block(l)]
        return w if l % 2 else w.T

    def bias(self, l: int) -> torch.Tensor:
        """b (l = 0) or c_l (a view of ``top.b`` or ``top.c``)."""
        return (self.top.b if l % 2 == 0 else self.top.c)[self.span(l)]

    @property
    def layers(self) -> list[int]:
        """The latent layers an estimator sums over per test case: the even hidden layers h_2, h_4, ... (the odd
        ones are summed out analytically)."""
        return self.widths[2::2]

    @property
    def n_latent(self) -> int:
        return sum(self.layers)

    def join(self, v: torch.Tensor, h_even: torch.Tensor) -> torch.Tensor:
        """x = [v, h_2, h_4, ...] from v and the even hidden layers side by side (leading dimensions broadcast)."""
        lead = torch.broadcast_shapes(v.shape[:-1], h_even.shape[:-1])
        return torch.cat([v.expand(*lead, -1), h_even.to(v.dtype).expand(*lead, -1)], -1)

    @torch.no_grad()
    def constrain_(self) -> None:
        """Hold the blocks of layers that are not neighbours at zero (after a parameter update)."""
        self.top.W.mul_(self.mask)

    @torch.no_grad()
    def init_visible_bias(self, train_mean: torch.Tensor, eps: float = 1e-3) -> None:
        self.bias(0).copy_(self.visible_layer.bias_from_mean(train_mean.to(self.top.b), eps))

    def filters(self) -> torch.Tensor:
        return self.weight(1).detach().T

    # ---- energies ---------------------------------------------------------------------------------------
    def energy(self, mus: list[torch.Tensor]) -> torch.Tensor:
        """E(h_0, ..., h_L) for states (or mean-field means) of every layer, v first."""
        x = torch.cat([mus[l] for l in range(0, len(mus), 2)], -1)
        y = torch.cat([mus[l] for l in range(1, len(mus), 2)], -1)
        return self.top.energy(x, y)

    def log_joint(self, v: torch.Tensor, hs: list[torch.Tensor]) -> torch.Tensor:
        """log p*(v, h_even) = -F_top([v, h_even]) (odd layers summed out); subtract log Z for log p."""
        return -self.top.free_energy(self.join(v, torch.cat(hs, -1)))

    def latent_density(self, v: torch.Tensor) -> BinaryDensity:
        """log p*(v, h_even) for fixed v [chains, n_visible] as a ``BinaryDensity`` over h_even: b'v, the even
        biases, and one softplus factor over the odd units, sum_k softplus(c_k + (v'W_v)_k + (h_even M)_k)."""
        n_v = self.n_visible
        d = DensityBuilder(self.n_latent, v.shape[0], v)
        d.const += v @ self.top.b[:n_v]
        everything = slice(0, self.n_latent)
        d.linear(everything, self.top.b[n_v:])
        d.softplus_factor(everything, self.top.W[n_v:], self.top.c + v @ self.top.W[:n_v], +1.0)
        return d.build()

    # ---- mean field -------------------------------------------------------------------------------------
    def layer_input(self, l: int, mus: list[torch.Tensor], from_v: torch.Tensor | None = None) -> torch.Tensor:
        """c_l + W_l' mu_{l-1} + W_{l+1} mu_{l+1} (the second term absent for the top layer); ``from_v``: layer 1's
        c_1 + W_1' v, which does not change while v is held fixed."""
        a = from_v if l == 1 and from_v is not None else self.bias(l) + mus[l - 1] @ self.weight(l)
        if l + 1 < len(mus):
            a = a + mus[l + 1] @ self.weight(l + 1).T
        return a

    def mean_field(self, v: torch.Tensor, max_iter: int = 50, tol: float = 1e-7, return_logits: bool = False,
                   omega: float | str = 1.0, return_sweeps: bool = False):
        """The mean-field fixed point [v, mu_1, ..., mu_L] (Salakhutdinov & Hinton 2009, Sec. 3.1): started from a
        bottom-up pass with each layer's input from below doubled (it will get as much from above), then layers
        updated in turn, bottom to top, until no mean moves by more than ``tol`` or ``max_iter`` sweeps. Each layer's
        logit a_l moves to its input, a_l <- a_l + omega (input_l - a_l): omega = 1 is the plain update (coordinate
        ascent on the bound); 1 < omega < 2 over-relaxes it (successive over-relaxation, which takes fewer sweeps
        to the same fixed point), and falls back to omega = 1 for the remaining sweeps as soon as the largest move
        grows from one sweep to the next. ``omega="auto"``: two plain sweeps, then Young's optimal over-relaxation
        for the contraction r they show (the ratio of their largest moves), omega = 2 / (1 + sqrt(1 - r)): close to 1
        where the plain update already converges fast, larger where it is slow. With ``return_logits`` the logits of
        the returned means come back instead of the means (v first); with ``return_sweeps``, (that list, the number
        of sweeps taken)."""
        auto = omega == "auto"
        if auto:
            omega = 1.0
        elif isinstance(omega, str) or not 0 < omega < 2:
            raise ValueError(f"the over-relaxation omega must lie in (0, 2) or be 'auto', got {omega!r}")
        L = len(self.sizes)
        mus, logits = [v], [v]
        v_w = v @ self.weight(1)
        from_v = self.bias(1) + v_w
        for l in range(1, L + 1):
            scale = 2.0 if l < L else 1.0
            up = v_w if l == 1 else mus[-1] @ self.weight(l)
            logits.append(self.bias(l) + scale * up)
            mus.append(torch.sigmoid(logits[-1]))
        last, sweeps = float("inf"), 0
        for sweep in range(max_iter):
            sweeps += 1
            moved = []
            for l in range(1, L + 1):
                target = self.layer_input(l, mus, from_v)
                logits[l] = target if omega == 1.0 else logits[l] + omega * (target - logits[l])
                new = torch.sigmoid(logits[l])
                moved.append((new - mus[l]).abs().amax() if new.numel() else new.new_zeros(()))
                mus[l] = new
            largest = torch.stack(moved).max().item()
            if largest < tol:
                break
            if largest > last:
                omega, auto = 1.0, False
            elif auto and sweep == 1:  # two plain sweeps: their contraction
                omega = 2.0 / (1.0 + math.sqrt(1.0 - min(largest / max(last, 1e-30), 0.99)))
            last = largest
        out = logits if return_logits else mus
        return (out, sweeps) if return_sweeps else out

    def variational_bound(self, v: torch.Tensor, mus: list[torch.Tensor] | None = None) -> torch.Tensor:
        """-E(v, mu) + H(q) <= log p*(v) for each row (subtract log Z for the bound on log p(v))."""
        mus = self.mean_field(v) if mus is None else mus
        return -self.energy(mus) + sum(binary_entropy(mu) for mu in mus[1:])

    @torch.no_grad()
    def top_data(self, v: torch.Tensor, batch_size: int = 5000) -> torch.Tensor:
        """Rows x = [v, mu_2, mu_4, ...] of ``top`` from data rows: the mean-field means of the even hidden layers
        (the base-rate marginals and the reverse chains' ``data`` starts of its log Z)."""
        out = []
        for s0 in range(0, v.shape[0], batch_size):
            x = v[s0:s0 + batch_size]
            x = x.to_dense() if x.is_sparse else x
            mus = self.mean_field(x)
            out.append(self.join(x, torch.cat(mus[2::2], -1)))
        return torch.cat(out)

    # ---- sampling ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None, gibbs_sweeps: int = 1000):
        """Approximate samples by ``gibbs_sweeps`` block-Gibbs sweeps of ``top`` from uniform noise; returns
        (v, [h_even]) with h_even drawn last, given the odd layers."""
        top = self.top
        x = bernoulli_sample(torch.full((n, top.n_visible), 0.5, device=top.W.device, dtype=top.W.dtype), generator)
        for _ in range(gibbs_sweeps):
            x = top.sample_x_given_h(top.sample_h(x, 1.0, generator), 1.0, generator)
        return x[:, :self.n_visible], [x[:, self.n_visible:]]

    def recognition(self) -> "MeanFieldQ":
        return MeanFieldQ(self)

    # ---- exact answers for small models -----------------------------------------------------------------
    def check_exact(self, max_units: int = 20) -> None:
        self.top.check_exact(max_units)

    def log_z_exact(self, max_units: int = 20, *, grad: bool = False) -> torch.Tensor:
        """log Z of ``top`` by enumeration (``BoltzmannMachine.log_z_exact``)."""
        return self.top.log_z_exact(max_units, grad=grad)


class MeanFieldQ:
    """Q(h_even | v) = prod Bernoulli(mu_even), the mean-field fixed point's marginals of the even hidden layers:
    the start of per-example AIS and of the Chib-style hill-climb. Same interface as ``DBNRecognition``."""

    def __init__(self, dbm: DBM) -> None:
        self.dbm = dbm

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """logit(mu_2), logit(mu_4), ... side by side (x of any leading shape; rows repeated by ``expand``, as an
        importance sampler's copies of each example are, are solved once)."""
        if x.dim() > 2 and x.stride(0) == 0:
            return self.logits(x[0]).expand(*x.shape[:-1], -1)
        flat = x.reshape(-1, x.shape[-1])
        logits = self.dbm.mean_field(flat, return_logits=True)
        return torch.cat(logits[2::2], -1).reshape(*x.shape[:-1], -1)

    def sample(self, x: torch.Tensor, generator: torch.Generator | None = None):
        a = self.logits(x)
        h = bernoulli_sample(torch.sigmoid(a), generator)
        return [h], [bernoulli_log_prob(a, h)]

    def latent_density(self, x: torch.Tensor) -> BinaryDensity:
        d = DensityBuilder(self.dbm.n_latent, x.shape[0], x)
        d.bernoulli(slice(0, self.dbm.n_latent), self.logits(x))
        return d.build()

    def log_prob(self, hs: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return bernoulli_log_prob(self.logits(x), torch.cat(hs, -1))

    def log_prob_layers(self, hs: list[torch.Tensor], x: torch.Tensor) -> list[torch.Tensor]:
        return [self.log_prob(hs, x)]

