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
    """A Boltzmann machine with one layer of binary hidden units: binary or Gaussian RBM, or semi-restricted BM.

    The energy of x = [v, y] (pixels v, optional one-hot labels y) and binary hidden h is the module's
    (``nvil.models.rbm``):

        E(v, y, h) = -v'W h - y'U h - b'v - d'y - c'h - 1/2 v'L v        (binary v)
        E(v, y, h) = 1/2 |v - b|^2 - v'W h - y'U h - d'y - c'h            (Gaussian v, unit variance)

    with L the semi-restricted BM's symmetric, zero-diagonal lateral matrix (``lateral=True``; Osindero & Hinton
    2008, Salakhutdinov 2009, Sec. 4). At inverse temperature beta the distribution is exp(-beta E) / Z_beta.
    ``free_energy`` sums h out analytically, ``h_given_x`` / ``sample_h`` / ``sample_x_given_h`` are the block-Gibbs
    conditionals at beta (a scalar or one per chain), and ``log_z_exact`` enumerates the smaller side for small
    models. ``nvil.models.RBM`` is this class. What depends on the kind of pixel is asked of ``visible_layer``
    (``nvil.models.visible``); ``visible`` keeps the config name.

    Parameters
    ----------
    n_visible : int
        Number of pixels V (labels not included; the property ``n_visible`` is the row width V + ``n_labels``).
    n_hidden : int
        Number of binary hidden units H.
    visible : {"binary", "gaussian"}, default "binary"
        Kind of pixel: binary units (visible energy -b'v) or real-valued, unit-variance Gaussian units
        (1/2 |v - b|^2).
    lateral : bool, default False
        Join the pixels by lateral weights L (a semi-restricted BM); binary pixels only.
    n_labels : int, default 0
        Number of one-hot label units y, joined to the hidden units by U (Salakhutdinov 2009: 10); 0 for none.
    visible_update : {"sequential", "mean_field"}, default "sequential"
        How a semi-RBM's coupled pixels are drawn given h: one sequential Gibbs sweep, or damped mean-field
        probabilities (an approximation, for CD reconstructions only). Without ``lateral`` it has no effect.

    Attributes
    ----------
    W : torch.nn.Parameter
        ``(V, H)`` pixel-hidden weights, initialised from N(0, 0.01^2).
    b : torch.nn.Parameter
        ``(V,)`` visible biases (binary logits; the means of Gaussian pixels), initialised at 0.
    c : torch.nn.Parameter
        ``(H,)`` hidden biases, initialised at 0.
    U : torch.nn.Parameter or None
        ``(n_labels, H)`` label-hidden weights, initialised from N(0, 0.01^2); None without labels.
    d : torch.nn.Parameter or None
        ``(n_labels,)`` label biases; None without labels.
    L : torch.nn.Parameter or None
        ``(V, V)`` free lateral parameter, initialised at 0; the energy uses its symmetric, zero-diagonal part
        (``lateral()``). None without lateral connections.
    capabilities : frozenset of str
        ``{FREE_ENERGY}`` (``nvil.models.protocol``): hidden units summed in closed form, log Z the model's own.
    visible_offset : torch.Tensor or None
        None here; an AIS intermediate distribution (``nvil.estimators.ais_rbm.TemperedRBM``) sets the base-rate
        biases b_A in it, which the compiled Gibbs kernels add as (1 - beta) b_A to the visible logits.

    Raises
    ------
    ConfigError
        If ``visible`` is not "binary" or "gaussian", if ``lateral`` is asked of Gaussian pixels, or if
        ``visible_update`` is neither "sequential" nor "mean_field".

    Examples
    --------
    >>> import itertools
    >>> import torch
    >>> from nvil.models import RBM
    >>> rbm = RBM(6, 4)
    >>> rbm
    BoltzmannMachine(n_visible=6, n_hidden=4, visible='binary')
    >>> x = torch.tensor(list(itertools.product([0.0, 1.0], repeat=6)))   # all 2^6 visible states
    >>> rbm.free_energy(x).shape, rbm.h_given_x(x).shape
    (torch.Size([64]), torch.Size([64, 4]))
    >>> log_z = rbm.log_z_exact()                                        # 2^4 hidden states enumerated
    >>> round(rbm.exact_log_prob(x, log_z).exp().sum().item(), 4)        # p(x) sums to one
    1.0
    >>> v, h = rbm.sample(5, gibbs_sweeps=10)
    >>> v.shape, h.shape
    (torch.Size([5, 6]), torch.Size([5, 4]))
    >>> semi = RBM(6, 4, lateral=True, n_labels=3)
    >>> semi.n_visible, semi.hidden_marginal_tractable
    (9, False)
    """

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
        """The latent layer sizes an estimator sums over: ``[n_hidden]``."""
        return [self.n_hidden]

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Split rows x = [v, y] into the pixels v and the one-hot labels y.

        Parameters
        ----------
        x : torch.Tensor
            ``(..., n_pixels + n_labels)`` rows x = [v, y].

        Returns
        -------
        tuple of (torch.Tensor, torch.Tensor or None)
            ``(v, y)``: the first ``n_pixels`` columns and the last ``n_labels``; without labels, ``(x, None)``.
        """
        return (x[..., : self.n_pixels], x[..., self.n_pixels:]) if self.n_labels else (x, None)

    def lateral(self) -> torch.Tensor | None:
        """L symmetric with a zero diagonal, built from the free parameter.

        The parameter ``L`` is unconstrained; the energy uses 1/2 (L + L') o (1 - I).

        Returns
        -------
        torch.Tensor or None
            ``(n_pixels, n_pixels)`` lateral weights (differentiable in ``L``), or None without lateral connections.
        """
        if self.L is None:
            return None
        return 0.5 * (self.L + self.L.T) * self.off_diagonal

    @torch.no_grad()
    def init_visible_bias(self, train_mean: torch.Tensor, eps: float = 1e-3) -> None:
        """Visible biases at the data marginals: logit of the mean pixel (binary), the mean (Gaussian).

        The label biases d become the log of the label frequencies (clamped below at ``eps``, normalised). The
        parameters are overwritten in place, outside autograd.

        Parameters
        ----------
        train_mean : torch.Tensor
            ``(n_pixels + n_labels,)`` mean of the training rows x = [v, y].
        eps : float, default 1e-3
            Binary pixel means are clamped to [eps, 1 - eps] before the logit; label frequencies to at least eps.
        """
        self.b.copy_(self.visible_layer.bias_from_mean(train_mean[: self.n_pixels].to(self.b), eps))
        if self.n_labels:
            freq = train_mean[self.n_pixels:].to(self.d).clamp(min=eps)
            self.d.copy_(torch.log(freq / freq.sum()))

    def filters(self) -> torch.Tensor:
        """The hidden units' receptive fields, for TensorBoard image grids.

        Returns
        -------
        torch.Tensor
            ``(n_hidden, n_pixels)``: W', detached (a view of the parameter, not a copy).
        """
        return self.W.detach().T

    # ---- energies --------------------------------------------------------------------------------
    def hidden_input(self, x: torch.Tensor) -> torch.Tensor:
        """The hidden units' total input a(x) = c + v'W + y'U.

        Parameters
        ----------
        x : torch.Tensor
            ``(chains, n_pixels + n_labels)`` rows x = [v, y].

        Returns
        -------
        torch.Tensor
            ``(chains, n_hidden)`` a(x); p(h = 1 | x) = sigmoid(a(x)).
        """
        v, y = self.split(x)
        a = gemm.addmm(self.c, v, self.W)
        return a + y @ self.U if y is not None else a

    def visible_energy(self, x: torch.Tensor) -> torch.Tensor:
        """The terms of E that do not involve h: -b'v (or 1/2 |v - b|^2) - d'y - 1/2 v'L v.

        Parameters
        ----------
        x : torch.Tensor
            ``(chains, n_pixels + n_labels)`` rows x = [v, y].

        Returns
        -------
        torch.Tensor
            ``(chains,)`` E_vis(x).
        """
        v, y = self.split(x)
        e = self.visible_layer.energy(v, self.b)
        if y is not None:
            e = e - y @ self.d
        lat = self.lateral()
        if lat is not None:
            e = e - 0.5 * ((v @ lat) * v).sum(-1)
        return e

    def energy(self, x: torch.Tensor, h: torch.Tensor, hidden_input: torch.Tensor | None = None) -> torch.Tensor:
        """The energy E(x, h) = E_vis(x) - a(x)'h of each chain's state (at beta = 1).

        ``hidden_input`` passes a(x) = c + v'W + y'U when the caller already has it (the sampler that drew h from
        it), which saves the matmul.

        Parameters
        ----------
        x : torch.Tensor
            ``(chains, n_pixels + n_labels)`` rows x = [v, y].
        h : torch.Tensor
            ``(chains, n_hidden)`` binary hidden states.
        hidden_input : torch.Tensor or None, default None
            ``(chains, n_hidden)`` a(x), when already computed; None computes it.

        Returns
        -------
        torch.Tensor
            ``(chains,)`` E(x, h).
        """
        a = self.hidden_input(x) if hidden_input is None else hidden_input
        return self.visible_energy(x) - (a * h).sum(-1)

    def log_unnormalised(self, state: State, hidden_input: torch.Tensor | None = None) -> torch.Tensor:
        """``log p*(x, h) = -E(x, h)``, the unnormalised log density that tempered transitions and AIS weigh.

        Parameters
        ----------
        state : State
            ``State(x, h)``: x ``(chains, n_pixels + n_labels)``, h ``(chains, n_hidden)``.
        hidden_input : torch.Tensor or None, default None
            ``(chains, n_hidden)`` a(x) of ``state.x``, as in ``energy``; None computes it.

        Returns
        -------
        torch.Tensor
            ``(chains,)`` -E(x, h).
        """
        return -self.energy(state.x, state.h, hidden_input)

    def free_energy(self, x: torch.Tensor, beta=1.0, hidden_input: torch.Tensor | None = None,
                    visible_energy: torch.Tensor | None = None) -> torch.Tensor:
        """The free energy ``F_beta(x) = beta E_vis(x) - sum_j softplus(beta a_j(x))``, h summed out analytically.

        ``exp(-F_beta(x)) = sum_h exp(-beta E(x, h))``, so at beta = 1, p(x) = exp(-F(x)) / Z. ``hidden_input``
        and ``visible_energy`` pass a(x) and E_vis(x) when the caller already has them (AIS weighs each state at two
        betas; its path from a base-rate model is ``nvil.estimators.ais_rbm.TemperedRBM``).

        Parameters
        ----------
        x : torch.Tensor
            ``(chains, n_pixels + n_labels)`` rows x = [v, y].
        beta : float or torch.Tensor, default 1.0
            Inverse temperature beta: a scalar, or ``(chains,)`` one per chain.
        hidden_input : torch.Tensor or None, default None
            ``(chains, n_hidden)`` a(x) = c + v'W + y'U (untempered), when already computed; None computes it.
        visible_energy : torch.Tensor or None, default None
            ``(chains,)`` E_vis(x) (``visible_energy(x)``, untempered), when already computed; None computes it.

        Returns
        -------
        torch.Tensor
            ``(chains,)`` F_beta(x).
        """
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
        """The weighted free-energy gradient ``{name: sum_n w_n dF(x_n)/dtheta}`` in closed form, or SGD's step.

        The gradient comes from the sufficient statistics given p(h = 1 | x), or with ``lr`` plain SGD's step along
        it is applied in place (``nvil.models.rbm_grad``, which lists the derivatives). It needs
        ``closed_form_grad``.

        Parameters
        ----------
        x : torch.Tensor
            ``(rows, n_pixels + n_labels)`` rows x = [v, y] (the learners pass data and negative particles stacked).
        w : torch.Tensor
            ``(rows,)`` row weights w_n: the data's rows at 1/B and the particles' at -1/M give the gradient of
            mean F(data) - mean F(negatives).
        hidden_probs : torch.Tensor
            ``(rows, n_hidden)`` p(h = 1 | x) = sigmoid(a(x)) at the current parameters.
        lr : float or None, default None
            Learning rate: theta <- theta - lr * gradient is applied to the parameters in place, and None returned.

        Returns
        -------
        dict of str to torch.Tensor, or None
            Gradients by parameter name (``W``, ``b``, ``c``, and ``U``, ``d``, ``L`` where the machine has them),
            each the parameter's shape; None when ``lr`` is given.
        """
        return free_energy_grad(self, x, w, hidden_probs, lr)

    @property
    def hidden_marginal_tractable(self) -> bool:
        """Whether log p*(h) has a closed form: the pixels are independent given h (no lateral weights)."""
        return self.L is None

    def log_unnormalised_hidden(self, h: torch.Tensor) -> torch.Tensor:
        """``log p*(h) = log sum_x exp(-E(x, h))``, x summed out analytically (needs ``hidden_marginal_tractable``).

            c'h + sum_i softplus(b_i + W_i h) [+ logsumexp_y (d + U h)_y]                      (binary v)
            c'h + 1/2 |b + W h|^2 - 1/2 |b|^2 + V/2 log 2 pi [+ logsumexp_y (d + U h)_y]     (Gaussian v)

        Since Z = sum_h p*(h), every h gives a hard lower bound log Z >= log p*(h).

        Parameters
        ----------
        h : torch.Tensor
            ``(chains, n_hidden)`` binary hidden states.

        Returns
        -------
        torch.Tensor
            ``(chains,)`` log p*(h).

        Raises
        ------
        ConfigError
            From the visible layer, for a semi-RBM (its coupled pixels have no closed-form sum).
        """
        out = h @ self.c + self.visible_layer.log_normaliser(self.b + h @ self.W.T, self.b)
        if self.n_labels:
            out = out + torch.logsumexp(self.d + h @ self.U.T, -1)
        return out

    def x_mode_given_h(self, h: torch.Tensor) -> torch.Tensor:
        """The most probable x given h when the pixels are independent given h (used to find probe states).

        Lateral weights are ignored, so for a semi-RBM this is only an approximation: used to find probe states,
        never for sampling. The label is the argmax of d + U h.

        Parameters
        ----------
        h : torch.Tensor
            ``(chains, n_hidden)`` binary hidden states.

        Returns
        -------
        torch.Tensor
            ``(chains, n_pixels + n_labels)`` x = [v, y]: binary pixels on where b + W h > 0 (Gaussian pixels: the
            mean b + W h), and a one-hot label.
        """
        v = self.visible_layer.mode(self.b + h @ self.W.T)
        if not self.n_labels:
            return v
        y = F.one_hot((self.d + h @ self.U.T).argmax(-1), self.n_labels).to(v.dtype)
        return torch.cat([v, y], -1)

    # ---- conditionals at inverse temperature beta ---------------------------------------------------
    def h_given_x(self, x: torch.Tensor, beta=1.0, hidden_input: torch.Tensor | None = None) -> torch.Tensor:
        """The hidden units' conditional ``p_beta(h = 1 | x) = sigmoid(beta a(x))`` at inverse temperature beta.

        ``hidden_input`` passes a(x) when the caller has it.

        Parameters
        ----------
        x : torch.Tensor
            ``(chains, n_pixels + n_labels)`` rows x = [v, y].
        beta : float or torch.Tensor, default 1.0
            Inverse temperature beta: a scalar, or ``(chains,)`` one per chain.
        hidden_input : torch.Tensor or None, default None
            ``(chains, n_hidden)`` a(x) = c + v'W + y'U (untempered), when already computed; None computes it.

        Returns
        -------
        torch.Tensor
            ``(chains, n_hidden)`` probabilities, independent given x.
        """
        return torch.sigmoid(temper(beta, self.hidden_input(x) if hidden_input is None else hidden_input))

    def sample_h(self, x: torch.Tensor, beta=1.0, generator=None, hidden_input: torch.Tensor | None = None) -> torch.Tensor:
        """Draw h ~ p_beta(h | x): independent binary units with the probabilities of ``h_given_x``.

        Parameters
        ----------
        x : torch.Tensor
            ``(chains, n_pixels + n_labels)`` rows x = [v, y].
        beta : float or torch.Tensor, default 1.0
            Inverse temperature beta: a scalar, or ``(chains,)`` one per chain.
        generator : torch.Generator or None, default None
            Source of randomness; None uses torch's global generator.
        hidden_input : torch.Tensor or None, default None
            ``(chains, n_hidden)`` a(x) (untempered), when already computed; None computes it.

        Returns
        -------
        torch.Tensor
            ``(chains, n_hidden)`` binary states, in the dtype of the probabilities.
        """
        return bernoulli_sample(self.h_given_x(x, beta, hidden_input), generator)

    @property
    def fused_gibbs(self) -> bool:
        """Whether the compiled block-Gibbs kernels (``nvil.mcmc.gibbs``) cover this model.

        They do for binary pixels, with no labels and no lateral weights.
        """
        return self.visible_layer.fused_gibbs and not self.n_labels

    def sample_x_given_h(self, h: torch.Tensor, beta=1.0, generator=None, x: torch.Tensor | None = None,
                         reverse: bool = False, base: BaseRate | None = None) -> torch.Tensor:
        """Draw x ~ p_beta(x | h), of exp(-beta E) or, with a base-rate model, exp(-(1 - beta) E_A - beta E).

        For the semi-RBM the pixels are a pairwise MRF given h: one sequential Gibbs sweep over them
        (``visible_update=sequential``, starting from ``x``; in index order, or the opposite order with
        ``reverse``), or damped mean-field probabilities (``mean_field``, an approximation for CD only). Otherwise
        the pixels are independent given h: Bernoulli with logits beta (b + W h) + (1 - beta) b_A, or Gaussian
        with that field divided by the precision (beta, or 1 on the base-rate path) as mean and its inverse as
        variance. The label is drawn from softmax(beta (d + U h) + (1 - beta) d_A) and appended one-hot.

        Parameters
        ----------
        h : torch.Tensor
            ``(chains, n_hidden)`` binary hidden states.
        beta : float or torch.Tensor, default 1.0
            Inverse temperature beta: a scalar, or ``(chains,)`` one per chain.
        generator : torch.Generator or None, default None
            Source of randomness; None uses torch's global generator.
        x : torch.Tensor or None, default None
            ``(chains, n_pixels + n_labels)`` the chains' current x, where a semi-RBM's sequential sweep starts
            (None: all pixels off); the other kinds of pixel ignore it.
        reverse : bool, default False
            Sweep a semi-RBM's pixels in the opposite order (the reverse transition, as tempered transitions need).
        base : BaseRate or None, default None
            The base-rate model A (biases b_A, d_A) of the AIS path E_beta = (1 - beta) E_A + beta E; None tempers
            the model alone, exp(-beta E).

        Returns
        -------
        torch.Tensor
            ``(chains, n_pixels + n_labels)`` x = [v, y] (with ``mean_field``, the pixels are probabilities).
        """
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
        """Number of latent units an estimator sums over: ``n_hidden``."""
        return self.n_hidden

    def check_exact(self, max_units: int = 20) -> None:
        """Raise a one-line ConfigError unless log Z can be enumerated.

        ``log_z_exact`` enumerates the hidden units (2^H states) or, for a semi-RBM, the pixels (2^V states).

        Parameters
        ----------
        max_units : int, default 20
            Most units that may be enumerated: H, or V for a semi-RBM.

        Raises
        ------
        ConfigError
            If H > ``max_units`` (no lateral weights), or V > ``max_units`` (a semi-RBM).
        """
        if self.L is not None and self.n_pixels > max_units:
            raise ConfigError(f"exact log Z of a semi-RBM enumerates its {self.n_pixels} pixels; the limit is {max_units}")
        if self.L is None and self.n_hidden > max_units:
            raise ConfigError(f"exact log Z enumerates 2^H hidden states and is limited to H <= {max_units}; "
                              f"this model has H = {self.n_hidden}")

    def log_z_exact(self, max_units: int = 20, chunk_elements: int = 2**24, *, grad: bool = False) -> torch.Tensor:
        """The exact log partition function log Z, by enumerating the smaller side of the machine.

        log Z by enumerating the hidden units (2^H states) with x summed out analytically, or, when lateral
        connections couple the pixels, the pixels (2^V states, each with every label) with h summed out. No autograd
        graph unless ``grad`` (its gradient: the model's expectation of -dE/dtheta, exact maximum likelihood's
        negative phase).

        Parameters
        ----------
        max_units : int, default 20
            Most units that may be enumerated (``check_exact``).
        chunk_elements : int, default 2**24
            Tensor elements (states times units) per enumerated batch, which bounds the memory used.
        grad : bool, default False
            Keep the autograd graph, so that log Z can be differentiated in the parameters.

        Returns
        -------
        torch.Tensor
            0-dimensional log Z (at beta = 1), in the parameters' dtype and device.

        Raises
        ------
        ConfigError
            From ``check_exact``, when the side to enumerate has more than ``max_units`` units.
        """
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
        """The exact log p(x) = -F(x) - log Z (log densities for Gaussian visibles).

        Parameters
        ----------
        x : torch.Tensor
            ``(chains, n_pixels + n_labels)`` rows x = [v, y].
        log_z : torch.Tensor or None, default None
            log Z, when already computed (``log_z_exact()``); None enumerates it in every call, with its autograd
            graph.

        Returns
        -------
        torch.Tensor
            ``(chains,)`` log p(x).

        Raises
        ------
        ConfigError
            When ``log_z`` is None and the model is too large to enumerate (``check_exact``).
        """
        return -self.free_energy(x) - (self.log_z_exact(grad=True) if log_z is None else log_z)

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None, gibbs_sweeps: int = 1000):
        """Draw ``n`` approximate samples (v, h) from p(v, h) by block Gibbs sampling.

        ``gibbs_sweeps`` block-Gibbs sweeps from uniform h: h uniform, x ~ p(x | h), then each sweep
        h ~ p(h | x), x ~ p(x | h), all at beta = 1 and without autograd.

        Parameters
        ----------
        n : int
            Number of independent chains, one sample each.
        generator : torch.Generator or None, default None
            Source of randomness; None uses torch's global generator.
        gibbs_sweeps : int, default 1000
            Block-Gibbs sweeps after the first draw of x.

        Returns
        -------
        tuple of torch.Tensor
            ``(v, h)``: v ``(n, n_visible)`` rows x = [v, y] (pixels and one-hot labels), h ``(n, n_hidden)`` binary.
        """
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
        """Chains started at data (or any) x, with h drawn from p(h | x).

        Parameters
        ----------
        x : torch.Tensor
            ``(chains, n_pixels + n_labels)`` starting rows x = [v, y]; copied, never modified.
        generator : torch.Generator or None, default None
            Source of randomness; None uses torch's global generator.

        Returns
        -------
        State
            ``State(x, h)``: a copy of ``x`` and h ``(chains, n_hidden)`` ~ p(h | x) at beta = 1.
        """
        return State(x.clone(), self.sample_h(x, 1.0, generator))
