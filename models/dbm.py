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
    """Deep Boltzmann machine over binary layers v = h_0, h_1, ..., h_L, stored as one RBM between even and odd layers.

    Each layer is joined only to its neighbours (Salakhutdinov & Hinton 2009),
    E(v, h) = -sum_l h_{l-1}' W_l h_l - b'v - sum_l c_l' h_l. The parameters live in ``top``, a
    ``BoltzmannMachine`` between the even layers x = [v, h_2, h_4, ...] and the odd layers y = [h_1, h_3, ...],
    whose weight blocks between layers that are not neighbours are held at zero by the buffer ``mask``
    (``constrain_`` restores them after an update). ``offsets[l]`` is layer l's (parity, start) inside x or y.
    The odd layers sum out analytically, so ``top``'s free energy gives log p*(v, h_even) and its partition function
    is the DBM's Z; mean-field inference (``mean_field``) gives the variational bound (``variational_bound``).
    Class attributes: ``capabilities`` (top machine, variational bound, binary latents), ``data_support``
    (``"binary"``) and ``visible_layer`` (``Bernoulli``).

    Parameters
    ----------
    n_visible : int
        Number of visible units, the width of v = h_0.
    sizes : list of int
        Widths of the hidden layers h_1, ..., h_L, bottom to top; at least two (one hidden layer is an RBM).

    Raises
    ------
    ValueError
        If ``sizes`` has fewer than two layers.

    Examples
    --------
    >>> import itertools
    >>> import torch
    >>> from nvil.models import DBM
    >>> dbm = DBM(6, [4, 3])
    >>> dbm.widths, dbm.layers, dbm.n_latent
    ([6, 4, 3], [3], 3)
    >>> dbm.top
    BoltzmannMachine(n_visible=9, n_hidden=4, visible='binary')
    >>> v = torch.tensor([[1., 0., 1., 1., 0., 0.], [0., 1., 0., 0., 1., 1.]])
    >>> [mu.shape for mu in dbm.mean_field(v)]
    [torch.Size([2, 6]), torch.Size([2, 4]), torch.Size([2, 3])]

    The mean-field bound lies below the exact log p*(v), here summed over the 2^3 states of h_2:

    >>> h2 = torch.tensor(list(itertools.product([0., 1.], repeat=3)))
    >>> exact = torch.stack([dbm.log_joint(v, [h.expand(2, 3)]) for h in h2]).logsumexp(0)
    >>> bool((dbm.variational_bound(v) <= exact).all())
    True
    """
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
        """The widths of all layers, v first: ``[n_visible, n_1, ..., n_L]``."""
        return [self.n_visible] + self.sizes

    def span(self, l: int) -> slice:
        """Layer l's units inside x (l even) or y (l odd).

        Parameters
        ----------
        l : int
            Layer index, 0 for v, 1 to L for h_1 to h_L.

        Returns
        -------
        slice
            The columns of layer l in x = [v, h_2, h_4, ...] when l is even, in y = [h_1, h_3, ...] when l is odd.
        """
        start = self.offsets[l][1]
        return slice(start, start + self.widths[l])

    def block(self, l: int) -> tuple[slice, slice]:
        """The rows and columns of ``top.W`` that hold W_l, the weights between layers l - 1 and l.

        The block is W_l itself when l is odd (rows in x for layer l - 1, columns in y for layer l), its transpose when
        l is even.

        Parameters
        ----------
        l : int
            Layer index, 1 to L.

        Returns
        -------
        tuple of slice
            ``(rows, columns)`` of ``top.W``.
        """
        lo, hi = (l - 1, l) if l % 2 else (l, l - 1)
        return self.span(lo), self.span(hi)

    def weight(self, l: int) -> torch.Tensor:
        """W_l, the weights between layers l - 1 and l, as a view of ``top.W``.

        Parameters
        ----------
        l : int
            Layer index, 1 to L.

        Returns
        -------
        torch.Tensor
            ``(n_{l-1}, n_l)`` view of ``top.W`` (transposed when l is even), so writes reach ``top``.
        """
        w = self.top.W[self.block(l)]
        return w if l % 2 else w.T

    def bias(self, l: int) -> torch.Tensor:
        """The bias of layer l: b (l = 0) or c_l, as a view of ``top.b`` or ``top.c``.

        Parameters
        ----------
        l : int
            Layer index, 0 for v, 1 to L for the hidden layers.

        Returns
        -------
        torch.Tensor
            ``(n_l,)`` view of ``top.b`` (l even) or ``top.c`` (l odd).
        """
        return (self.top.b if l % 2 == 0 else self.top.c)[self.span(l)]

    @property
    def layers(self) -> list[int]:
        """The widths of the latent layers an estimator sums over per test case: the even hidden layers h_2, h_4, ...

        The odd ones are summed out analytically.
        """
        return self.widths[2::2]

    @property
    def n_latent(self) -> int:
        """The number of latent units per test case: the total width of the even hidden layers (``sum(layers)``)."""
        return sum(self.layers)

    def join(self, v: torch.Tensor, h_even: torch.Tensor) -> torch.Tensor:
        """x = [v, h_2, h_4, ...] from v and the even hidden layers side by side (leading dimensions broadcast).

        Parameters
        ----------
        v : torch.Tensor
            ``(..., n_visible)`` visible vectors.
        h_even : torch.Tensor
            ``(..., n_latent)`` the even hidden layers h_2, h_4, ... concatenated; cast to ``v``'s dtype.

        Returns
        -------
        torch.Tensor
            ``(..., n_visible + n_latent)`` rows of ``top``'s visible layer, over the broadcast leading shape.
        """
        lead = torch.broadcast_shapes(v.shape[:-1], h_even.shape[:-1])
        return torch.cat([v.expand(*lead, -1), h_even.to(v.dtype).expand(*lead, -1)], -1)

    @torch.no_grad()
    def constrain_(self) -> None:
        """Hold the blocks of layers that are not neighbours at zero (after a parameter update)."""
        self.top.W.mul_(self.mask)

    @torch.no_grad()
    def init_visible_bias(self, train_mean: torch.Tensor, eps: float = 1e-3) -> None:
        """Set the visible bias b to the data marginals: the log-odds of the mean pixel, clamped to [eps, 1 - eps].

        Parameters
        ----------
        train_mean : torch.Tensor
            ``(n_visible,)`` mean of the training rows.
        eps : float, default 1e-3
            Clamp applied to the means before the logit.
        """
        self.bias(0).copy_(self.visible_layer.bias_from_mean(train_mean.to(self.top.b), eps))

    def filters(self) -> torch.Tensor:
        """The first layer's receptive fields W_1', for TensorBoard image grids.

        Returns
        -------
        torch.Tensor
            ``(n_1, n_visible)`` detached weights.
        """
        return self.weight(1).detach().T

    # ---- energies ---------------------------------------------------------------------------------------
    def energy(self, mus: list[torch.Tensor]) -> torch.Tensor:
        """E(h_0, ..., h_L) for states (or mean-field means) of every layer, v first.

        Parameters
        ----------
        mus : list of torch.Tensor
            ``[v, h_1, ..., h_L]``, layer l ``(..., n_l)``: binary states or mean-field means mu_l.

        Returns
        -------
        torch.Tensor
            ``(...)`` energies E(v, h) = -sum_l h_{l-1}' W_l h_l - b'v - sum_l c_l' h_l (``top``'s energy of x, y).
        """
        x = torch.cat([mus[l] for l in range(0, len(mus), 2)], -1)
        y = torch.cat([mus[l] for l in range(1, len(mus), 2)], -1)
        return self.top.energy(x, y)

    def log_joint(self, v: torch.Tensor, hs: list[torch.Tensor]) -> torch.Tensor:
        """log p*(v, h_even) = -F_top([v, h_even]), the odd layers summed out; subtract log Z for log p.

        Parameters
        ----------
        v : torch.Tensor
            ``(..., n_visible)`` visible vectors.
        hs : list of torch.Tensor
            The even hidden layers ``[h_2, h_4, ...]``, each ``(..., n_l)``; concatenated in order.

        Returns
        -------
        torch.Tensor
            ``(...)`` unnormalised log probabilities log p*(v, h_even).
        """
        return -self.top.free_energy(self.join(v, torch.cat(hs, -1)))

    def latent_density(self, v: torch.Tensor) -> BinaryDensity:
        """log p*(v, h_even) for fixed v as a ``BinaryDensity`` over h_even.

        Its terms are b'v, the even biases, and one softplus factor over the odd units,
        sum_k softplus(c_k + (v'W_v)_k + (h_even M)_k), where W_v and M are the rows of ``top.W`` for v and for
        h_even.

        Parameters
        ----------
        v : torch.Tensor
            ``(chains, n_visible)`` visible vectors, one per chain.

        Returns
        -------
        BinaryDensity
            The density over the ``n_latent`` even hidden units, one per chain; its ``log_prob(h_even)`` equals
            ``log_joint(v, [h_even])``.
        """
        n_v = self.n_visible
        d = DensityBuilder(self.n_latent, v.shape[0], v)
        d.const += v @ self.top.b[:n_v]
        everything = slice(0, self.n_latent)
        d.linear(everything, self.top.b[n_v:])
        d.softplus_factor(everything, self.top.W[n_v:], self.top.c + v @ self.top.W[:n_v], +1.0)
        return d.build()

    # ---- mean field -------------------------------------------------------------------------------------
    def layer_input(self, l: int, mus: list[torch.Tensor], from_v: torch.Tensor | None = None) -> torch.Tensor:
        """The total input to layer l, c_l + W_l' mu_{l-1} + W_{l+1} mu_{l+1} (no second term for the top layer).

        Parameters
        ----------
        l : int
            Layer index, 1 to L.
        mus : list of torch.Tensor
            ``[v, mu_1, ..., mu_L]``, the current means (or states) of every layer, v first.
        from_v : torch.Tensor or None, default None
            Layer 1's c_1 + W_1' v, which does not change while v is held fixed; used only when ``l == 1``, and
            computed from ``mus[0]`` when None.

        Returns
        -------
        torch.Tensor
            ``(..., n_l)`` logits; the mean-field update is mu_l = sigmoid(input).
        """
        a = from_v if l == 1 and from_v is not None else self.bias(l) + mus[l - 1] @ self.weight(l)
        if l + 1 < len(mus):
            a = a + mus[l + 1] @ self.weight(l + 1).T
        return a

    def mean_field(self, v: torch.Tensor, max_iter: int = 50, tol: float = 1e-7, return_logits: bool = False,
                   omega: float | str = 1.0, return_sweeps: bool = False):
        """The mean-field fixed point [v, mu_1, ..., mu_L] of q(h) = prod_l prod_j Bernoulli(mu_lj) given v.

        Salakhutdinov & Hinton 2009, Sec. 3.1: the fixed point mu_l = sigmoid(W_l' mu_{l-1} + W_{l+1} mu_{l+1} + c_l).
        It starts from a bottom-up pass with each layer's input from below doubled (it will get as much from above),
        then updates layers in turn, bottom to top, until no mean moves by more than ``tol`` or ``max_iter`` sweeps.
        Each layer's logit a_l moves to its input, a_l <- a_l + omega (input_l - a_l): omega = 1 is the plain update
        (coordinate ascent on the bound); 1 < omega < 2 over-relaxes it (successive over-relaxation, which takes fewer
        sweeps to the same fixed point), and falls back to omega = 1 for the remaining sweeps as soon as the largest
        move grows from one sweep to the next. ``omega="auto"``: two plain sweeps, then Young's optimal over-relaxation
        for the contraction r they show (the ratio of their largest moves), omega = 2 / (1 + sqrt(1 - r)): close to 1
        where the plain update already converges fast, larger where it is slow.

        Parameters
        ----------
        v : torch.Tensor
            ``(N, n_visible)`` visible vectors, held fixed.
        max_iter : int, default 50
            Largest number of sweeps over the layers.
        tol : float, default 1e-7
            Stop once no mean moves by more than this in a sweep.
        return_logits : bool, default False
            Return the logits a_l of the means instead of the means (v itself first).
        omega : float or str, default 1.0
            Over-relaxation factor omega in (0, 2), or ``"auto"`` for Young's optimal factor.
        return_sweeps : bool, default False
            Also return the number of sweeps taken.

        Returns
        -------
        list of torch.Tensor or tuple
            ``[v, mu_1, ..., mu_L]`` (layer l ``(N, n_l)``), or ``[v, a_1, ..., a_L]`` with ``return_logits``; with
            ``return_sweeps``, the pair ``(that list, sweeps)``, sweeps an int.

        Raises
        ------
        ValueError
            If ``omega`` is neither ``"auto"`` nor a number in (0, 2).
        """
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
        """The mean-field bound -E(v, mu) + H(q) <= log p*(v) for each row; subtract log Z for the bound on log p(v).

        E is linear in each layer and q factorises, so E_q[E(v, h)] = E(v, mu).

        Parameters
        ----------
        v : torch.Tensor
            ``(N, n_visible)`` visible vectors.
        mus : list of torch.Tensor or None, default None
            ``[v, mu_1, ..., mu_L]`` means to evaluate the bound at; None runs ``mean_field(v)`` with its defaults.

        Returns
        -------
        torch.Tensor
            ``(N,)`` lower bounds on log p*(v).
        """
        mus = self.mean_field(v) if mus is None else mus
        return -self.energy(mus) + sum(binary_entropy(mu) for mu in mus[1:])

    @torch.no_grad()
    def top_data(self, v: torch.Tensor, batch_size: int = 5000) -> torch.Tensor:
        """Rows x = [v, mu_2, mu_4, ...] of ``top`` from data rows: the mean-field means of the even hidden layers.

        These are the base-rate marginals and the reverse chains' ``data`` starts of ``top``'s log Z.

        Parameters
        ----------
        v : torch.Tensor
            ``(N, n_visible)`` data rows, dense or sparse.
        batch_size : int, default 5000
            Rows per mean-field call.

        Returns
        -------
        torch.Tensor
            ``(N, n_visible + n_latent)`` rows of ``top``'s visible layer, the hidden parts real-valued means.
        """
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
        """Approximate samples by ``gibbs_sweeps`` block-Gibbs sweeps of ``top`` from uniform noise.

        Each sweep draws the odd layers given the even ones, then the even ones given the odd; h_even is drawn last.

        Parameters
        ----------
        n : int
            Number of samples (independent chains).
        generator : torch.Generator or None, default None
            Source of randomness; None uses torch's global generator.
        gibbs_sweeps : int, default 1000
            Number of block-Gibbs sweeps.

        Returns
        -------
        tuple
            ``(v, [h_even])``: v ``(n, n_visible)`` and h_even ``(n, n_latent)``, binary.
        """
        top = self.top
        x = bernoulli_sample(torch.full((n, top.n_visible), 0.5, device=top.W.device, dtype=top.W.dtype), generator)
        for _ in range(gibbs_sweeps):
            x = top.sample_x_given_h(top.sample_h(x, 1.0, generator), 1.0, generator)
        return x[:, :self.n_visible], [x[:, self.n_visible:]]

    def recognition(self) -> "MeanFieldQ":
        """The mean-field recognition distribution Q(h_even | v).

        It is the start of per-example AIS and of the Chib-style hill-climb.

        Returns
        -------
        MeanFieldQ
            Q(h_even | v) = prod Bernoulli(mu_even), with the interface of ``DBNRecognition``.
        """
        return MeanFieldQ(self)

    # ---- exact answers for small models -----------------------------------------------------------------
    def check_exact(self, max_units: int = 20) -> None:
        """Raise a one-line ``ConfigError`` unless ``top``'s log Z can be enumerated (``BoltzmannMachine.check_exact``).

        Parameters
        ----------
        max_units : int, default 20
            The most odd-layer units (``top``'s hidden units, 2^H states) enumeration may take.

        Raises
        ------
        ConfigError
            If the odd layers hold more than ``max_units`` units.
        """
        self.top.check_exact(max_units)

    def log_z_exact(self, max_units: int = 20, *, grad: bool = False) -> torch.Tensor:
        """log Z of ``top`` by enumeration (``BoltzmannMachine.log_z_exact``): the DBM's log partition function.

        Parameters
        ----------
        max_units : int, default 20
            The most odd-layer units (2^H states) enumeration may take.
        grad : bool, default False
            Keep the autograd graph, so that its gradient is the model's expectation of -dE/dtheta.

        Returns
        -------
        torch.Tensor
            0-d log Z.

        Raises
        ------
        ConfigError
            If the odd layers hold more than ``max_units`` units.
        """
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

