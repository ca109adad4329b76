"""Boltzmann machines with one hidden layer: binary RBM, Gaussian-visible RBM, and semi-restricted BM.

Energy of x = [v, y] (pixels v, optional one-hot labels y) and binary hidden h:

    E(v, y, h) = -v'W h - y'U h - b'v - d'y - c'h - 1/2 v'L v        (binary v)
    E(v, y, h) = 1/2 |v - b|^2 - v'W h - y'U h - d'y - c'h            (Gaussian v, unit variance)

L is the symmetric, zero-diagonal lateral matrix of the semi-restricted BM (Osindero & Hinton 2008;
Salakhutdinov 2009, Sec. 4: 784 x 784 / 2 lateral weights, 10 label units joined to the hidden units,
500 hidden units: 705,622 parameters). At inverse temperature beta the distribution is exp(-beta E) / Z_beta.

- ``log_unnormalised(state)`` = -E(v, y, h), the log p* that tempered transitions and AIS weigh;
- ``free_energy(x, beta)`` sums h out analytically: p(x) proportional to exp(-F(x));
- conditionals ``h_given_x``, ``sample_x_given_h`` at inverse temperature beta (a scalar or one per chain);
- ``log_z_exact`` enumerates the smaller side (hidden units, or visible units when L couples them).

What depends on the kind of pixel (binary, Gaussian, binary with lateral weights) is asked of
``visible_layer`` (``nvil.models.visible``); ``visible`` keeps the config name.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from nvil.backend import gemm
from nvil.core.errors import ConfigError
from nvil.core.ops import chunks, enumerate_states
from nvil.models.protocol import FREE_ENERGY
from nvil.models.rbm_grad import BIAS_GRAD, free_energy_grad
from nvil.models.visible import VISIBLE, Bernoulli, LateralBernoulli, bernoulli_sample

VISIBLES = ("binary", "gaussian")


class BaseRate(NamedTuple):
    """A base-rate model over x = [v, y] with no hidden couplings (Salakhutdinov & Murray 2008): visible
    logits (binary; for Gaussian visibles, the mean) b and label logits d. E_A(x) = -b'v - d'y, or
    1/2 |v - b|^2 - d'y. AIS anneals from it through E_beta = (1 - beta) E_A + beta E."""

    b: torch.Tensor
    d: torch.Tensor | None = None


class State(NamedTuple):
    """One state per chain: x = [v, y] [chains, n_visible + n_labels] and h [chains, n_hidden]."""

    x: torch.Tensor
    h: torch.Tensor


def as_beta(beta, like: torch.Tensor) -> torch.Tensor:
    """beta as a [chains, 1] (or scalar) tensor that broadcasts against [chains, units]."""
    beta = torch.as_tensor(beta, dtype=like.dtype, device=like.device)
    return beta.unsqueeze(-1) if beta.dim() == 1 else beta


def temper(beta, t: torch.Tensor) -> torch.Tensor:
    """beta * t (beta a scalar or one per chain, as in ``as_beta``). At the target, beta = 1 given as a Python
    number, t itself: multiplying by 1 is exact, so this only skips a pass over t (SAP's sweeps are all at 1)."""
    if isinstance(beta, (int, float)) and beta == 1:
        return t
    return as_beta(beta, t) * t


class BoltzmannMachine(nn.Module):
    capabilities = frozenset({FREE_ENERGY})
    visible_offset = None  # an AIS intermediate distribution (nvil.estimators.ais_rbm.TemperedRBM) sets b_A here

    def __init__(self, n_visible: int, n_hidden: int, visible: str = "binary", lateral: bool = False,
                 n_labels: int = 0, visible_update: str = "sequential") -> None:
        super().__init__()
        if visible not in VISIBLES:
            raise ConfigError(f"model.visible must be one of {list(VISIBLES)}, got {visible!r}")
        if lateral and VISIBLE[visible] is not Bernoulli:
            raise ConfigError("lateral visible-visible connections need binary visibles")
        if visible_update not in ("sequential", "mean_field"):
            raise ConfigError(f"model.visible_update must be sequential or mean_field, got {visible_update!r}")
        self.n_pixels, self.n_hidden, self.n_labels = int(n_visible), int(n_hidden), int(n_labels)
        self.visible, self.visible_update = visible, visible_update
        self.visible_layer = LateralBernoulli(visible_update) if lateral else VISIBLE[visible].build()
        self.W = nn.Parameter(0.01 * torch.randn(self.n_pixels, self.n_hidden))
        self.b = nn.Parameter(torch.zeros(self.n_pixels))
        self.c = nn.Parameter(torch.zeros(self.n_hidden))
        self.U = nn.Parameter(0.01 * torch.randn(self.n_labels, self.n_hidden)) if n_labels else None
        self.d = nn.Parameter(torch.zeros(self.n_labels)) if n_labels else None
        self.L = nn.Parameter(torch.zeros(self.n_pixels, self.n_pixels)) if lateral else None
        if lateral:
            self.register_buffer("off_diagonal", 1.0 - torch.eye(self.n_pixels))

    # ---- bookkeeping ---------------------------------------------------------------------------
    @property
    def data_support(self) -> str:
        """What a data row holds (``nvil.estimators.door``): binary pixels (and one-hot labels), or real values."""
        return "real" if self.visible_layer.name == "gaussian" else "binary"

    @property
    def n_visible(self) -> int:
        """Width of x = [v, y]: what data rows and checkpoints carry."""
        return self.n_pixels + self.n_labels

    @property
    def layers(self) -> list[int]:
        return [self.n_hidden]

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return (x[..., : self.n_pixels], x[..., self.n_pixels:]) if self.n_labels else (x, None)

    def lateral(self) -> torch.Tensor | None:
        """L symmetric with a zero diagonal, built from the free parameter."""
        if self.L is None:
            return None
        return 0.5 * (self.L + self.L.T) * self.off_diagonal

    @torch.no_grad()
    def init_visible_bias(self, train_mean: torch.Tensor, eps: float = 1e-3) -> None:
        """Visible biases at the data marginals: logit of the mean pixel (binary), the mean (Gaussian)."""
        self.b.copy_(self.visible_layer.bias_from_mean(train_mean[: self.n_pixels].to(self.b), eps))
        if self.n_labels:
            freq = train_mean[self.n_pixels:].to(self.d).clamp(min=eps)
            self.d.copy_(torch.log(freq / freq.sum()))

    def filters(self) -> torch.Tensor:
        """[n_hidden, n_pixels] receptive fields, for TensorBoard image grids."""
        return self.W.detach().T

    # ---- energies --------------------------------------------------------------------------------
    def hidden_input(self, x: torch.Tensor) -> torch.Tensor:
        """c + v'W + y'U: the hidden units' total input."""
        v, y = self.split(x)
        a = gemm.addmm(self.c, v, self.W)
        return a + y @ self.U if y is not None else a

    def visible_energy(self, x: torch.Tensor) -> torch.Tensor:
        """The terms of E that do not involve h: -b'v (or 1/2 |v - b|^2) - d'y - 1/2 v'L v."""
        v, y = self.split(x)
        e = self.visible_layer.energy(v, self.b)
        if y is not None:
            e = e - y @ self.d
        lat = self.lateral()
        if lat is not None:
            e = e - 0.5 * ((v @ lat) * v).sum(-1)
        return e

    def energy(self, x: torch.Tensor, h: torch.Tensor, hidden_input: torch.Tensor | None = None) -> torch.Tensor:
        """E(x, h); ``hidden_input`` passes a(x) = c + v'W + y'U when the caller already has it (the sampler
        that drew h from it), which saves the matmul."""
        a = self.hidden_input(x) if hidden_input is None else hidden_input
        return self.visible_energy(x) - (a * h).sum(-1)

    def log_unnormalised(self, state: State, hidden_input: torch.Tensor | None = None) -> torch.Tensor:
        """log p*(x, h) = -E(x, h) (``hidden_input``: a(x), as in ``energy``)."""
        return -self.energy(state.x, state.h, hidden_input)

    def free_energy(self, x: torch.Tensor, beta=1.0, hidden_input: torch.Tensor | None = None,
                    visible_energy: torch.Tensor | None = None) -> torch.Tensor:
        """F_beta(x) = beta E_vis(x) - sum_j softplus(beta a_j(x)): exp(-F_beta) = sum_h exp(-beta E).
        ``hidden_input`` and ``visible_energy`` pass a(x) and E_vis(x) when the caller already has them (AIS weighs
        each state at two betas; its path from a base-rate model is ``nvil.estimators.ais_rbm.TemperedRBM``)."""
        beta = as_beta(beta, x)
        beta_per_chain = beta.squeeze(-1) if beta.dim() else beta
        a = self.hidden_input(x) if hidden_input is None else hidden_input
        e_vis = self.visible_energy(x) if visible_energy is None else visible_energy
        return beta_per_chain * e_vis - F.softplus(beta * a).sum(-1)

    @property
    def closed_form_grad(self) -> bool:
        """Whether ``free_energy_grad`` covers this machine (its visible layer's dE_vis/db is in ``BIAS_GRAD``)."""
        return type(self.visible_layer) in BIAS_GRAD

    def free_energy_grad(self, x: torch.Tensor, w: torch.Tensor, hidden_probs: torch.Tensor,
                         lr: float | None = None) -> dict[str, torch.Tensor] | None:
        """{name: sum_n w_n dF(x_n)/dtheta} in closed form, given p(h = 1 | x), or with ``lr`` plain SGD's step along
        it applied in place (``nvil.models.rbm_grad``)."""
        return free_energy_grad(self, x, w, hidden_probs, lr)

    @property
    def hidden_marginal_tractable(self) -> bool:
        """Whether log p*(h) has a closed form: the pixels are independent given h (no lateral weights)."""
        return self.L is None

    def log_unnormalised_hidden(self, h: torch.Tensor) -> torch.Tensor:
        """log p*(h) = log sum_x exp(-E(x, h)), x summed out analytically (needs ``hidden_marginal_tractable``):

            c'h + sum_i softplus(b_i + W_i h) [+ logsumexp_y (d + U h)_y]                      (binary v)
            c'h + 1/2 |b + W h|^2 - 1/2 |b|^2 + V/2 log 2 pi [+ logsumexp_y (d + U h)_y]     (Gaussian v)

        Since Z = sum_h p*(h), every h gives a hard lower bound log Z >= log p*(h)."""
        out = h @ self.c + self.visible_layer.log_normaliser(self.b + h @ self.W.T, self.b)
        if self.n_labels:
            out = out + torch.logsumexp(self.d + h @ self.U.T, -1)
        return out

    def x_mode_given_h(self, h: torch.Tensor) -> torch.Tensor:
        """The most probable x given h when the pixels are independent given h (lateral weights ignored, so for a
        semi-RBM only an approximation: used to find probe states, never for sampling)."""
        v = self.visible_layer.mode(self.b + h @ self.W.T)
        if not self.n_labels:
            return v
        y = F.one_hot((self.d + h @ self.U.T).argmax(-1), self.n_labels).to(v.dtype)
        return torch.cat([v, y], -1)

    # ---- conditionals at inverse temperature beta ---------------------------------------------------
    def h_given_x(self, x: torch.Tensor, beta=1.0, hidden_input: torch.Tensor | None = None) -> torch.Tensor:
        """p_beta(h = 1 | x) = sigmoid(beta a(x)); ``hidden_input`` passes a(x) when the caller has it."""
        return torch.sigmoid(temper(beta, self.hidden_input(x) if hidden_input is None else hidden_input))

    def sample_h(self, x: torch.Tensor, beta=1.0, generator=None, hidden_input: torch.Tensor | None = None) -> torch.Tensor:
        return bernoulli_sample(self.h_given_x(x, beta, hidden_input), generator)

    @property
    def fused_gibbs(self) -> bool:
        """Whether the compiled block-Gibbs kernels (``nvil.mcmc.gibbs``) cover this model: binary pixels, no
        labels, no lateral weights."""
        return self.visible_layer.fused_gibbs and not self.n_labels

    def sample_x_given_h(self, h: torch.Tensor, beta=1.0, generator=None, x: torch.Tensor | None = None,
                         reverse: bool = False, base: BaseRate | None = None) -> torch.Tensor:
        """x ~ p_beta(x | h), of exp(-beta E) or, with a base-rate model, exp(-(1 - beta) E_A - beta E).
        For the semi-RBM the pixels are a pairwise MRF given h: one sequential Gibbs sweep over them
        (``visible_update=sequential``, starting from ``x``; in index order, or the opposite order with
        ``reverse``), or damped mean-field probabilities (``mean_field``, an approximation for CD only)."""
        field = temper(beta, gemm.addmm(self.b, h, self.W.T))  # tempered logits (binary) or precision-weighted mean
        beta = as_beta(beta, h)
        if base is not None:
            field = field + (1 - beta) * base.b
        # the weight on the pixels' own energy: beta, plus 1 - beta from the base
        precision = beta if base is None else torch.ones_like(beta)
        v = self.visible_layer.sample_field(field, generator, beta=beta, precision=precision, lateral=self.lateral(),
                                            start=None if x is None else self.split(x)[0], reverse=reverse)
        if not self.n_labels:
            return v
        logits = beta * (self.d + h @ self.U.T)
        if base is not None:
            logits = logits + (1 - beta) * base.d
        y = F.one_hot(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(-1),
                      self.n_labels).to(v.dtype)
        return torch.cat([v, y], -1)

    # ---- exact answers for small models ------------------------------------------------------------
    @property
    def n_latent(self) -> int:
        return self.n_hidden

    def check_exact(self, max_units: int = 20) -> None:
        """Raise a one-line ConfigError unless log Z can be enumerated."""
        if self.L is not None and self.n_pixels > max_units:
            raise ConfigError(f"exact log Z of a semi-RBM enumerates its {self.n_pixels} pixels; the limit is {max_units}")
        if self.L is None and self.n_hidden > max_units:
            raise ConfigError(f"exact log Z enumerates 2^H hidden states and is limited to H <= {max_units}; "
                              f"this model has H = {self.n_hidden}")

    def log_z_exact(self, max_units: int = 20, chunk_elements: int = 2**24, *, grad: bool = False) -> torch.Tensor:
        """log Z by enumerating the hidden units (2^H states) with x summed out analytically, or, when lateral
        connections couple the pixels, the pixels (2^V states) with h summed out. No autograd graph unless ``grad``
        (its gradient: the model's expectation of -dE/dtheta, exact maximum likelihood's negative phase)."""
        self.check_exact(max_units)
        if not grad:
            return torch.no_grad()(self.log_z_exact)(max_units, chunk_elements, grad=True)
        dev, dt = self.W.device, self.W.dtype
        if self.L is not None:  # enumerate the pixels (and labels), h summed out in -F
            n = self.n_pixels
            eye = torch.eye(self.n_labels, device=dev, dtype=dt) if self.n_labels else None
            terms = []
            for s0, s1 in chunks(2**n, max(1, chunk_elements // (n * max(1, self.n_labels)))):
                v = enumerate_states(n, s0, s1, device=dev, dtype=dt)
                x = torch.cat([v.repeat_interleave(self.n_labels, 0), eye.repeat(v.shape[0], 1)], -1) if eye is not None else v
                terms.append(torch.logsumexp(-self.free_energy(x), 0))
            return torch.logsumexp(torch.stack(terms), 0)
        terms = []  # enumerate the hidden units, x summed out analytically
        for s0, s1 in chunks(2**self.n_hidden, max(1, chunk_elements // self.n_pixels)):
            h = enumerate_states(self.n_hidden, s0, s1, device=dev, dtype=dt)
            terms.append(torch.logsumexp(self.log_unnormalised_hidden(h), 0))
        return torch.logsumexp(torch.stack(terms), 0)

    def exact_log_prob(self, x: torch.Tensor, log_z: torch.Tensor | None = None) -> torch.Tensor:
        """log p(x) = -F(x) - log Z (densities for Gaussian visibles)."""
        return -self.free_energy(x) - (self.log_z_exact(grad=True) if log_z is None else log_z)

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None, gibbs_sweeps: int = 1000):
        """(v [n, n_visible], h [n, n_hidden]) approximately from p(v, h): ``gibbs_sweeps`` block-Gibbs sweeps from uniform h."""
        h = bernoulli_sample(torch.full((n, self.n_hidden), 0.5, device=self.W.device, dtype=self.W.dtype), generator)
        x = self.sample_x_given_h(h, 1.0, generator)
        for _ in range(gibbs_sweeps):
            h = self.sample_h(x, 1.0, generator)
            x = self.sample_x_given_h(h, 1.0, generator, x=x)
        return x, h

    def extra_repr(self) -> str:
        return (f"n_visible={self.n_pixels}, n_hidden={self.n_hidden}, visible={self.visible!r}"
                + (", lateral=True" if self.L is not None else "") + (f", n_labels={self.n_labels}" * bool(self.n_labels)))

    @torch.no_grad()
    def init_chains(self, x: torch.Tensor, generator=None) -> State:
        """Chains started at data (or any) x, with h drawn from p(h | x)."""
        return State(x.clone(), self.sample_h(x, 1.0, generator))
