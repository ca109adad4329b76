"""The protocol a user's own latent-variable model follows to be scored by the certified estimators, and the
adapter through which the estimators see it.

A model is any object (an ``nn.Module`` or a plain namespace of functions; nothing to subclass) with

    latent = nvil.Latent.continuous(50)       # or Latent.binary(200), Latent.binary([100, 50]) (layers side by side)
    log_prior(z) -> [N]                       # log p(z), normalised
    log_likelihood(x, z) -> [N]               # log p(x | z), normalised in x
    sample_prior(n, generator) -> [n, D]      # optional: BDMC and the checks on simulated data need both samplers
    sample_likelihood(z, generator) -> [N, ...]
    proposal(x) -> torch.distributions.Distribution   # optional: q(z | x), batch shape [N] (event [D]) or [N, D]

z is always one tensor [N, D] (binary layers side by side: ``latent.split(z)`` gives them back); x is whatever the
model takes, with the examples along its first dimension. ``ProtocolModel`` checks the object once, in one line per
problem, and gives the estimators the densities they need: log p(x, z), a base density to anneal from (the prior, or
the proposal) and samples from it, each drawn from a ``torch.Generator`` so that a seed fixes every estimate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nvil.core.errors import ConfigError
from nvil.models.laplace import INFLATION, laplace_fit, start_point
from nvil.models.visible import bernoulli_sample

KINDS = ("continuous", "binary")
REQUIRED = ("log_prior", "log_likelihood")


@dataclass(frozen=True)
class Latent:
    """What the latent variable z of a user's model is: its kind and the sizes of its layers.

    ``kind`` (continuous | binary) and ``layers`` (the sizes of its layers, side by side in z; one layer for most
    models). Build one with ``Latent.continuous(size)`` or ``Latent.binary(size)``; ``nvil.Latent`` is this class.

    Parameters
    ----------
    kind : str
        ``"continuous"`` (z in R^D) or ``"binary"`` (z in {0, 1}^D).
    layers : tuple of int
        The sizes of z's layers, side by side along its last dimension: D = ``sum(layers)``.

    Raises
    ------
    ConfigError
        (``nvil.core.errors``) If ``kind`` is neither ``"continuous"`` nor ``"binary"``, or ``layers`` is empty or
        holds anything but positive integers.

    Examples
    --------
    >>> import torch
    >>> import nvil
    >>> latent = nvil.Latent.binary([3, 2])
    >>> latent
    Latent(kind='binary', layers=(3, 2))
    >>> latent.size, latent.binary_units
    (5, True)
    >>> [h.shape for h in latent.split(torch.zeros(4, 5))]
    [torch.Size([4, 3]), torch.Size([4, 2])]
    >>> nvil.Latent("gaussian", (2,))
    Traceback (most recent call last):
        ...
    nvil.core.errors.ConfigError: Latent.kind must be one of ['continuous', 'binary'], got 'gaussian'
    """

    kind: str
    layers: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"Latent.kind must be one of {list(KINDS)}, got {self.kind!r}")
        if not self.layers or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.layers):
            raise ConfigError(f"Latent layers must be positive integers, got {list(self.layers)}")

    @classmethod
    def continuous(cls, size: int | Sequence[int]) -> "Latent":
        """A continuous latent: z in R^size (a list: several layers side by side).

        Parameters
        ----------
        size : int or sequence of int
            D, the number of latent units, or the sizes of several layers side by side in z.

        Returns
        -------
        Latent
            ``Latent("continuous", layers)``.

        Raises
        ------
        ConfigError
            If ``size`` is neither an integer nor a list of positive integers.
        """
        return cls("continuous", _sizes(size))

    @classmethod
    def binary(cls, size: int | Sequence[int]) -> "Latent":
        """A binary latent: z in {0, 1}^size (a list: several layers side by side).

        Parameters
        ----------
        size : int or sequence of int
            D, the number of binary latent units, or the sizes of several layers side by side in z.

        Returns
        -------
        Latent
            ``Latent("binary", layers)``.

        Raises
        ------
        ConfigError
            If ``size`` is neither an integer nor a list of positive integers.
        """
        return cls("binary", _sizes(size))

    @property
    def size(self) -> int:
        """D, the number of latent units in all: the sum of ``layers`` (the width of z)."""
        return sum(self.layers)

    @property
    def binary_units(self) -> bool:
        """Whether z is binary (``kind == "binary"``), so that the estimators move it by Gibbs flips, not HMC."""
        return self.kind == "binary"

    def split(self, z: torch.Tensor) -> list[torch.Tensor]:
        """z [..., D] as its layers, [..., layers[i]] each.

        Parameters
        ----------
        z : torch.Tensor
            ``[..., D]`` latent values, the layers side by side along the last dimension.

        Returns
        -------
        list of torch.Tensor
            One view per layer, ``[..., layers[i]]``, in the order of ``layers``.
        """
        return list(torch.split(z, list(self.layers), dim=-1))


# ---- capabilities: what a model declares it offers, which the estimators and learners ask for ----------------
# A model lists them in its class attribute ``capabilities``; an algorithm asks ``capable(model, NAME)``, never
# for a family's name, so a new family with the same capabilities reaches the same algorithms unchanged.

FREE_ENERGY = "free_energy"
"""Hidden units summed in closed form: log p*(v) = -free_energy(v), exact block-Gibbs conditionals
(``sample_h`` / ``sample_x_given_h`` with ``beta``); log Z is the model's own (RBM, semi-RBM)."""
TOP_MACHINE = "top_machine"
"""log p(v) = log p*(v) - log Z of the bipartite Boltzmann machine ``model.top``, whose data rows are
``model.top_data(v)``; every estimator shares that log Z (DBN's top RBM, DBM's even | odd form)."""
VARIATIONAL_BOUND = "variational_bound"
"""``model.variational_bound(v)``: a per-row lower bound on log p*(v) from a mean-field posterior (DBM)."""
BINARY_LATENTS = "binary_latents"
"""Binary latent layers per example with ``latent_density(v)`` (log P*(v, h) and Gibbs conditionals) and an
approximate posterior (an inference network, or ``model.recognition()``)."""
CONTINUOUS_LATENTS = "continuous_latents"
"""Gaussian latents in a choice of parameterisations: ``log_prior(state, form)``, ``log_likelihood(x, state, form)``
and ``posterior(x, form)`` (its gradient in closed form) for HMC in ``form`` (Gaussian belief nets); in the net's
own form these are also the protocol's densities."""
ANCESTRAL = "ancestral"
"""Exact joint draws (h, v) by ancestral sampling: the simulated data of BDMC."""
CLOSED_FORM_LIKELIHOOD = "closed_form_likelihood"
"""p(v | h) in closed form given the latent layers the estimators sample (the harmonic mean needs it)."""
LAYER_STACK = "layer_stack"
"""A stack of RBMs (``model.rbms``) trained one layer at a time, with the greedy up-pass as its posterior."""
CLOSED_FORM_GRADIENT = "closed_form_gradient"
"""``posterior(x)``: z -> log p(z) + log p(x | z) for one row of x per chain, in the protocol's own z, with
``tempered(beta)`` (log p(z) + beta log p(x | z)) and ``value_and_grad(z)`` in closed form, so that an HMC move
needs no autograd graph (``nvil.backend.registry``, ``gaussian_closed_form_gradient``)."""
CAPABILITIES = (FREE_ENERGY, TOP_MACHINE, VARIATIONAL_BOUND, BINARY_LATENTS, CONTINUOUS_LATENTS, ANCESTRAL,
                CLOSED_FORM_LIKELIHOOD, LAYER_STACK, CLOSED_FORM_GRADIENT)


def capable(model, capability: str) -> bool:
    """Whether ``model`` declares ``capability`` (one of ``CAPABILITIES``) in its ``capabilities``.

    Estimators and learners ask this, never for a family's name, so that a new family with the same capabilities
    reaches the same algorithms unchanged.

    Parameters
    ----------
    model : object
        Any model; one without a ``capabilities`` attribute declares none.
    capability : str
        One of ``CAPABILITIES`` (``FREE_ENERGY``, ``TOP_MACHINE``, ``BINARY_LATENTS``, ...).

    Returns
    -------
    bool
        True if ``capability`` is in ``model.capabilities``.

    Raises
    ------
    ValueError
        If ``capability`` is not one of ``CAPABILITIES`` (a misspelt name would otherwise read as False).

    Examples
    --------
    >>> from nvil.models import RBM, VAE
    >>> from nvil.models.protocol import FREE_ENERGY, capable
    >>> capable(RBM(6, 4), FREE_ENERGY), capable(VAE(6, [2], [[4]]), FREE_ENERGY)
    (True, False)
    >>> capable(RBM(6, 4), "free_energies")
    Traceback (most recent call last):
        ...
    ValueError: unknown capability 'free_energies'; the capabilities are free_energy, ...
    """
    if capability not in CAPABILITIES:
        raise ValueError(f"unknown capability {capability!r}; the capabilities are {', '.join(CAPABILITIES)}")
    return capability in getattr(model, "capabilities", ())


def protocol_only(model) -> bool:
    """Whether the estimators see ``model`` through the protocol alone (no capability of the built-in families).

    The protocol is ``latent``, ``log_prior``, ``log_likelihood``, the samplers and a proposal: a user's model or
    the VAE, which declare no capability of the built-in families.

    Parameters
    ----------
    model : object
        Any model; one without a ``capabilities`` attribute declares none.

    Returns
    -------
    bool
        True if none of ``model.capabilities`` is one of ``CAPABILITIES``.

    Examples
    --------
    >>> from nvil.models import RBM, VAE
    >>> from nvil.models.protocol import protocol_only
    >>> protocol_only(VAE(6, [2], [[4]])), protocol_only(RBM(6, 4))
    (True, False)
    """
    return not any(c in CAPABILITIES for c in getattr(model, "capabilities", ()))


def follows_protocol(model) -> bool:
    """Whether ``model`` has the protocol's ``latent``, ``log_prior`` and ``log_likelihood``.

    True for a user's model, the VAE and the Gaussian nets, whatever capabilities they declare besides.

    Parameters
    ----------
    model : object
        Any model.

    Returns
    -------
    bool
        True if ``model.latent`` is a ``Latent`` and ``model.log_prior`` and ``model.log_likelihood`` are callable.

    Examples
    --------
    >>> from nvil.models import RBM, VAE
    >>> from nvil.models.protocol import follows_protocol
    >>> follows_protocol(VAE(6, [2], [[4]])), follows_protocol(RBM(6, 4))
    (True, False)
    """
    return isinstance(getattr(model, "latent", None), Latent) and all(
        callable(getattr(model, name, None)) for name in REQUIRED)


def _sizes(size) -> tuple[int, ...]:
    if isinstance(size, int) and not isinstance(size, bool):
        return (size,)
    if isinstance(size, Sequence) and not isinstance(size, str):
        return tuple(size)
    raise ConfigError(f"a Latent size must be an integer or a list of integers, got {size!r}")


def draw_seed(generator: torch.Generator) -> int:
    """A seed drawn from ``generator``: for draws made by code that takes no generator (a Distribution's sample).

    Parameters
    ----------
    generator : torch.Generator
        The source of randomness; the seed is drawn on its device and advances it.

    Returns
    -------
    int
        A seed in ``[0, 2**62)``, the same for the same generator state.

    Examples
    --------
    >>> import torch
    >>> from nvil.models.protocol import draw_seed
    >>> seed = draw_seed(torch.Generator().manual_seed(0))
    >>> 0 <= seed < 2**62, seed == draw_seed(torch.Generator().manual_seed(0))
    (True, True)
    """
    return int(torch.randint(0, 2**62, (), generator=generator, device=generator.device))


class ProtocolModel:
    """A user's model seen by the estimators: the protocol checked once, and the densities they combine.

    ``base`` is what AIS anneals from and IWAE samples from: ``prior`` (f_0 = p(z)) or ``proposal`` (f_0 = q(z | x));
    both are normalised, so exp(log w) is unbiased for p(x) in either case. Every density the user's model returns
    is checked to hold one value per row, each problem refused in one line.

    Parameters
    ----------
    obj : object
        The user's model: an ``nn.Module`` or any namespace with ``latent`` (a ``Latent``), ``log_prior(z)`` and
        ``log_likelihood(x, z)``, and optionally ``sample_prior(n, generator)``, ``sample_likelihood(z, generator)``
        and ``proposal(x)`` (the module's docstring).
    what : str, default "the model"
        How the error messages name the object.

    Attributes
    ----------
    latent : Latent
        ``obj.latent``.
    n_latent : int
        D, the width of z.
    binary : bool
        Whether z is binary.
    has_proposal : bool
        Whether ``obj`` defines ``proposal(x)``.
    can_simulate : bool
        Whether ``obj`` defines both ``sample_prior`` and ``sample_likelihood`` (BDMC, checks on simulated data).

    Raises
    ------
    ConfigError
        If ``obj`` lacks a callable ``log_prior`` or ``log_likelihood``, or its ``latent`` is not a ``Latent``.

    Examples
    --------
    >>> import types
    >>> import torch
    >>> from nvil.models.protocol import Latent, ProtocolModel, gaussian_log_prob
    >>> user = types.SimpleNamespace(
    ...     latent=Latent.continuous(2),
    ...     log_prior=gaussian_log_prob,
    ...     log_likelihood=lambda x, z: gaussian_log_prob(x - z),
    ...     sample_prior=lambda n, g: torch.randn(n, 2, generator=g),
    ...     sample_likelihood=lambda z, g: z + torch.randn(z.shape, generator=g))
    >>> model = ProtocolModel(user)
    >>> model.n_latent, model.binary, model.can_simulate, model.default_base()
    (2, False, True, 'laplace')
    >>> x = torch.zeros(3, 2)
    >>> model.log_joint(x, torch.zeros(3, 2))
    tensor([-3.6758, -3.6758, -3.6758])
    >>> model.base("prior", x).sample(5, torch.Generator().manual_seed(0)).shape
    torch.Size([5, 3, 2])
    >>> ProtocolModel(types.SimpleNamespace(latent=Latent.continuous(2)))
    Traceback (most recent call last):
        ...
    nvil.core.errors.ConfigError: the model (SimpleNamespace) lacks log_prior, log_likelihood: ...
    """

    needs_log_z = False  # log p(z) is normalised: no estimator subtracts a log Z

    def __init__(self, obj, what: str = "the model") -> None:
        missing = [name for name in REQUIRED if not callable(getattr(obj, name, None))]
        latent = getattr(obj, "latent", None)
        if missing:
            raise ConfigError(f"{what} ({type(obj).__name__}) lacks {', '.join(missing)}: a model for "
                              "evaluate_model needs latent, log_prior(z) and log_likelihood(x, z)")
        if not isinstance(latent, Latent):
            raise ConfigError(f"{what} ({type(obj).__name__}) needs an attribute latent = nvil.Latent.continuous(D) "
                              f"or nvil.Latent.binary(D), got {latent!r}")
        self.obj, self.latent, self.what = obj, latent, what
        self.n_latent = latent.size
        self.binary = latent.binary_units
        self.has_proposal = callable(getattr(obj, "proposal", None))
        self.can_simulate = callable(getattr(obj, "sample_prior", None)) and callable(
            getattr(obj, "sample_likelihood", None))

    # ---- the user's densities, shapes checked ----------------------------------------------------------------

    def _vector(self, value, n: int, name: str) -> torch.Tensor:
        if not torch.is_tensor(value) or value.shape != (n,):
            shape = tuple(value.shape) if torch.is_tensor(value) else type(value).__name__
            raise ConfigError(f"{self.what}.{name} must return one value per row, a tensor [{n}], got {shape}")
        return value

    def log_prior(self, z: torch.Tensor) -> torch.Tensor:
        """log p(z) from the user's ``log_prior``, its shape checked.

        Parameters
        ----------
        z : torch.Tensor
            ``[N, D]`` latent values.

        Returns
        -------
        torch.Tensor
            ``[N]`` log p(z), normalised.

        Raises
        ------
        ConfigError
            If the user's ``log_prior`` returns anything but a tensor of shape ``[N]``.
        """
        return self._vector(self.obj.log_prior(z), z.shape[0], "log_prior(z)")

    def log_likelihood(self, x, z: torch.Tensor) -> torch.Tensor:
        """log p(x | z) from the user's ``log_likelihood``, its shape checked.

        Parameters
        ----------
        x : object
            The data in whatever form the model takes, one example per row of z along the first dimension.
        z : torch.Tensor
            ``[N, D]`` latent values.

        Returns
        -------
        torch.Tensor
            ``[N]`` log p(x | z), normalised in x.

        Raises
        ------
        ConfigError
            If the user's ``log_likelihood`` returns anything but a tensor of shape ``[N]``.
        """
        return self._vector(self.obj.log_likelihood(x, z), z.shape[0], "log_likelihood(x, z)")

    def log_joint(self, x, z: torch.Tensor) -> torch.Tensor:
        """log p(x, z) = log p(z) + log p(x | z).

        Parameters
        ----------
        x : object
            The data in whatever form the model takes, one example per row of z along the first dimension.
        z : torch.Tensor
            ``[N, D]`` latent values.

        Returns
        -------
        torch.Tensor
            ``[N]`` log p(x, z): the log joint the estimators' importance weights are built from.
        """
        return self.log_prior(z) + self.log_likelihood(x, z)

    def sample_prior(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """n draws z ~ p(z) from the user's ``sample_prior``, their shape checked.

        Parameters
        ----------
        n : int
            Number of draws.
        generator : torch.Generator
            Source of randomness, passed to the user's sampler.

        Returns
        -------
        torch.Tensor
            ``[n, D]`` latent values.

        Raises
        ------
        ConfigError
            If the model defines no ``sample_prior``, or it returns anything but a tensor ``[n, D]``.
        """
        if not callable(getattr(self.obj, "sample_prior", None)):
            raise ConfigError(f"drawing from the prior needs {self.what}.sample_prior(n, generator), which it does "
                              "not define")
        z = self.obj.sample_prior(n, generator)
        if not torch.is_tensor(z) or z.shape != (n, self.n_latent):
            shape = tuple(z.shape) if torch.is_tensor(z) else type(z).__name__
            raise ConfigError(f"{self.what}.sample_prior(n, generator) must return [n, {self.n_latent}], got {shape}")
        return z

    def sample_likelihood(self, z: torch.Tensor, generator: torch.Generator):
        """x ~ p(x | z), one per row of z, from the user's ``sample_likelihood``, its first dimension checked.

        Parameters
        ----------
        z : torch.Tensor
            ``[N, D]`` latent values.
        generator : torch.Generator
            Source of randomness, passed to the user's sampler.

        Returns
        -------
        torch.Tensor
            ``[N, ...]`` simulated data, one row per row of z.

        Raises
        ------
        ConfigError
            If the model defines no samplers (``require_simulation``), or ``sample_likelihood`` returns anything
            but a tensor with N rows.
        """
        self.require_simulation("sample_likelihood")
        x = self.obj.sample_likelihood(z, generator)
        if not torch.is_tensor(x) or x.shape[0] != z.shape[0]:
            shape = tuple(x.shape) if torch.is_tensor(x) else type(x).__name__
            raise ConfigError(f"{self.what}.sample_likelihood(z, generator) must return one x per row of z "
                              f"([{z.shape[0]}, ...]), got {shape}")
        return x

    def require_simulation(self, purpose: str) -> None:
        """Refuse ``purpose`` unless the model defines both ``sample_prior`` and ``sample_likelihood``.

        Parameters
        ----------
        purpose : str
            What needs the samplers (BDMC, a check on simulated data), as the error message names it.

        Raises
        ------
        ConfigError
            If ``sample_prior(n, generator)`` or ``sample_likelihood(z, generator)`` is missing.
        """
        if not self.can_simulate:
            raise ConfigError(f"{purpose} needs {self.what}.sample_prior(n, generator) and "
                              "sample_likelihood(z, generator), which it does not define")

    # ---- the base density f_0: the prior or the proposal q(z | x) ---------------------------------------------

    def base(self, kind: str, x) -> "BaseDensity":
        """The base density f_0 for the rows of ``x``: the prior p(z) or the proposal q(z | x).

        Parameters
        ----------
        kind : str
            ``"prior"`` (f_0 = p(z), drawn by ``sample_prior``), ``"proposal"`` (f_0 = q(z | x) from
            ``proposal(x)``) or ``"laplace"`` (continuous z: f_0 = N(z*, c^2 H^-1), ``LaplaceBase``).
        x : object
            The data, N examples along its first dimension.

        Returns
        -------
        BaseDensity
            A ``PriorBase``, ``ProposalBase`` or ``LaplaceBase`` for the N rows of ``x``.

        Raises
        ------
        ConfigError
            If ``kind`` is none of these, or the model lacks what it needs (``sample_prior`` for the prior,
            ``proposal`` for the proposal, continuous z for the Laplace fit).
        """
        if kind == "prior":
            if not callable(getattr(self.obj, "sample_prior", None)):
                raise ConfigError(f"starting from the prior needs {self.what}.sample_prior(n, generator); define it, "
                                  "or give a proposal(x) and use start=proposal")
            return PriorBase(self, x.shape[0])
        if kind == "proposal":
            if not self.has_proposal:
                raise ConfigError(f"start=proposal needs {self.what}.proposal(x) returning q(z | x) as a "
                                  "torch.distributions.Distribution; it defines none (use start=prior)")
            return ProposalBase(self, x)
        if kind == "laplace":
            if self.binary:
                raise ConfigError("start=laplace fits a Gaussian to a continuous posterior; this model's latent "
                                  f"units are binary (use start=prior{' or proposal' if self.has_proposal else ''})")
            return LaplaceBase(self, x)
        raise ConfigError(f"the base density must be prior, proposal or laplace, got {kind!r}")

    def default_base(self) -> str:
        """The base density used when none is asked for.

        ``"proposal"`` if the model defines one; else, for continuous z, ``"laplace"`` (a Gaussian fitted at each row's posterior mode, ``LaplaceBase``: close to a
        sharp posterior where the prior is far from it); else ``"prior"``. A model may name its own
        (``default_start = "prior"``, as the Gaussian nets' sampler form does for the AIS-HMC of their papers).

        Returns
        -------
        str
            ``"proposal"``, ``"laplace"`` or ``"prior"``, a ``kind`` for ``base``.
        """
        declared = getattr(self.obj, "default_start", None)
        if declared is not None:
            return declared
        if self.has_proposal:
            return "proposal"
        if not self.binary:
            return "laplace"
        return "prior"


class BaseDensity:
    """f_0 of a path, normalised: ``log_prob(z)`` [N] and ``sample(k, generator)`` [k, N, D] for N rows of x.

    Made for the N rows of x it was built with (the prior ignores x); ``ProtocolModel.base`` gives one. Subclasses
    (``PriorBase``, ``ProposalBase``) set ``name`` and implement both methods.

    Attributes
    ----------
    name : str
        ``"prior"`` or ``"proposal"``.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import VAE
    >>> from nvil.models.protocol import BaseDensity, ProtocolModel
    >>> f0 = ProtocolModel(VAE(6, [2], [[4]])).base("proposal", torch.zeros(3, 6))
    >>> isinstance(f0, BaseDensity), f0.name
    (True, 'proposal')
    >>> z = f0.sample(5, torch.Generator().manual_seed(0))
    >>> z.shape, f0.log_prob(z).shape
    (torch.Size([5, 3, 2]), torch.Size([5, 3]))
    """

    name: str

    def log_prob(self, z: torch.Tensor) -> torch.Tensor:
        """log f_0(z) for z [..., N, D] -> [..., N], normalised.

        Parameters
        ----------
        z : torch.Tensor
            ``[..., N, D]`` latent values, one row of x per position along N.

        Returns
        -------
        torch.Tensor
            ``[..., N]`` log f_0(z).

        Raises
        ------
        NotImplementedError
            Always: a subclass implements it.
        """
        raise NotImplementedError

    def sample(self, k: int, generator: torch.Generator) -> torch.Tensor:
        """k draws for each of the N rows: [k, N, D].

        Parameters
        ----------
        k : int
            Number of draws per row (chains, or IWAE's K).
        generator : torch.Generator
            Source of randomness: a seed fixes the draws.

        Returns
        -------
        torch.Tensor
            ``[k, N, D]`` draws from f_0.

        Raises
        ------
        NotImplementedError
            Always: a subclass implements it.
        """
        raise NotImplementedError


class PriorBase(BaseDensity):
    """f_0 = p(z), the user's normalised prior, for ``rows`` rows of x (which it ignores).

    Parameters
    ----------
    model : ProtocolModel
        The checked model whose ``log_prior`` and ``sample_prior`` it calls.
    rows : int
        N, the number of rows of x it draws for.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import VAE
    >>> from nvil.models.protocol import PriorBase, ProtocolModel
    >>> f0 = PriorBase(ProtocolModel(VAE(6, [2], [[4]])), rows=3)
    >>> z = f0.sample(5, torch.Generator().manual_seed(0))
    >>> z.shape, f0.log_prob(z).shape
    (torch.Size([5, 3, 2]), torch.Size([5, 3]))
    """

    name = "prior"

    def __init__(self, model: ProtocolModel, rows: int) -> None:
        self.model, self.rows = model, rows

    def log_prob(self, z: torch.Tensor) -> torch.Tensor:
        """log p(z) for z [..., N, D] -> [..., N].

        Parameters
        ----------
        z : torch.Tensor
            ``[..., N, D]`` latent values.

        Returns
        -------
        torch.Tensor
            ``[..., N]`` log p(z).
        """
        return self.model.log_prior(z.reshape(-1, z.shape[-1])).view(z.shape[:-1])

    def sample(self, k: int, generator: torch.Generator) -> torch.Tensor:
        """k draws z ~ p(z) for each of the N rows, made as one call ``sample_prior(k * N, generator)``.

        Parameters
        ----------
        k : int
            Number of draws per row.
        generator : torch.Generator
            Source of randomness.

        Returns
        -------
        torch.Tensor
            ``[k, N, D]`` draws from the prior.
        """
        return self.model.sample_prior(k * self.rows, generator).view(k, self.rows, -1)


class ProposalBase(BaseDensity):
    """f_0 = q(z | x) from the user's ``proposal(x)``, its draws taken from our generator.

    ``proposal(x)`` is a Distribution with batch shape [N] and event shape [D], or batch shape [N, D] (a factorised
    q, summed over D). Its draws come from our generator (``generator_sample``), so a seed fixes them, and a
    Bernoulli or Normal q draws exactly as the built-in inference networks do.

    Parameters
    ----------
    model : ProtocolModel
        The checked model whose ``proposal`` it calls.
    x : object
        The data, N examples along its first dimension; ``proposal(x)`` is called once, here.

    Raises
    ------
    ConfigError
        If ``proposal(x)`` is not a ``torch.distributions.Distribution``, or its batch and event shapes together are
        not ``[N, D]``.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import VAE
    >>> from nvil.models.protocol import ProposalBase, ProtocolModel
    >>> f0 = ProposalBase(ProtocolModel(VAE(6, [2], [[4]])), torch.zeros(3, 6))
    >>> f0.factorised
    False
    >>> z = f0.sample(5, torch.Generator().manual_seed(0))
    >>> z.shape, f0.log_prob(z).shape
    (torch.Size([5, 3, 2]), torch.Size([5, 3]))
    """

    name = "proposal"

    def __init__(self, model: ProtocolModel, x) -> None:
        self.model = model
        self.q = model.obj.proposal(x)
        if not isinstance(self.q, torch.distributions.Distribution):
            raise ConfigError(f"{model.what}.proposal(x) must return a torch.distributions.Distribution, got "
                              f"{type(self.q).__name__}")
        n, d = x.shape[0], model.n_latent
        shape = tuple(self.q.batch_shape) + tuple(self.q.event_shape)
        if shape != (n, d):
            raise ConfigError(f"{model.what}.proposal(x) must have batch and event shape [{n}, {d}] together "
                              f"(one q(z | x) per row of x over z in R^{d} or {{0, 1}}^{d}), got {list(shape)}")
        self.factorised = len(self.q.event_shape) == 0

    def log_prob(self, z: torch.Tensor) -> torch.Tensor:
        """log q(z | x) for z [..., N, D] -> [..., N].

        A factorised q (batch shape [N, D]) is summed over D.

        Parameters
        ----------
        z : torch.Tensor
            ``[..., N, D]`` latent values.

        Returns
        -------
        torch.Tensor
            ``[..., N]`` log q(z | x).
        """
        lp = self.q.log_prob(z)
        return lp.sum(-1) if self.factorised else lp

    def sample(self, k: int, generator: torch.Generator) -> torch.Tensor:
        """k draws z ~ q(z | x) for each of the N rows, from ``generator`` (``generator_sample``).

        Parameters
        ----------
        k : int
            Number of draws per row.
        generator : torch.Generator
            Source of randomness: a seed fixes the draws.

        Returns
        -------
        torch.Tensor
            ``[k, N, D]`` draws from the proposal.
        """
        return generator_sample(self.q, k, generator)


class LaplaceBase(ProposalBase):
    """f_0 = N(z*, c^2 H^-1) for each row of x: the Laplace fit of its posterior, widened (``nvil.models.laplace``).

    z* is the row's posterior mode and H the negative Hessian of log p(x, z) there (Bishop 2006, Sec. 4.4), found by
    damped Newton steps with Hessians from differences of autograd gradients; c is ``laplace.INFLATION``. Rows of
    x that are equal (an example repeated for its chains) are fitted once. As an annealing path's base it also
    gives HMC a diagonal mass matrix, M^-1 = diag(c^2 H^-1) (``inv_mass``), and a first step size in those units
    (``unit_step``: the square root of the smallest eigenvalue of the base's correlation matrix, over c), so
    that the moves are scaled to the posterior, however sharp it is. It is a q(z | x) built from the model itself:
    its density and draws are ``ProposalBase``'s.

    Parameters
    ----------
    model : ProtocolModel
        The checked model (continuous z) whose ``log_joint`` it fits; ``sample_prior``, where defined, gives
        starting points besides z = 0.
    x : torch.Tensor
        ``[N, ...]`` rows of data.

    Attributes
    ----------
    loc : torch.Tensor
        ``[N, D]`` the modes z*.
    scale_tril : torch.Tensor
        ``[N, D, D]`` the Cholesky factors of c^2 H^-1.
    inv_mass : torch.Tensor
        ``[N, D]`` the diagonal of c^2 H^-1.
    unit_step : torch.Tensor
        ``[N]`` the first HMC step size with that mass matrix.

    Raises
    ------
    ConfigError
        If ``x`` is not a tensor (rows must be compared and repeated).

    Examples
    --------
    On a linear-Gaussian model the Laplace fit is the posterior itself:

    >>> import math
    >>> import torch
    >>> import nvil
    >>> from nvil.models.protocol import LaplaceBase, ProtocolModel
    >>> class Linear(torch.nn.Module):
    ...     latent = nvil.Latent.continuous(2)
    ...     def log_prior(self, z):
    ...         return -0.5 * z.square().sum(-1) - math.log(2 * math.pi)
    ...     def log_likelihood(self, x, z):
    ...         return (-0.5 * ((x - z.sum(-1, keepdim=True)) / 0.1).square() - math.log(0.1)
    ...                 - 0.5 * math.log(2 * math.pi)).sum(-1)
    >>> f0 = LaplaceBase(ProtocolModel(Linear()), torch.tensor([[1.0], [1.0], [-2.0]]))
    >>> [round(v, 3) for v in f0.loc[0].tolist()]  # the posterior mean, x / (2 + 0.01) per unit
    [0.498, 0.498]
    >>> f0.sample(4, torch.Generator().manual_seed(0)).shape, f0.log_prob(f0.loc).shape
    (torch.Size([4, 3, 2]), torch.Size([3]))
    """

    name = "laplace"

    def __init__(self, model: ProtocolModel, x) -> None:
        if not isinstance(x, torch.Tensor):
            raise ConfigError(f"start=laplace needs the data as a tensor, got {type(x).__name__}")
        unique, inverse = torch.unique(x.reshape(x.shape[0], -1), dim=0, return_inverse=True)
        rows = unique.reshape(-1, *x.shape[1:])
        draw = model.sample_prior if callable(getattr(model.obj, "sample_prior", None)) else None
        z0 = start_point(model.log_joint, rows, rows.shape[0], model.n_latent, draw)
        mode, lam, vec = laplace_fit(model.log_joint, rows, z0)
        cov = (vec * (INFLATION**2 / lam)[:, None, :]) @ vec.transpose(1, 2)               # c^2 H^-1, float64
        sd = cov.diagonal(dim1=1, dim2=2).sqrt()
        unit = torch.linalg.eigvalsh(cov / (sd[:, :, None] * sd[:, None, :]))[:, 0].clamp(min=0).sqrt() / INFLATION
        self.loc = mode[inverse]
        self.scale_tril = torch.linalg.cholesky(cov).to(mode.dtype)[inverse]
        self.inv_mass = sd.square().to(mode.dtype)[inverse]
        self.unit_step = unit.to(mode.dtype)[inverse]
        self.model, self.factorised = model, False
        self.q = torch.distributions.MultivariateNormal(self.loc, scale_tril=self.scale_tril, validate_args=False)


def generator_sample(q: torch.distributions.Distribution, k: int, generator: torch.Generator) -> torch.Tensor:
    """k draws of ``q`` [k, *batch, *event] from ``generator``, so that a seed fixes them.

    A Bernoulli as u < p with one uniform per unit, a Normal as loc + scale eps (the built-in samplers' draws, so the
    same generator gives the same z), either one inside ``Independent``, a MultivariateNormal as loc + L eps; any other Distribution from the global
    generator, forked and seeded from ours (``draw_seed``), which leaves the global generator's state as it was.

    Parameters
    ----------
    q : torch.distributions.Distribution
        The distribution to draw from.
    k : int
        Number of draws.
    generator : torch.Generator
        Source of randomness.

    Returns
    -------
    torch.Tensor
        ``[k, *batch_shape, *event_shape]`` draws (without a gradient for a Bernoulli; reparameterised for a
        Normal).

    Examples
    --------
    >>> import torch
    >>> from nvil.models.protocol import generator_sample
    >>> q = torch.distributions.Bernoulli(probs=torch.full((3, 2), 0.5))
    >>> z = generator_sample(q, 4, torch.Generator().manual_seed(1))
    >>> z.shape, torch.equal(z, generator_sample(q, 4, torch.Generator().manual_seed(1)))
    (torch.Size([4, 3, 2]), True)
    """
    base = q.base_dist if isinstance(q, torch.distributions.Independent) else q
    shape = (k, *base.batch_shape)
    if type(base) is torch.distributions.Bernoulli:
        return bernoulli_sample(base.probs.expand(shape), generator)
    if type(base) is torch.distributions.Normal:
        eps = torch.randn(shape, generator=generator, device=base.loc.device, dtype=base.loc.dtype)
        return base.loc + base.scale * eps
    if type(base) is torch.distributions.MultivariateNormal:
        loc = base.loc.expand(*base.batch_shape, *base.event_shape)
        eps = torch.randn((k, *loc.shape), generator=generator, device=loc.device, dtype=loc.dtype)
        return loc + (base.scale_tril @ eps[..., None])[..., 0]
    dev = generator.device
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else [], device_type=dev.type):
        torch.manual_seed(draw_seed(generator))
        return q.sample((k,))


def gaussian_log_prob(z: torch.Tensor) -> torch.Tensor:
    """log N(z; 0, I) per row: a helper for user models with a standard normal prior.

    log N(z; 0, I) = -(|z|^2 + D log 2 pi) / 2, summed over the last dimension.

    Parameters
    ----------
    z : torch.Tensor
        ``[..., D]`` values.

    Returns
    -------
    torch.Tensor
        ``[...]`` log densities.

    Examples
    --------
    >>> import torch
    >>> from nvil.models.protocol import gaussian_log_prob
    >>> gaussian_log_prob(torch.zeros(2, 3))
    tensor([-2.7568, -2.7568])
    """
    return -0.5 * (z.square().sum(-1) + z.shape[-1] * math.log(2 * math.pi))
