"""Visible-layer types: what a model's observed units are, as one object that answers for them, so models never
switch on the ``visible`` string. The models keep their parameters (and ``model.visible``, the config name that
checkpoints carry); a layer object holds no parameters and takes them as arguments.

Two kinds of model ask a layer different things:

- directed models (SBN, fDARN, Gaussian belief nets) emit ``out`` from the parents, logits or means:
  ``log_prob(out, x)``, ``sample(out)``, ``mean(out)`` (what sample grids show) and ``bias_from_mean`` (the
  output bias at the data marginals);
- Boltzmann machines ask for the visible terms of the energy, ``energy(v, b)``, and, given the tempered field
  f = beta (b + W h) (+ (1 - beta) b_A on the AIS path from a base rate), ``sample_field``, ``mode`` and
  ``log_normaliser`` (the visibles summed out of exp(v'W h - E_vis(v))). ``sample_field`` is given every
  keyword a layer may need (``beta``, ``precision``, ``lateral``, ``start``, ``reverse``); each type reads its
  own. ``base_log_z`` and ``sample_base`` answer for the base-rate model AIS starts from (Salakhutdinov &
  Murray 2008).

``VISIBLE`` maps config names to types. The directed models call binary units ``bernoulli`` and the Boltzmann
machines ``binary``: both names are one type (each model still accepts only its own names, with its own error).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from nvil.backend import native
from nvil.backend.accel import accelerate
from nvil.backend.native import triton_sweep
from nvil.backend.native.bernoulli_log_prob import bernoulli_log_prob
from nvil.core.errors import ConfigError

LOG_2PI = math.log(2 * math.pi)


def bernoulli_sample(p: torch.Tensor, generator) -> torch.Tensor:
    """x ~ Bernoulli(p), one uniform per unit: u < p."""
    return (torch.rand(p.shape, generator=generator, device=p.device, dtype=p.dtype) < p).to(p.dtype)


def gaussian_log_prob(x: torch.Tensor, mean, log_sigma) -> torch.Tensor:
    """log N(x; mean, diag exp(log_sigma)^2), summed over the last dimension."""
    z = (x - mean) * torch.exp(-log_sigma)
    return (-0.5 * z * z - log_sigma - 0.5 * LOG_2PI).sum(-1)


def log_odds(p: torch.Tensor) -> torch.Tensor:
    """log p - log(1 - p)."""
    return torch.log(p) - torch.log1p(-p)


class Visible:
    """What every visible-layer type answers to; ``build`` makes one from the model's options."""

    name: str
    fused_gibbs = False  # covered by the compiled block-Gibbs kernels of ``nvil.mcmc.gibbs``
    discrete = False  # states can be enumerated and thresholded (hard bounds on log Z probe them)
    has_noise_scale = False  # a Gaussian net learns the noise scale sigma_x of these units

    @classmethod
    def build(cls, doc_length: int = 100) -> "Visible":
        return cls()

    def bias_from_mean(self, mean: torch.Tensor, eps: float = 1e-3, logit=log_odds) -> torch.Tensor:
        """The bias that puts the units at the data marginals ``mean`` (Bernoulli clamps to [eps, 1 - eps] and
        takes ``logit``, which the Gaussian nets give as ``torch.logit``: it rounds differently)."""
        return mean

    def accelerate(self, mode: str, device=None) -> "Visible":
        """Apply ``trainer.accel`` to a sampler of the layer's own (the semi-RBM's pixel sweep); most layers have
        none, and nothing changes."""
        return self


class Bernoulli(Visible):
    """Binary units: p(x | a) = prod_i sigmoid(a_i)^x_i (1 - sigmoid(a_i))^(1 - x_i); energy -b'v."""

    name = "bernoulli"
    fused_gibbs = True
    discrete = True

    def log_prob(self, out: torch.Tensor, x: torch.Tensor, log_sigma=None) -> torch.Tensor:
        return bernoulli_log_prob(out, x)

    def mean(self, out: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(out)

    def sample(self, out: torch.Tensor, generator=None, log_sigma=None) -> torch.Tensor:
        return bernoulli_sample(torch.sigmoid(out), generator)

    def bias_from_mean(self, mean: torch.Tensor, eps: float = 1e-3, logit=log_odds) -> torch.Tensor:
        return logit(mean.clamp(eps, 1 - eps))

    def energy(self, v: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return -(v @ b)

    def as_state(self, v: torch.Tensor) -> torch.Tensor:
        """Probabilities (data, a DBN's up-pass) made a valid state: thresholded at 0.5."""
        return (v > 0.5).to(v.dtype)

    def base_rate_bias(self, v_mean: torch.Tensor, smoothing: float) -> torch.Tensor:
        """The base-rate model's biases (Salakhutdinov & Murray 2008, Sec. 4.1): the log-odds of the smoothed pixel
        means."""
        p = (v_mean + smoothing) / (1 + 2 * smoothing)
        return torch.log(p) - torch.log1p(-p)

    def sample_field(self, field: torch.Tensor, generator=None, **_) -> torch.Tensor:
        """v ~ p(v | h): independent units with logits ``field``."""
        return bernoulli_sample(torch.sigmoid(field), generator)

    def mode(self, field: torch.Tensor) -> torch.Tensor:
        return (field > 0).to(field.dtype)

    def log_normaliser(self, field: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """log sum_v exp(v'field) = sum_i softplus(field_i)."""
        return F.softplus(field).sum(-1)

    def base_log_z(self, b: torch.Tensor) -> float:
        return F.softplus(b.double()).sum().item()

    def sample_base(self, b: torch.Tensor, n: int, generator=None) -> torch.Tensor:
        return (torch.rand(n, b.shape[-1], generator=generator, device=b.device) < torch.sigmoid(b)).to(b.dtype)


BLOCK = 32  # pixels per block of the semi-RBM's sequential sweep


def lateral_block(fields: torch.Tensor, thresholds: torch.Tensor, old: torch.Tensor, lateral: torch.Tensor,
                  beta: torch.Tensor) -> torch.Tensor:
    """The B single-site updates of one block of laterally coupled binary units, in order: unit k turns on
    where its field exceeds the logit of its uniform (u < sigmoid(field)), and its change moves the block's
    later fields by beta (v_k' - v_k) L_k (the in-block correction; L has a zero diagonal). ``fields``: the
    block's fields at its start; ``thresholds``, ``old``: [chains, B]; ``lateral``: L's [B, B] block;
    ``beta``: a scalar or [chains, 1] tensor. A function of tensors, so ``nvil.backend.accel`` may compile it."""
    new = []
    for k in range(fields.shape[1]):
        v_k = (fields[:, k] > thresholds[:, k]).to(fields.dtype)
        fields = fields + (beta * (v_k - old[:, k])[:, None]) * lateral[k]
        new.append(v_k)
    return torch.stack(new, 1)


def blocked_sweep(field, v, thresholds, lateral, beta, block=lateral_block, size: int = BLOCK) -> torch.Tensor:
    """One sequential sweep over the units in index order, ``size`` at a time: each block's fields
    field + beta v L[:, block] come from the current v in one matmul, then ``block`` makes its updates with
    L's [B, B] block (the same chain as one unit at a time, up to rounding). Writes into and returns v."""
    n = field.shape[-1]
    for lo in range(0, n, size):
        hi = min(lo + size, n)
        fields = field[:, lo:hi] + beta * (v @ lateral[:, lo:hi])
        v[:, lo:hi] = block(fields, thresholds[:, lo:hi], v[:, lo:hi], lateral[lo:hi, lo:hi], beta)
    return v


def native_sweep(field, v, thresholds, lateral, beta, reverse: bool = False) -> torch.Tensor:
    """The same sweep as one C call (``nvil.backend.native.lateral_sweep``, ``accel=native``): per block of units their fields
    field + beta v L from the current v (a register-tiled product over chains where the CPU has AVX-512, else sums of
    the rows of L of the units that are on), then the block's decisions in order, unit j on where its field exceeds
    ``thresholds[:, j]`` (the eager sweep's, so the same chain up to rounding); ``reverse``: units in the opposite
    order. Writes into and returns v."""
    chains = field.shape[0]
    jscale = torch.as_tensor(beta, dtype=field.dtype).reshape(-1).expand(chains).contiguous()
    native.lateral_sweep(v, field.contiguous(), thresholds.contiguous(), jscale, reverse, lateral.contiguous())
    return v


class LateralBernoulli(Bernoulli):
    """Binary units joined by symmetric lateral weights L with a zero diagonal: the semi-restricted BM's pixels
    (Osindero & Hinton 2008; Salakhutdinov 2009, Sec. 4). Given h they form a pairwise MRF, so ``sample_field``
    makes one sequential Gibbs sweep over them (``update="sequential"``: from ``start``, in index order, or the
    opposite order with ``reverse``, which leaves p_beta(v | h) invariant), or returns ten damped mean-field
    iterations (``update="mean_field"``: an approximation, for CD reconstructions only). The lateral input is
    tempered by ``beta``; -1/2 v'L v stays in the model's energy, and log p*(h) has no closed form.

    The sweep is blocked (``blocked_sweep``): one matmul per ``BLOCK`` pixels instead of one matvec per pixel,
    and all uniforms drawn first, as their logits. ``accelerate("compile")`` compiles the in-block updates
    (``nvil.backend.accel``; a few seconds' compilation per chain count, so opt-in); ``accelerate("native")`` runs the whole
    sweep as one C call on the CPU (``native_sweep``), and on CUDA ``accel=auto`` runs it as one Triton kernel
    (``nvil.backend.native.triton_sweep.lateral_sweep``), both on the eager sweep's uniforms from the generator: one
    chain for a seed on every path, up to rounding."""

    fused_gibbs = False

    def __init__(self, update: str = "sequential") -> None:
        self.update = update
        self.block = lateral_block
        self.sweep_mode = "none"  # trainer.accel: native / auto run the sweep in C (nvil.backend.native)

    def accelerate(self, mode: str, device=None) -> "LateralBernoulli":
        self.block = accelerate(lateral_block, mode, device, "trainer.accel")
        self.sweep_mode = mode
        return self

    def sample_field(self, field: torch.Tensor, generator=None, *, beta: torch.Tensor, lateral: torch.Tensor,
                     start: torch.Tensor | None = None, reverse: bool = False, **_) -> torch.Tensor:
        if self.update == "mean_field":
            mu = torch.sigmoid(field)
            for _ in range(10):  # damped mean-field, as in Osindero & Hinton's reconstructions
                mu = 0.2 * mu + 0.8 * torch.sigmoid(field + beta * (mu @ lateral))
            return mu
        v = (start if start is not None else torch.zeros_like(field)).clone()
        u = torch.rand(field.shape, generator=generator, device=field.device, dtype=field.dtype)
        thresholds = log_odds(u)  # u < sigmoid(x) where x > logit(u)
        if native.wanted(self.sweep_mode, field.device):
            return native_sweep(field, v, thresholds, lateral, beta, reverse)  # in C, on the same thresholds
        if triton_sweep.wanted(self.sweep_mode, field.device) and triton_sweep.lateral_sweep(
                v, field, thresholds, beta, reverse, lateral):
            return v  # the whole sweep as one Triton kernel on CUDA (the eager sweep's uniforms and chain)
        if not reverse:
            return blocked_sweep(field, v, thresholds, lateral, beta, self.block)
        flip = lambda t: t.flip(-1)  # noqa: E731  (the reverse sweep: the forward one over reversed units)
        return flip(blocked_sweep(flip(field), flip(v), flip(thresholds), lateral.flip(0, 1), beta, self.block))

    def log_normaliser(self, field: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        raise ConfigError("log p*(h) of a semi-RBM has no closed form (its pixels are coupled)")


class Gaussian(Visible):
    """Real-valued units. Directed: N(out, diag exp(log_sigma)^2). Energy: 1/2 |v - b|^2 (unit variance), so
    at total precision p (beta, or 1 on the AIS path) v | h ~ N(field / p, 1 / p)."""

    name = "gaussian"
    has_noise_scale = True

    def log_prob(self, out: torch.Tensor, x: torch.Tensor, log_sigma=None) -> torch.Tensor:
        return gaussian_log_prob(x, out, log_sigma)

    def mean(self, out: torch.Tensor) -> torch.Tensor:
        return out

    def sample(self, out: torch.Tensor, generator=None, log_sigma=None) -> torch.Tensor:
        return out + torch.exp(log_sigma) * torch.randn(out.shape, generator=generator, device=out.device)

    def energy(self, v: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((v - b) ** 2).sum(-1)

    def as_state(self, v: torch.Tensor) -> torch.Tensor:
        return v

    def base_rate_bias(self, v_mean: torch.Tensor, smoothing: float) -> torch.Tensor:
        """The base-rate model's means: the pixel means (unit variance)."""
        return v_mean

    def sample_field(self, field: torch.Tensor, generator=None, *, precision: torch.Tensor, **_) -> torch.Tensor:
        noise = torch.randn(field.shape, generator=generator, device=field.device, dtype=field.dtype)
        return field / precision + noise / precision.sqrt()

    def mode(self, field: torch.Tensor) -> torch.Tensor:
        return field

    def log_normaliser(self, field: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """int exp(-1/2 |v - b|^2 + v'W h) dv = (2 pi)^{V/2} exp(1/2 |b + W h|^2 - 1/2 |b|^2), field = b + W h."""
        return 0.5 * (field**2).sum(-1) - 0.5 * (b**2).sum() + 0.5 * field.shape[-1] * math.log(2 * math.pi)

    def base_log_z(self, b: torch.Tensor) -> float:
        return 0.5 * b.shape[-1] * math.log(2 * math.pi)

    def sample_base(self, b: torch.Tensor, n: int, generator=None) -> torch.Tensor:
        return b + torch.randn(n, b.shape[-1], generator=generator, device=b.device, dtype=b.dtype)


class Multinomial(Visible):
    """Bag-of-words counts over a vocabulary (the document models of Mnih & Gregor 2014, Sec. 4.3):
    log p(x | out) = sum_w x_w log softmax(out)_w; a sampled document has ``doc_length`` words."""

    name = "multinomial"

    def __init__(self, doc_length: int = 100) -> None:
        self.doc_length = int(doc_length)

    @classmethod
    def build(cls, doc_length: int = 100) -> "Multinomial":
        return cls(doc_length)

    def log_prob(self, out: torch.Tensor, x: torch.Tensor, log_sigma=None) -> torch.Tensor:
        return (x * torch.log_softmax(out, dim=-1)).sum(-1)

    def mean(self, out: torch.Tensor) -> torch.Tensor:
        return torch.softmax(out, -1)

    def sample(self, out: torch.Tensor, generator=None, log_sigma=None) -> torch.Tensor:
        words = torch.multinomial(torch.softmax(out, -1), self.doc_length, replacement=True, generator=generator)
        return torch.zeros_like(out).scatter_add_(-1, words, torch.ones_like(words, dtype=out.dtype))

    def bias_from_mean(self, mean: torch.Tensor, eps: float = 1e-3, logit=log_odds) -> torch.Tensor:
        """The log of the mean word frequencies (smoothed by ``eps``)."""
        freq = mean + eps
        return torch.log(freq / freq.sum())


VISIBLE: dict[str, type[Visible]] = {"bernoulli": Bernoulli, "binary": Bernoulli, "gaussian": Gaussian,
                                     "multinomial": Multinomial}
