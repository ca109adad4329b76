"""Sigmoid belief networks and fDARN (Neal 1992; Gregor et al. 2014), as trained in Mnih & Gregor 2014.

p(x, h) = p(x | h_1) prod_{i=1}^{n-1} p(h_i | h_{i+1}) p(h_n):

- p(h_i | h_{i+1}): factorial Bernoulli with logits W_i h_{i+1} + b_i;
- p(h_n): factorial with learnable logits, or, with ``prior="autoregressive"``, p(h_nj | h_n,<j) through
  a strictly lower-triangular matrix. One latent layer with that prior is fDARN;
- p(x | h_1): factorial Bernoulli (binary images), or with ``visible="multinomial"`` a softmax over a
  vocabulary, log p(x | h_1) = sum_w x_w log softmax(W_0 h_1 + b_0)_w for a bag-of-words count vector x
  (the document models of Mnih & Gregor 2014, Sec. 4.3).

Tensors may carry any leading dimensions (samples, examples, enumerated states): the Linear layers
and ``bernoulli_log_prob`` broadcast over them, so estimators never loop over samples or examples.
"""

from __future__ import annotations

import torch
from torch import nn

from nvil.backend import gemm
from nvil.backend.native.bernoulli_log_prob import bernoulli_log_prob
from nvil.models.autoregressive import AutoregressiveLinear
from nvil.models.protocol import ANCESTRAL, BINARY_LATENTS, CLOSED_FORM_LIKELIHOOD
from nvil.models.binary_density import BinaryDensity, DensityBuilder, layer_slices, require_bernoulli_visibles
from nvil.models.visible import VISIBLE, bernoulli_sample

PRIORS = ("factorial", "autoregressive")
VISIBLES = ("bernoulli", "multinomial")


class SBN(nn.Module):
    """A belief network with ``layers`` = [|h_1|, ..., |h_n|] binary latent units.

    p(x, h) = p(x | h_1) prod_{i=1}^{n-1} p(h_i | h_{i+1}) p(h_n), each conditional factorial Bernoulli with logits
    W_i h_{i+1} + b_i (the module's docstring); one latent layer with ``prior="autoregressive"`` is fDARN. Tensors
    may carry any leading dimensions (samples, examples, enumerated states).

    Parameters
    ----------
    n_visible : int
        The number of visible units: pixels, or the vocabulary's size for multinomial visibles.
    layers : list of int
        [|h_1|, ..., |h_n|], the sizes of the latent layers from the data up (h_1 just above x, h_n the top).
    prior : str, default "factorial"
        p(h_n): ``"factorial"`` (learnable logits) or ``"autoregressive"`` (p(h_nj | h_n,<j) through a strictly
        lower-triangular matrix, fDARN's prior).
    visible : str, default "bernoulli"
        p(x | h_1): ``"bernoulli"`` (binary images) or ``"multinomial"`` (a softmax over a vocabulary for
        bag-of-words count vectors, Mnih & Gregor 2014, Sec. 4.3).
    doc_length : int, default 100
        Words per sampled document (multinomial visibles only).

    Raises
    ------
    ValueError
        If ``layers`` is empty or holds a size below 1, or ``prior`` or ``visible`` is not one of ``PRIORS``,
        ``VISIBLES``.

    Examples
    --------
    >>> from nvil.models import SBN
    >>> model = SBN(6, [4, 3])
    >>> x, hs = model.sample(5)
    >>> x.shape, [h.shape for h in hs]
    (torch.Size([5, 6]), [torch.Size([5, 4]), torch.Size([5, 3])])
    >>> model.log_joint(x, hs).shape, model.n_latent
    (torch.Size([5]), 7)
    >>> SBN(6, [4], prior="autoregressive").prior_ar is not None
    True
    """

    capabilities = frozenset({BINARY_LATENTS, ANCESTRAL, CLOSED_FORM_LIKELIHOOD})

    def __init__(self, n_visible: int, layers: list[int], prior: str = "factorial", visible: str = "bernoulli",
                 doc_length: int = 100) -> None:
        super().__init__()
        if not layers or any(int(n) < 1 for n in layers):
            raise ValueError(f"layers must be a non-empty list of positive sizes, got {layers}")
        if prior not in PRIORS or visible not in VISIBLES:
            raise ValueError(f"prior must be one of {PRIORS} and visible one of {VISIBLES}")
        self.n_visible = int(n_visible)
        self.layers = [int(n) for n in layers]
        self.visible = visible
        self.doc_length = int(doc_length)  # words per sampled document (multinomial visibles only)
        self.visible_layer = VISIBLE[visible].build(self.doc_length)
        sizes = [self.n_visible] + self.layers
        # decoders[i] maps h_{i+1} to the logits of h_i (h_0 = x).
        self.decoders = nn.ModuleList(gemm.Linear(sizes[i + 1], sizes[i]) for i in range(len(self.layers)))
        self.prior_logits = nn.Parameter(torch.zeros(self.layers[-1]))
        self.prior_ar = AutoregressiveLinear(self.layers[-1]) if prior == "autoregressive" else None

    @property
    def data_support(self) -> str:
        """What a data row holds (``nvil.estimators.door``): binary pixels, or word counts."""
        return "binary" if self.visible == "bernoulli" else "counts"

    @property
    def n_latent(self) -> int:
        """The number of latent units in all, ``sum(layers)``: the width of h's layers side by side."""
        return sum(self.layers)

    @property
    def layered_bernoulli(self) -> bool:
        """Every conditional a Bernoulli with logits affine in the layer above: True for Bernoulli visibles.

        The prior may be factorial or autoregressive, as fDARN's: the case NVIL's hand-derived gradients cover
        (``nvil.learners.fused``).
        """
        return self.visible_layer.name == "bernoulli"

    @torch.no_grad()
    def init_visible_bias(self, train_mean: torch.Tensor, eps: float = 1e-3) -> None:
        """Start the output bias at the data marginals, in place.

        The logit of the mean image, or for a multinomial visible layer the log of the mean word frequencies.

        Parameters
        ----------
        train_mean : torch.Tensor
            ``[n_visible]`` the training data's mean (pixel means, or mean word counts).
        eps : float, default 1e-3
            Keeps the bias finite: Bernoulli means are clamped to [eps, 1 - eps]; word frequencies are smoothed by
            adding eps to each mean before normalising.
        """
        bias = self.decoders[0].bias
        bias.copy_(self.visible_layer.bias_from_mean(train_mean.to(bias), eps))

    def visible_log_prob(self, logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """log p(x | h_1) given the visible layer's logits W_0 h_1 + b_0, summed over units.

        Parameters
        ----------
        logits : torch.Tensor
            ``[..., n_visible]`` logits of the visible layer.
        x : torch.Tensor
            ``[..., n_visible]`` binary pixels, or word counts for multinomial visibles.

        Returns
        -------
        torch.Tensor
            ``[...]`` log p(x | h_1): sum_j Bernoulli log-probabilities, or sum_w x_w log softmax(logits)_w.
        """
        return self.visible_layer.log_prob(logits, x)

    def prior_log_prob(self, h_top: torch.Tensor) -> torch.Tensor:
        """log p(h_n) of the top layer, factorial or autoregressive, summed over its units.

        Parameters
        ----------
        h_top : torch.Tensor
            ``[..., |h_n|]`` binary top-layer states.

        Returns
        -------
        torch.Tensor
            ``[...]`` log p(h_n).
        """
        if self.prior_ar is None:
            return bernoulli_log_prob(self.prior_logits, h_top)
        return self.prior_ar.log_prob(self.prior_logits, h_top)

    def log_prob_layers(self, x: torch.Tensor, hs: list[torch.Tensor]) -> list[torch.Tensor]:
        """[log p(x | h_1), log p(h_1 | h_2), ..., log p(h_n)], each summed over units.

        These are the per-layer terms NVIL's layer-wise learning signals are built from
        (Mnih & Gregor 2014, Sec. 2.3.3).

        Parameters
        ----------
        x : torch.Tensor
            ``[..., n_visible]`` data.
        hs : list of torch.Tensor
            [h_1, ..., h_n], binary ``[..., |h_i|]``; leading dimensions broadcast against x's.

        Returns
        -------
        list of torch.Tensor
            n + 1 terms ``[...]``, from the visible layer up to the prior.
        """
        terms = [self.visible_log_prob(self.decoders[0](hs[0]), x)]
        for dec, h, below in zip(self.decoders[1:], hs[1:], hs[:-1]):
            terms.append(bernoulli_log_prob(dec(h), below))
        terms.append(self.prior_log_prob(hs[-1]))
        return terms

    def log_joint(self, x: torch.Tensor, hs: list[torch.Tensor]) -> torch.Tensor:
        """log p(x, h_1, ..., h_n): the sum of ``log_prob_layers``.

        Parameters
        ----------
        x : torch.Tensor
            ``[..., n_visible]`` data.
        hs : list of torch.Tensor
            [h_1, ..., h_n], binary ``[..., |h_i|]``.

        Returns
        -------
        torch.Tensor
            ``[...]`` log p(x, h), the layers' terms broadcast together.
        """
        return torch.stack(torch.broadcast_tensors(*self.log_prob_layers(x, hs))).sum(0)

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Ancestral sample: (x [n, n_visible], [h_1, ..., h_n]).

        h_n from the prior, each layer below from its conditional given the layer above, x last; no gradient.

        Parameters
        ----------
        n : int
            Number of samples.
        generator : torch.Generator or None, default None
            Source of randomness; None uses torch's global generator.

        Returns
        -------
        tuple of (torch.Tensor, list of torch.Tensor)
            ``(x, hs)``: ``[n, n_visible]`` visible samples (binary, or word counts of ``doc_length`` words) and the
            latent layers [h_1, ..., h_n], ``[n, |h_i|]`` each.
        """
        top = self.prior_logits.expand(n, -1)
        h = self.prior_ar.sample(top, generator) if self.prior_ar is not None else _bernoulli(top, generator)
        hs = [h]
        for dec in reversed(self.decoders[1:]):
            h = _bernoulli(dec(h), generator)
            hs.insert(0, h)
        return self.visible_layer.sample(self.decoders[0](hs[0]), generator), hs

    def latent_density(self, x: torch.Tensor) -> BinaryDensity:
        """log p(x, h) for fixed x [chains, n_visible] as a ``BinaryDensity`` over h = [h_1, ..., h_n].

        What single-site Gibbs over the latent units needs; Bernoulli visibles only.

        Parameters
        ----------
        x : torch.Tensor
            ``[chains, n_visible]`` binary data, one row per chain.

        Returns
        -------
        BinaryDensity
            log p(x, h) over h, the layers side by side, ``[chains, n_latent]``.

        Raises
        ------
        ConfigError
            (``nvil.core.errors``) If the visibles are multinomial.
        """
        require_bernoulli_visibles(self)
        sl = layer_slices(self.layers)
        d = DensityBuilder(self.n_latent, x.shape[0], x)
        d.bernoulli(x, self.decoders[0].bias, [(sl[0], self.decoders[0].weight)])
        for i in range(1, len(self.layers)):
            d.bernoulli(sl[i - 1], self.decoders[i].bias, [(sl[i], self.decoders[i].weight)])
        d.bernoulli(sl[-1], self.prior_logits, [] if self.prior_ar is None else [(sl[-1], self.prior_ar.masked_weight())])
        return d.build()

    def log_likelihood(self, x: torch.Tensor, hs: list[torch.Tensor]) -> torch.Tensor:
        """log p(x | h_1), what the harmonic-mean estimator averages the reciprocal of.

        Parameters
        ----------
        x : torch.Tensor
            ``[..., n_visible]`` data.
        hs : list of torch.Tensor
            [h_1, ..., h_n]; only h_1 is read.

        Returns
        -------
        torch.Tensor
            ``[...]`` log p(x | h_1).
        """
        return self.visible_log_prob(self.decoders[0](hs[0]), x)

    @torch.no_grad()
    def visible_probs(self, hs: list[torch.Tensor]) -> torch.Tensor:
        """p(x_j = 1 | h_1) (or word probabilities): what sample grids show, less noisy than samples.

        Parameters
        ----------
        hs : list of torch.Tensor
            [h_1, ..., h_n]; only h_1 is read.

        Returns
        -------
        torch.Tensor
            ``[..., n_visible]`` probabilities, without gradient.
        """
        return self.visible_layer.mean(self.decoders[0](hs[0]))


def _bernoulli(logits: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    return bernoulli_sample(torch.sigmoid(logits), generator)
