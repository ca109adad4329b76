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
    """A belief network with ``layers`` = [|h_1|, ..., |h_n|] binary latent units."""

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
        return sum(self.layers)

    @property
    def layered_bernoulli(self) -> bool:
        """Every conditional a Bernoulli with logits affine in the layer above (Bernoulli visibles; the prior factorial
        or autoregressive, as fDARN's): the case NVIL's hand-derived gradients cover (``nvil.learners.fused``)."""
        return self.visible_layer.name == "bernoulli"

    @torch.no_grad()
    def init_visible_bias(self, train_mean: torch.Tensor, eps: float = 1e-3) -> None:
        """Start the output bias at the data marginals: logit of the mean image, or for a multinomial
        visible layer the log of the mean word frequencies."""
        bias = self.decoders[0].bias
        bias.copy_(self.visible_layer.bias_from_mean(train_mean.to(bias), eps))

    def visible_log_prob(self, logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.visible_layer.log_prob(logits, x)

    def prior_log_prob(self, h_top: torch.Tensor) -> torch.Tensor:
        if self.prior_ar is None:
            return bernoulli_log_prob(self.prior_logits, h_top)
        return self.prior_ar.log_prob(self.prior_logits, h_top)

    def log_prob_layers(self, x: torch.Tensor, hs: list[torch.Tensor]) -> list[torch.Tensor]:
        """[log p(x | h_1), log p(h_1 | h_2), ..., log p(h_n)], each summed over units.

        These are the per-layer terms NVIL's layer-wise learning signals are built from
        (Mnih & Gregor 2014, Sec. 2.3.3).
        """
        terms = [self.visible_log_prob(self.decoders[0](hs[0]), x)]
        for dec, h, below in zip(self.decoders[1:], hs[1:], hs[:-1]):
            terms.append(bernoulli_log_prob(dec(h), below))
        terms.append(self.prior_log_prob(hs[-1]))
        return terms

    def log_joint(self, x: torch.Tensor, hs: list[torch.Tensor]) -> torch.Tensor:
        """log p(x, h_1, ..., h_n)."""
        return torch.stack(torch.broadcast_tensors(*self.log_prob_layers(x, hs))).sum(0)

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Ancestral sample: (x [n, n_visible], [h_1, ..., h_n])."""
        top = self.prior_logits.expand(n, -1)
        h = self.prior_ar.sample(top, generator) if self.prior_ar is not None else _bernoulli(top, generator)
        hs = [h]
        for dec in reversed(self.decoders[1:]):
            h = _bernoulli(dec(h), generator)
            hs.insert(0, h)
        return self.visible_layer.sample(self.decoders[0](hs[0]), generator), hs

    def latent_density(self, x: torch.Tensor) -> BinaryDensity:
        """log p(x, h) for fixed x [chains, n_visible] as a ``BinaryDensity`` over h = [h_1, ..., h_n]
        (what single-site Gibbs over the latent units needs; Bernoulli visibles only)."""
        require_bernoulli_visibles(self)
        sl = layer_slices(self.layers)
        d = DensityBuilder(self.n_latent, x.shape[0], x)
        d.bernoulli(x, self.decoders[0].bias, [(sl[0], self.decoders[0].weight)])
        for i in range(1, len(self.layers)):
            d.bernoulli(sl[i - 1], self.decoders[i].bias, [(sl[i], self.decoders[i].weight)])
        d.bernoulli(sl[-1], self.prior_logits, [] if self.prior_ar is None else [(sl[-1], self.prior_ar.masked_weight())])
        return d.build()

    def log_likelihood(self, x: torch.Tensor, hs: list[torch.Tensor]) -> torch.Tensor:
        """log p(x | h_1), what the harmonic-mean estimator averages the reciprocal of."""
        return self.visible_log_prob(self.decoders[0](hs[0]), x)

    @torch.no_grad()
    def visible_probs(self, hs: list[torch.Tensor]) -> torch.Tensor:
        """p(x_j = 1 | h_1) (or word probabilities): what sample grids show, less noisy than samples."""
        return self.visible_layer.mean(self.decoders[0](hs[0]))


def _bernoulli(logits: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    return bernoulli_sample(torch.sigmoid(logits), generator)
