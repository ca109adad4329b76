"""Gaussian belief nets with continuous latent variables, in centred or auxiliary form (Kingma 2013).

A net is a set of Gaussian latent vectors z_1..z_K in ancestral order, each with at most one latent
parent, and observed vectors, each with one latent parent:

    z_root ~ N(0, I),        z_i | z_pa(i) ~ N(f(W_i z_pa(i) + b_i), diag sigma_i^2),
    x_j | z_pa(j) ~ Bernoulli(sigmoid(V_j z_pa(j) + c_j))   or   N(V_j z_pa(j) + c_j, diag sigma_x^2).

The same parameters define the model in two forms (Kingma 2013, Sec. 3, Eq. 7):

- ``centred``: the sampler's state is z itself; log p(x, z) = log p(x | z) + sum_i log N(z_i; mu_i, sigma_i^2).
- ``auxiliary``: the state is eps, with z computed from its ancestors, z_root = eps_root and
  z_i = f(W_i z_pa(i) + b_i) + sigma_i * eps_i; log p(x, eps) = log p(x | z(eps)) + sum_i log N(eps_i; 0, I).

The map eps -> z is triangular with Jacobian prod_i sigma_i, so log p_aux(x, eps) = log p_centred(x, z(eps))
+ sum_i sum_d log sigma_id: both forms give the same p(x) (``log_jacobian``). In auxiliary form every latent's
Markov blanket reaches all its descendants, so a gradient step moves the whole hierarchy at once.

``GaussianBeliefNet``: layers [z_1, ..., z_L] above one observed layer (the MNIST nets of Kingma 2013, Sec. 4.1).
``DynamicBayesNet``: a chain z_1 -> ... -> z_T, each z_t emitting x_t, parameters shared over time (Sec. 4.2).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nvil.core.errors import ConfigError
from nvil.models.gaussian_grad import LogJoint
from nvil.models.protocol import ANCESTRAL, CLOSED_FORM_GRADIENT, CLOSED_FORM_LIKELIHOOD, CONTINUOUS_LATENTS, Latent
from nvil.models.visible import LOG_2PI, VISIBLE, gaussian_log_prob

FORMS = ("auxiliary", "centred")
VISIBLES = ("bernoulli", "gaussian")
# hard_sigmoid: the piecewise-linear sigmoid (0 below -3, 1 above 3, a / 6 + 1 / 2 between): Kingma 2013's "piecewise
# sigmoid nonlinearity" (Sec. 4.1). Written through hardtanh, whose gradient is exact in float64 (F.hardsigmoid's
# backward scales by a float32 1/6).
NONLINEARITIES = {"tanh": torch.tanh, "sigmoid": torch.sigmoid, "hard_tanh": F.hardtanh,
                  "hard_sigmoid": lambda a: F.hardtanh(a / 6 + 0.5, 0.0, 1.0), "identity": lambda a: a}


class GaussianNet(nn.Module):
    """The base of the Gaussian belief nets: Gaussian latent vectors with at most one latent parent, in either form.

    What both nets share. Subclasses fill in the graph in ``__init__`` through ``_build``: ``latent_sizes``
    (ancestral order), ``latent_parent`` (None for a root), ``latent_link`` (index into ``links``, the (W, b) of
    f(W z + b), shared between nodes that share parameters; also the index into ``log_sigmas``, one log sigma vector
    per link) and, for the observed vectors, whose concatenation is a data row, ``obs_parent`` and ``obs_link``
    (index into ``emissions``). ``offsets`` are the latents' start columns in a flat state. Class attributes:
    ``capabilities`` (continuous latents, ancestral sampling, closed-form likelihood and gradient) and
    ``is_continuous_latent``. A ``GaussianNet`` built directly has no graph; use ``GaussianBeliefNet`` or
    ``DynamicBayesNet``.

    Parameters
    ----------
    form : str
        ``"auxiliary"`` (the state is eps, Kingma 2013, Eq. 7) or ``"centred"`` (the state is z).
    visible : str
        ``"bernoulli"`` or ``"gaussian"`` observed units.
    nonlinearity : str
        f of the prior means mu_i = f(W_i z_pa(i) + b_i): ``"tanh"``, ``"sigmoid"``, ``"hard_tanh"``,
        ``"hard_sigmoid"`` (Kingma 2013's piecewise-linear sigmoid, Sec. 4.1) or ``"identity"``.
    sigma : float
        Initial standard deviation sigma_i of every non-root latent, > 0.
    visible_sigma : float
        Initial standard deviation sigma_x of Gaussian observed units, > 0 (unused for Bernoulli ones).
    learn_sigma : bool
        Whether the log sigmas are trained (``requires_grad``).
    init_scale : float
        Standard deviation of the Gaussian draw of the initial weights and biases, > 0 (the same draw for either
        form, Kingma 2013, Sec. 4.1).

    Raises
    ------
    ConfigError
        If ``form``, ``visible`` or ``nonlinearity`` is not one of the names above, or ``sigma``, ``visible_sigma``
        or ``init_scale`` is not a positive number.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import GaussianBeliefNet
    >>> from nvil.models.gaussian import GaussianNet
    >>> net = GaussianBeliefNet(6, [4, 3], sigma=0.1)
    >>> isinstance(net, GaussianNet), net.form, net.n_latent, net.n_visible
    (True, 'auxiliary', 7, 6)

    Both forms give the same p(x): log p_aux(x, eps) = log p_centred(x, z(eps)) + log |det dz / deps|.

    >>> x, eps = net.sample(5)
    >>> z = net.to_centred(eps)
    >>> bool(torch.allclose(net.log_joint(x, eps), net.log_joint(x, z, "centred") + net.log_jacobian(), atol=1e-5))
    True
    >>> GaussianNet("x", "bernoulli", "tanh", 0.1, 1.0, True, 0.1)
    Traceback (most recent call last):
        ...
    nvil.core.errors.ConfigError: model.form must be one of ['auxiliary', 'centred'], got 'x'
    """

    capabilities = frozenset({CONTINUOUS_LATENTS, ANCESTRAL, CLOSED_FORM_LIKELIHOOD, CLOSED_FORM_GRADIENT})
    is_continuous_latent = True

    def __init__(self, form: str, visible: str, nonlinearity: str, sigma: float, visible_sigma: float,
                 learn_sigma: bool, init_scale: float) -> None:
        super().__init__()
        if form not in FORMS:
            raise ConfigError(f"model.form must be one of {list(FORMS)}, got {form!r}")
        if visible not in VISIBLES:
            raise ConfigError(f"model.visible must be one of {list(VISIBLES)} for a Gaussian belief net, got {visible!r}")
        if nonlinearity not in NONLINEARITIES:
            raise ConfigError(f"model.nonlinearity must be one of {list(NONLINEARITIES)}, got {nonlinearity!r}")
        for key, value in (("sigma", sigma), ("visible_sigma", visible_sigma), ("init_scale", init_scale)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"model.{key} must be a positive number, got {value!r}")
        self.form, self.visible, self.nonlinearity = form, visible, nonlinearity
        self.visible_layer = VISIBLE[visible].build()
        self.f = NONLINEARITIES[nonlinearity]
        self.sigma, self.visible_sigma, self.learn_sigma, self.init_scale = float(sigma), float(visible_sigma), bool(learn_sigma), float(init_scale)

    def _build(self, latent_sizes, latent_parent, latent_link, link_shapes, obs_sizes, obs_parent, obs_link,
               emission_shapes) -> None:
        self.latent_sizes, self.latent_parent, self.latent_link = list(latent_sizes), list(latent_parent), list(latent_link)
        self.obs_sizes, self.obs_parent, self.obs_link = list(obs_sizes), list(obs_parent), list(obs_link)
        self.links = nn.ModuleList(nn.Linear(n_in, n_out) for n_in, n_out in link_shapes)
        self.emissions = nn.ModuleList(nn.Linear(n_in, n_out) for n_in, n_out in emission_shapes)
        with torch.no_grad():  # the same Gaussian draw of initial parameters for either form (Kingma 2013, Sec. 4.1)
            for p in self.parameters():
                p.normal_(0.0, self.init_scale)
        # One log sigma vector per parameter-sharing group of non-root latents (the link index).
        self.log_sigmas = nn.ParameterList(nn.Parameter(torch.full((n_out,), math.log(self.sigma)), requires_grad=self.learn_sigma)
                                           for _, n_out in link_shapes)
        self.log_sigma_x = nn.Parameter(torch.full((emission_shapes[0][1],), math.log(self.visible_sigma)),
                                        requires_grad=self.learn_sigma) if self.visible_layer.has_noise_scale else None
        self.offsets = [0]
        for n in self.latent_sizes:
            self.offsets.append(self.offsets[-1] + n)

    # ---- bookkeeping -------------------------------------------------------------------------------
    @property
    def data_support(self) -> str:
        """What a data row holds (``nvil.estimators.door``): binary values, or real ones."""
        return "binary" if self.visible == "bernoulli" else "real"

    @property
    def n_latent(self) -> int:
        """The width of a flat state: the total size of the latent vectors z_1..z_K."""
        return self.offsets[-1]

    @property
    def n_visible(self) -> int:
        """The width of a data row: the total size of the observed vectors."""
        return sum(self.obs_sizes)

    def split(self, state: torch.Tensor) -> list[torch.Tensor]:
        """The per-node vectors of a flat state, in ancestral order.

        Parameters
        ----------
        state : torch.Tensor
            ``(..., n_latent)`` z (centred form) or eps (auxiliary form).

        Returns
        -------
        list of torch.Tensor
            One view ``(..., latent_sizes[i])`` per latent i.
        """
        return [state[..., a:b] for a, b in zip(self.offsets[:-1], self.offsets[1:])]

    def split_obs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The per-node observed vectors of a data row, in the order of ``obs_sizes``.

        Parameters
        ----------
        x : torch.Tensor
            ``(..., n_visible)`` data rows.

        Returns
        -------
        list of torch.Tensor
            One view ``(..., obs_sizes[j])`` per observed vector j.
        """
        out, start = [], 0
        for n in self.obs_sizes:
            out.append(x[..., start:start + n])
            start += n
        return out

    def prior_mean(self, i: int, z_parent: torch.Tensor) -> torch.Tensor:
        """The prior mean mu_i = f(W_i z_pa(i) + b_i) of latent i given its parent.

        Parameters
        ----------
        i : int
            Index of a non-root latent, in ancestral order.
        z_parent : torch.Tensor
            ``(..., latent_sizes[pa(i)])`` the parent's value z_pa(i).

        Returns
        -------
        torch.Tensor
            ``(..., latent_sizes[i])`` mu_i.
        """
        return self.f(self.links[self.latent_link[i]](z_parent))

    def log_sigma(self, i: int) -> torch.Tensor:
        """log sigma_i of latent i, shared by the latents that share its link.

        Parameters
        ----------
        i : int
            Index of a non-root latent, in ancestral order.

        Returns
        -------
        torch.nn.Parameter
            ``(latent_sizes[i],)`` log standard deviations.
        """
        return self.log_sigmas[self.latent_link[i]]

    # ---- the two forms ----------------------------------------------------------------------------
    def to_centred(self, eps: torch.Tensor) -> torch.Tensor:
        """z(eps): z_root = eps_root, z_i = f(W_i z_pa(i) + b_i) + sigma_i eps_i, (Kingma 2013, Eq. 7).

        Parameters
        ----------
        eps : torch.Tensor
            ``(..., n_latent)`` auxiliary state.

        Returns
        -------
        torch.Tensor
            ``(..., n_latent)`` the centred state z, its latents in ancestral order.
        """
        zs: list[torch.Tensor] = []
        for i, e in enumerate(self.split(eps)):
            p = self.latent_parent[i]
            zs.append(e if p is None else self.prior_mean(i, zs[p]) + torch.exp(self.log_sigma(i)) * e)
        return torch.cat(zs, -1)

    def to_auxiliary(self, z: torch.Tensor) -> torch.Tensor:
        """eps(z): the inverse of ``to_centred``, eps_i = (z_i - f(W_i z_pa(i) + b_i)) / sigma_i, eps_root = z_root.

        Parameters
        ----------
        z : torch.Tensor
            ``(..., n_latent)`` centred state.

        Returns
        -------
        torch.Tensor
            ``(..., n_latent)`` the auxiliary state eps.
        """
        zs = self.split(z)
        eps = [zi if self.latent_parent[i] is None else
               (zi - self.prior_mean(i, zs[self.latent_parent[i]])) * torch.exp(-self.log_sigma(i)) for i, zi in enumerate(zs)]
        return torch.cat(eps, -1)

    def latents(self, state: torch.Tensor, form: str | None = None) -> list[torch.Tensor]:
        """The z vectors that a state in ``form`` stands for.

        Parameters
        ----------
        state : torch.Tensor
            ``(..., n_latent)`` z or eps.
        form : str or None, default None
            ``"auxiliary"`` or ``"centred"``; None uses this net's ``form``.

        Returns
        -------
        list of torch.Tensor
            One ``(..., latent_sizes[i])`` z_i per latent, in ancestral order.
        """
        return self.split(self.to_centred(state) if (form or self.form) == "auxiliary" else state)

    def log_jacobian(self) -> torch.Tensor:
        """log |det dz / deps| = sum over non-root latents of sum_d log sigma_id.

        The map eps -> z is triangular with Jacobian prod_i sigma_i, so log p_aux(x, eps) = log p_centred(x, z(eps)) +
        ``log_jacobian()``.

        Returns
        -------
        torch.Tensor
            0-d log Jacobian, differentiable in the log sigmas.

        Examples
        --------
        >>> from nvil.models import GaussianBeliefNet
        >>> round(GaussianBeliefNet(6, [4, 3], sigma=0.1).log_jacobian().item(), 4)   # 4 units with sigma = 0.1
        -9.2103
        """
        return sum((self.log_sigma(i).sum() for i, p in enumerate(self.latent_parent) if p is not None),
                   torch.zeros((), device=self.emissions[0].weight.device, dtype=self.emissions[0].weight.dtype))

    # ---- densities (``form=None``: this net's own form) -------------------------------------------------
    def log_prior(self, state: torch.Tensor, form: str | None = None) -> torch.Tensor:
        """log p(state): sum_i log N(eps_i; 0, I) (auxiliary), or the centred chain of Gaussians.

        In centred form, log N(z_root; 0, I) + sum_i log N(z_i; mu_i, sigma_i^2), mu_i = f(W_i z_pa(i) + b_i).

        Parameters
        ----------
        state : torch.Tensor
            ``(..., n_latent)`` z or eps.
        form : str or None, default None
            ``"auxiliary"`` or ``"centred"``; None uses this net's ``form``.

        Returns
        -------
        torch.Tensor
            ``(...)`` log prior densities.
        """
        if (form or self.form) == "auxiliary":
            return gaussian_log_prob(state, 0.0, torch.zeros((), device=state.device))
        zs = self.split(state)
        total = 0.0
        for i, zi in enumerate(zs):
            p = self.latent_parent[i]
            if p is None:
                total = total + gaussian_log_prob(zi, 0.0, torch.zeros((), device=state.device))
            else:
                total = total + gaussian_log_prob(zi, self.prior_mean(i, zs[p]), self.log_sigma(i))
        return total

    def emission(self, j: int, z_parent: torch.Tensor) -> torch.Tensor:
        """Logits (Bernoulli) or means (Gaussian) of observed vector j, V_j z_pa(j) + c_j.

        Parameters
        ----------
        j : int
            Index of the observed vector.
        z_parent : torch.Tensor
            ``(..., latent_sizes[pa(j)])`` its latent parent's value.

        Returns
        -------
        torch.Tensor
            ``(..., obs_sizes[j])`` logits or means.
        """
        return self.emissions[self.obs_link[j]](z_parent)

    def log_likelihood(self, x: torch.Tensor, state: torch.Tensor, form: str | None = None) -> torch.Tensor:
        """log p(x | z(state)), summed over the observed vectors.

        Parameters
        ----------
        x : torch.Tensor
            ``(..., n_visible)`` data rows.
        state : torch.Tensor
            ``(..., n_latent)`` z or eps.
        form : str or None, default None
            The form of ``state``; None uses this net's ``form``.

        Returns
        -------
        torch.Tensor
            ``(...)`` log likelihoods (densities for Gaussian observed units).
        """
        zs = self.latents(state, form)
        total = 0.0
        for j, xj in enumerate(self.split_obs(x)):
            total = total + self.visible_layer.log_prob(self.emission(j, zs[self.obs_parent[j]]), xj, self.log_sigma_x)
        return total

    def log_joint(self, x: torch.Tensor, state: torch.Tensor, form: str | None = None) -> torch.Tensor:
        """log p(x, state) = ``log_prior`` + ``log_likelihood``: the target of the E-step's HMC.

        Parameters
        ----------
        x : torch.Tensor
            ``(..., n_visible)`` data rows.
        state : torch.Tensor
            ``(..., n_latent)`` z or eps.
        form : str or None, default None
            The form of ``state``; None uses this net's ``form``.

        Returns
        -------
        torch.Tensor
            ``(...)`` log joint densities.
        """
        return self.log_prior(state, form) + self.log_likelihood(x, state, form)

    def posterior(self, x: torch.Tensor, form: str | None = None, beta=1.0) -> LogJoint:
        """s -> log p(s) + beta log p(x | s), one row of x per chain, as HMC's target.

        The target is callable, with its gradient wrt s in closed form (``nvil.models.gaussian_grad``), so that no
        leapfrog step needs autograd.

        Parameters
        ----------
        x : torch.Tensor
            ``(chains, n_visible)`` data rows, one per chain.
        form : str or None, default None
            The form of the state s; None uses this net's ``form``.
        beta : float or torch.Tensor, default 1.0
            Inverse temperature beta of the likelihood (AIS's path p(s) p(x | s)^beta); 1 is the posterior.

        Returns
        -------
        LogJoint
            The target: ``target(s)`` the log density ``(chains,)``, ``grad(s)`` and ``value_and_grad(s)`` in closed
            form, for the parameters as they are now.
        """
        return LogJoint(self, x, form or self.form, beta)

    def log_param_prior(self, prior_std: float) -> torch.Tensor:
        """log N(theta; 0, prior_std^2) over the weights and biases (MAP learning, Kingma 2013, Sec. 4.1).

        The log sigmas have a flat prior.

        Parameters
        ----------
        prior_std : float
            Standard deviation of the Gaussian prior on every weight and bias.

        Returns
        -------
        torch.Tensor
            0-d log prior density, differentiable in the parameters.
        """
        params = [p for m in (self.links, self.emissions) for p in m.parameters()]
        sq = sum((p * p).sum() for p in params)
        n = sum(p.numel() for p in params)
        return -0.5 * sq / prior_std**2 - n * (math.log(prior_std) + 0.5 * LOG_2PI)

    # ---- sampling --------------------------------------------------------------------------------------
    def sample_prior(self, n: int, generator=None, device=None, form: str | None = None) -> torch.Tensor:
        """n prior draws of the state in ``form``: one eps draw, mapped to z in centred form.

        Parameters
        ----------
        n : int
            Number of draws.
        generator : torch.Generator or None, default None
            Source of randomness; None uses torch's global generator.
        device : torch.device or None, default None
            Where to draw; None uses the parameters' device.
        form : str or None, default None
            The form of the returned state; None uses this net's ``form``.

        Returns
        -------
        torch.Tensor
            ``(n, n_latent)`` states, in the parameters' dtype.
        """
        w = self.emissions[0].weight
        eps = torch.randn(n, self.n_latent, generator=generator, device=device or w.device, dtype=w.dtype)
        return eps if (form or self.form) == "auxiliary" else self.to_centred(eps)

    @property
    def latent(self) -> Latent:
        """The state as the model protocol sees it (``nvil.models.protocol``): continuous, ``n_latent`` wide.

        It is in this net's form, so ``log_prior``, ``log_likelihood``, ``sample_prior`` and ``sample_likelihood`` are
        the protocol's.
        """
        return Latent.continuous(self.n_latent)

    @torch.no_grad()
    def sample_likelihood(self, state: torch.Tensor, generator=None) -> torch.Tensor:
        """x ~ p(x | z(state)), one row per state.

        Parameters
        ----------
        state : torch.Tensor
            ``(N, n_latent)`` states in this net's ``form``.
        generator : torch.Generator or None, default None
            Source of randomness; None uses torch's global generator.

        Returns
        -------
        torch.Tensor
            ``(N, n_visible)`` data rows (binary for Bernoulli observed units).
        """
        zs = self.latents(state)
        return torch.cat([self.visible_layer.sample(self.emission(j, zs[self.obs_parent[j]]), generator,
                                                    self.log_sigma_x) for j in range(len(self.obs_sizes))], -1)

    @torch.no_grad()
    def sample(self, n: int, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Ancestral samples: a prior draw of the state, then x given it.

        Parameters
        ----------
        n : int
            Number of samples.
        generator : torch.Generator or None, default None
            Source of randomness; None uses torch's global generator.

        Returns
        -------
        tuple of torch.Tensor
            ``(x, state)``: x ``(n, n_visible)`` and the state ``(n, n_latent)`` in this net's ``form``.
        """
        state = self.sample_prior(n, generator)
        return self.sample_likelihood(state, generator), state

    @torch.no_grad()
    def visible_probs(self, state: torch.Tensor) -> torch.Tensor:
        """p(x = 1 | z) (Bernoulli) or E[x | z] (Gaussian), for image grids.

        Parameters
        ----------
        state : torch.Tensor
            ``(N, n_latent)`` states in this net's ``form``.

        Returns
        -------
        torch.Tensor
            ``(N, n_visible)`` probabilities or means.
        """
        zs = self.latents(state)
        outs = [self.emission(j, zs[self.obs_parent[j]]) for j in range(len(self.obs_sizes))]
        return self.visible_layer.mean(torch.cat(outs, -1))

    @torch.no_grad()
    def init_visible_bias(self, train_mean: torch.Tensor) -> None:
        """Set the emission bias c from the training mean, averaged over the time steps that share it.

        For Bernoulli visibles, the logit of the pixel marginals (clamped to [1e-3, 1 - 1e-3]); for Gaussian ones, the
        mean. The rest stays as drawn, so both forms start from the same parameters.

        Parameters
        ----------
        train_mean : torch.Tensor
            ``(n_visible,)`` mean of the training rows.
        """
        mean = train_mean.reshape(-1, self.emissions[0].out_features).mean(0)
        self.emissions[0].bias.copy_(self.visible_layer.bias_from_mean(mean, 1e-3, logit=torch.logit))


class GaussianBeliefNet(GaussianNet):
    """A layered Gaussian belief net: latent layers z_L, ..., z_1 above one observed layer (Kingma 2013, Sec. 4.1).

    layers = [n_1, ..., n_L]: z_L ~ N(0, I) at the top, z_l | z_{l+1} ~ N(f(W_l z_{l+1} + b_l), sigma_l^2),
    x | z_1 Bernoulli(sigmoid(V z_1 + c)) or N(V z_1 + c, sigma_x^2). State order: z_L, ..., z_1. Each layer has
    its own link and log sigma; ``layers`` keeps the widths as given.

    Parameters
    ----------
    n_visible : int
        Width of a data row x.
    layers : list of int
        Latent widths ``[n_1, ..., n_L]``, bottom (next to x) to top.
    form : str, default "auxiliary"
        ``"auxiliary"`` (state eps) or ``"centred"`` (state z).
    visible : str, default "bernoulli"
        ``"bernoulli"`` or ``"gaussian"`` observed units.
    nonlinearity : str, default "tanh"
        f: ``"tanh"``, ``"sigmoid"``, ``"hard_tanh"``, ``"hard_sigmoid"`` or ``"identity"``.
    sigma : float, default 0.1
        Initial sigma_l of every non-top layer.
    visible_sigma : float, default 1.0
        Initial sigma_x of Gaussian observed units.
    learn_sigma : bool, default True
        Whether the log sigmas are trained.
    init_scale : float, default 0.1
        Standard deviation of the initial weights and biases.

    Raises
    ------
    ConfigError
        For an unknown ``form``, ``visible`` or ``nonlinearity``, or a non-positive ``sigma``, ``visible_sigma`` or
        ``init_scale`` (``GaussianNet``).

    Examples
    --------
    >>> import torch
    >>> from nvil.models import GaussianBeliefNet
    >>> net = GaussianBeliefNet(6, [4, 3])
    >>> net.latent_sizes, net.latent_parent, net.n_latent, net.data_support
    ([3, 4], [None, 0], 7, 'binary')
    >>> x, eps = net.sample(5)
    >>> x.shape, eps.shape, bool(((x == 0) | (x == 1)).all())
    (torch.Size([5, 6]), torch.Size([5, 7]), True)
    >>> net.log_joint(x, eps).shape
    torch.Size([5])
    >>> target = net.posterior(x)
    >>> bool(torch.allclose(target(eps), net.log_joint(x, eps)))
    True
    """

    def __init__(self, n_visible: int, layers: list[int], form: str = "auxiliary", visible: str = "bernoulli",
                 nonlinearity: str = "tanh", sigma: float = 0.1, visible_sigma: float = 1.0,
                 learn_sigma: bool = True, init_scale: float = 0.1) -> None:
        super().__init__(form, visible, nonlinearity, sigma, visible_sigma, learn_sigma, init_scale)
        self.layers = [int(n) for n in layers]
        top_down = self.layers[::-1]  # ancestral order
        self._build(
            latent_sizes=top_down,
            latent_parent=[None] + list(range(len(top_down) - 1)),
            latent_link=[None] + list(range(len(top_down) - 1)),
            link_shapes=[(top_down[i - 1], top_down[i]) for i in range(1, len(top_down))],
            obs_sizes=[int(n_visible)], obs_parent=[len(top_down) - 1], obs_link=[0],
            emission_shapes=[(top_down[-1], int(n_visible))])


class DynamicBayesNet(GaussianNet):
    """A length-T chain z_1 -> ... -> z_T, each z_t emitting x_t, parameters shared over time (Kingma 2013, Sec. 4.2).

    z_1 ~ N(0, I), z_t | z_{t-1} ~ N(f(A z_{t-1} + a), sigma^2), x_t | z_t ~ N(C z_t + c, sigma_x^2), with A, a, C, c
    and the sigmas shared over time. A data row is [x_1, ..., x_T]; the state is [z_1, ..., z_T] (or the eps).

    Parameters
    ----------
    length : int
        T, the number of time steps.
    latent_dim : int
        Width of each z_t.
    obs_dim : int
        Width of each x_t; a data row is ``length * obs_dim`` wide.
    form : str, default "auxiliary"
        ``"auxiliary"`` (state eps) or ``"centred"`` (state z).
    visible : str, default "gaussian"
        ``"gaussian"`` or ``"bernoulli"`` observed units.
    nonlinearity : str, default "tanh"
        f of the transition: ``"tanh"``, ``"sigmoid"``, ``"hard_tanh"``, ``"hard_sigmoid"`` or ``"identity"``.
    sigma : float, default 0.1
        Initial transition noise sigma.
    visible_sigma : float, default 1.0
        Initial observation noise sigma_x.
    learn_sigma : bool, default True
        Whether the log sigmas are trained.
    init_scale : float, default 0.1
        Standard deviation of the initial weights and biases.

    Raises
    ------
    ConfigError
        For an unknown ``form``, ``visible`` or ``nonlinearity``, or a non-positive ``sigma``, ``visible_sigma`` or
        ``init_scale`` (``GaussianNet``).

    Examples
    --------
    >>> from nvil.models import DynamicBayesNet
    >>> net = DynamicBayesNet(length=4, latent_dim=2, obs_dim=3)
    >>> net.n_latent, net.n_visible, net.data_support, len(net.links)
    (8, 12, 'real', 1)
    >>> x, eps = net.sample(2)
    >>> x.shape, eps.shape
    (torch.Size([2, 12]), torch.Size([2, 8]))
    >>> net.log_joint(x, eps).shape
    torch.Size([2])
    """

    def __init__(self, length: int, latent_dim: int, obs_dim: int, form: str = "auxiliary", visible: str = "gaussian",
                 nonlinearity: str = "tanh", sigma: float = 0.1, visible_sigma: float = 1.0,
                 learn_sigma: bool = True, init_scale: float = 0.1) -> None:
        super().__init__(form, visible, nonlinearity, sigma, visible_sigma, learn_sigma, init_scale)
        self.length, self.latent_dim, self.obs_dim = int(length), int(latent_dim), int(obs_dim)
        T = self.length
        self._build(
            latent_sizes=[latent_dim] * T, latent_parent=[None] + list(range(T - 1)), latent_link=[None] + [0] * (T - 1),
            link_shapes=[(latent_dim, latent_dim)],
            obs_sizes=[obs_dim] * T, obs_parent=list(range(T)), obs_link=[0] * T,
            emission_shapes=[(latent_dim, obs_dim)])
