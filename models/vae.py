"""Variational autoencoder (Kingma & Welling 2014) with one or two stochastic layers of Gaussian latents, a
Bernoulli decoder and MLP encoder and decoder, in the architecture of Burda, Grosse & Salakhutdinov 2016 (Sec. 5):

    p(z_L) = N(0, I),  p(z_l | z_{l+1}) = N(mu_l(z_{l+1}), diag sigma_l(z_{l+1})^2),  p(x | z_1) = Bernoulli(f(z_1))
    q(z_1 | x) = N(., .),  q(z_{l+1} | z_l) = N(., .)

each mean and log standard deviation an MLP of ``hidden`` tanh layers (``[200, 200]`` for one stochastic layer of 50
in the paper's 1-layer model; ``[[100, 100], [50, 50]]`` with ``latent=[100, 50]`` for its 2-layer model).

It follows the model protocol (``nvil.models.protocol``): ``latent`` (the layers side by side in z), ``log_prior``,
``log_likelihood``, ``proposal`` (q(z | x) as a ``torch.distributions.Distribution``), ``sample_prior`` and
``sample_likelihood``; so every estimator that scores a user's model scores it, with nothing of its own.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Distribution, constraints

from nvil.core.errors import ConfigError
from nvil.models.protocol import Latent

HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def mlp(sizes: list[int], out: int) -> nn.Sequential:
    """tanh layers ``sizes[0] -> sizes[1] -> ...``, then a linear map to ``out`` units."""
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(sizes[-1], out))


class GaussianLayer(nn.Module):
    """N(mu(u), diag exp(log_sigma(u))^2) given the layer below or above, u: one MLP giving both."""

    def __init__(self, n_in: int, hidden: list[int], n_out: int) -> None:
        super().__init__()
        self.net, self.n_out = mlp([n_in, *hidden], 2 * n_out), n_out

    def forward(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mu, log_sigma = self.net(u).split(self.n_out, -1)
        return mu, log_sigma

    @staticmethod
    def log_prob(z: torch.Tensor, mu: torch.Tensor, log_sigma: torch.Tensor) -> torch.Tensor:
        return (-0.5 * ((z - mu) * torch.exp(-log_sigma)).square() - log_sigma - HALF_LOG_2PI).sum(-1)


def standard_normal_log_prob(z: torch.Tensor) -> torch.Tensor:
    return (-0.5 * z.square() - HALF_LOG_2PI).sum(-1)


class VAE(nn.Module):
    """``VAE(n_visible, latent=[50], hidden=[[200, 200]])``: a Bernoulli VAE with ``len(latent)`` Gaussian layers.

    ``hidden[l]``: the tanh layers of the networks between stochastic layer l and the one below it (the data for
    l = 0), in both directions. p(z_L) = N(0, I), p(z_l | z_{l+1}) and q(z_{l+1} | z_l) diagonal Gaussians,
    p(x | z_1) = Bernoulli(f(z_1)) (the module's docstring). It follows the model protocol
    (``nvil.models.protocol``) and declares no capabilities: z is the layers side by side, ``latent`` a
    ``Latent.continuous(latent)``.

    Parameters
    ----------
    n_visible : int
        The number of pixels.
    latent : list of int, default (50,)
        The sizes of the one or two Gaussian stochastic layers, [|z_1|] or [|z_1|, |z_2|], from the data up.
    hidden : list of list of int, default ((200, 200),)
        One list per stochastic layer: ``hidden[l]`` the tanh layer sizes of the networks between z_l and the layer
        below it (x for l = 0), the encoder's in this order, the decoder's reversed.

    Raises
    ------
    ConfigError
        (``nvil.core.errors``) If ``latent`` does not list one or two positive sizes, or ``hidden`` does not give
        one non-empty list of positive sizes per stochastic layer.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import VAE
    >>> vae = VAE(6, latent=[3, 2], hidden=[[5], [4]])
    >>> vae.latent
    Latent(kind='continuous', layers=(3, 2))
    >>> x, z = vae.sample(4)
    >>> x.shape, z.shape, vae.log_joint(x, z).shape
    (torch.Size([4, 6]), torch.Size([4, 5]), torch.Size([4]))
    >>> q = vae.proposal(x)
    >>> q.batch_shape, q.event_shape, q.rsample((2,)).shape
    (torch.Size([4]), torch.Size([5]), torch.Size([2, 4, 5]))
    """

    capabilities = frozenset()  # it asks nothing of the estimators beyond the protocol
    data_support = "binary"

    def __init__(self, n_visible: int, latent: list[int] = (50,), hidden: list[list[int]] = ((200, 200),)) -> None:
        super().__init__()
        latent, hidden = [int(n) for n in latent], [[int(n) for n in h] for h in hidden]
        if not 1 <= len(latent) <= 2 or any(n < 1 for n in latent):
            raise ConfigError(f"model.latent must list one or two positive layer sizes, got {latent}")
        if len(hidden) != len(latent) or any(not h or min(h) < 1 for h in hidden):
            raise ConfigError(f"model.hidden must give one non-empty list of positive sizes per stochastic layer "
                              f"({len(latent)}), got {hidden}")
        self.n_visible, self.sizes = int(n_visible), latent
        self.latent = Latent.continuous(latent)
        below = [self.n_visible, *latent[:-1]]
        self.encoders = nn.ModuleList(GaussianLayer(below[l], hidden[l], latent[l]) for l in range(len(latent)))
        self.priors = nn.ModuleList(GaussianLayer(latent[l + 1], hidden[l + 1][::-1], latent[l])
                                    for l in range(len(latent) - 1))
        self.decoder = mlp([latent[0], *hidden[0][::-1]], self.n_visible)

    def init_visible_bias(self, train_mean: torch.Tensor, eps: float = 1e-3) -> None:
        """The decoder's output bias at the logits of the training pixels' means (Burda et al.'s initialisation).

        Parameters
        ----------
        train_mean : torch.Tensor
            ``[n_visible]`` the training pixels' means.
        eps : float, default 1e-3
            The means are clamped to [eps, 1 - eps] so that the logits stay finite.
        """
        p = train_mean.clamp(eps, 1 - eps)
        self.decoder[-1].bias.data.copy_(torch.log(p) - torch.log1p(-p))

    # ---- the protocol ------------------------------------------------------------------------------------------

    def log_prior(self, z: torch.Tensor) -> torch.Tensor:
        """log p(z) = log N(z_L; 0, I) + sum_l log p(z_l | z_{l+1}).

        Parameters
        ----------
        z : torch.Tensor
            ``[..., D]`` the latent layers side by side (``latent.split``), D = ``sum(latent)``.

        Returns
        -------
        torch.Tensor
            ``[...]`` log p(z), normalised.
        """
        zs = self.latent.split(z)
        out = standard_normal_log_prob(zs[-1])
        for l, prior in enumerate(self.priors):
            out = out + GaussianLayer.log_prob(zs[l], *prior(zs[l + 1]))
        return out

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        """The decoder's logits of p(x | z_1), f(z_1) before the sigmoid.

        Parameters
        ----------
        z : torch.Tensor
            ``[..., D]`` latent values; only z_1 (the first layer) is read.

        Returns
        -------
        torch.Tensor
            ``[..., n_visible]`` logits.
        """
        return self.decoder(self.latent.split(z)[0])

    def log_likelihood(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """log p(x | z_1) = sum_i x_i log f_i + (1 - x_i) log (1 - f_i).

        Parameters
        ----------
        x : torch.Tensor
            ``[N, n_visible]`` binary pixels, or one row ``[1, n_visible]`` expanded against every row of z.
        z : torch.Tensor
            ``[N, D]`` latent values.

        Returns
        -------
        torch.Tensor
            ``[N]`` log p(x | z_1), normalised in x.
        """
        return -F.binary_cross_entropy_with_logits(self.logits(z), x.expand(z.shape[0], -1), reduction="none").sum(-1)

    def log_joint(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """log p(x, z) = log p(z) + log p(x | z_1).

        Parameters
        ----------
        x : torch.Tensor
            ``[N, n_visible]`` binary pixels (or one row, expanded).
        z : torch.Tensor
            ``[N, D]`` latent values.

        Returns
        -------
        torch.Tensor
            ``[N]`` log p(x, z).
        """
        return self.log_prior(z) + self.log_likelihood(x, z)

    def proposal(self, x: torch.Tensor) -> "LayeredGaussian":
        """q(z | x) = q(z_1 | x) q(z_2 | z_1): a distribution with batch shape [N] and event shape [D].

        Parameters
        ----------
        x : torch.Tensor
            ``[N, n_visible]`` binary pixels.

        Returns
        -------
        LayeredGaussian
            q(z | x), a ``torch.distributions.Distribution`` drawing by reparameterisation (``rsample``).
        """
        return LayeredGaussian(self, x)

    def sample_prior(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """n draws z ~ p(z), top layer first: z_L ~ N(0, I), then z_l ~ p(z_l | z_{l+1}).

        Parameters
        ----------
        n : int
            Number of draws.
        generator : torch.Generator or None, default None
            Source of randomness; None uses torch's global generator.

        Returns
        -------
        torch.Tensor
            ``[n, D]`` the layers side by side, z_1 first.
        """
        w = self.decoder[-1].weight
        zs = [torch.randn(n, self.sizes[-1], generator=generator, device=w.device, dtype=w.dtype)]
        for l in range(len(self.priors) - 1, -1, -1):
            mu, log_sigma = self.priors[l](zs[0])
            zs.insert(0, mu + torch.exp(log_sigma) * torch.randn(mu.shape, generator=generator, device=w.device,
                                                                 dtype=w.dtype))
        return torch.cat(zs, -1)

    def sample_likelihood(self, z: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """x ~ p(x | z_1) = Bernoulli(f(z_1)), one per row of z.

        Parameters
        ----------
        z : torch.Tensor
            ``[N, D]`` latent values.
        generator : torch.Generator or None, default None
            Source of randomness; None uses torch's global generator.

        Returns
        -------
        torch.Tensor
            ``[N, n_visible]`` binary pixels.
        """
        return torch.bernoulli(torch.sigmoid(self.logits(z)), generator=generator)

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Ancestral samples (x [n, n_visible], z [n, D]): z ~ p(z), then x ~ p(x | z_1); no gradient.

        Parameters
        ----------
        n : int
            Number of samples.
        generator : torch.Generator or None, default None
            Source of randomness; None uses torch's global generator.

        Returns
        -------
        tuple of (torch.Tensor, torch.Tensor)
            ``(x, z)``: ``[n, n_visible]`` binary pixels and ``[n, D]`` latent values.
        """
        z = self.sample_prior(n, generator)
        return self.sample_likelihood(z, generator), z

    @torch.no_grad()
    def visible_probs(self, z: torch.Tensor) -> torch.Tensor:
        """p(x_i = 1 | z_1) = f_i(z_1): what sample grids show, less noisy than samples.

        Parameters
        ----------
        z : torch.Tensor
            ``[..., D]`` latent values.

        Returns
        -------
        torch.Tensor
            ``[..., n_visible]`` pixel probabilities, without gradient.
        """
        return torch.sigmoid(self.logits(z))

    def extra_repr(self) -> str:
        return f"n_visible={self.n_visible}, latent={self.sizes}"


class LayeredGaussian(Distribution):
    """q(z | x) of a ``VAE``: draws by reparameterisation, layer by layer up from x (``rsample``), and log q(z | x)."""

    arg_constraints: dict = {}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, vae: VAE, x: torch.Tensor) -> None:
        self.vae, self.x = vae, x
        self.first = vae.encoders[0](x)
        super().__init__(batch_shape=torch.Size([x.shape[0]]), event_shape=torch.Size([vae.latent.size]),
                         validate_args=False)

    def rsample_with(self, sample_shape, generator: torch.Generator | None) -> torch.Tensor:
        """z = mu + sigma * eps, layer by layer, eps drawn from ``generator``: [*sample_shape, N, D]."""
        mu, log_sigma = self.first
        mu, log_sigma = mu.expand(*sample_shape, *mu.shape), log_sigma.expand(*sample_shape, *log_sigma.shape)
        noise = lambda like: torch.randn(like.shape, generator=generator, device=like.device, dtype=like.dtype)  # noqa: E731
        zs = [mu + torch.exp(log_sigma) * noise(mu)]
        for encoder in self.vae.encoders[1:]:
            mu, log_sigma = encoder(zs[-1])
            zs.append(mu + torch.exp(log_sigma) * noise(mu))
        return torch.cat(zs, -1)

    def rsample(self, sample_shape=torch.Size()) -> torch.Tensor:
        return self.rsample_with(torch.Size(sample_shape), None)

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        with torch.no_grad():
            return self.rsample(sample_shape)

    def log_prob(self, z: torch.Tensor) -> torch.Tensor:
        zs = self.vae.latent.split(z)
        out = GaussianLayer.log_prob(zs[0], *self.first)
        for l, encoder in enumerate(self.vae.encoders[1:]):
            out = out + GaussianLayer.log_prob(zs[l + 1], *encoder(zs[l]))
        return out
