"""Deep belief networks (Hinton, Osindero & Teh 2006), as evaluated by Salakhutdinov & Murray 2008 and
Murray & Salakhutdinov 2009.

A stack of binary RBMs with layer sizes [n_visible, H_1, ..., H_L]. Trained greedily, the stack defines

    P(v, h_1, ..., h_L) = P(v | h_1) P(h_1 | h_2) ... P(h_{L-2} | h_{L-1}) P(h_{L-1}, h_L),

directed sigmoid layers P(h_{l-1} | h_l) = sigmoid(b_l + W_l h_l) (RBM l's visible bias and weights) under
an undirected top RBM. Summing the top layer h_L out analytically (Murray & Salakhutdinov 2009, Eq. 16),

    P*(v, h_1, ..., h_{L-1}) = Z P(v, h_1, ..., h_{L-1}) = P(v | h_1) ... exp(-F_top(h_{L-1})),

so ``log_joint`` is log P* and every estimate of log P(v) subtracts one estimate of log Z, the top RBM's
partition function. The latent units an estimator sums over are h_1 .. h_{L-1} (``layers``).

The approximate posterior Q(h | v) that greedy learning leaves behind is the stack's up-pass,
Q(h_l | h_{l-1}) = sigmoid(c_l + W_l' h_{l-1}), factorial within each layer (``recognition``).
"""

from __future__ import annotations

import torch
from torch import nn

from nvil.backend.native.bernoulli_log_prob import bernoulli_log_prob
from nvil.models.binary_density import BinaryDensity, DensityBuilder, layer_slices
from nvil.models.protocol import BINARY_LATENTS, CLOSED_FORM_LIKELIHOOD, LAYER_STACK, TOP_MACHINE
from nvil.models.rbm import BoltzmannMachine
from nvil.models.visible import Bernoulli, bernoulli_sample


class DBN(nn.Module):
    capabilities = frozenset({TOP_MACHINE, LAYER_STACK, BINARY_LATENTS, CLOSED_FORM_LIKELIHOOD})
    data_support = "binary"
    visible_layer = Bernoulli()  # every layer of the stack is binary

    def __init__(self, n_visible: int, sizes: list[int]) -> None:
        super().__init__()
        if len(sizes) < 2:
            raise ValueError("a DBN needs at least two hidden layers (one is an RBM: model=rbm)")
        self.n_visible = int(n_visible)
        self.sizes = [int(n) for n in sizes]
        below = [self.n_visible] + self.sizes[:-1]
        self.rbms = nn.ModuleList(BoltzmannMachine(nv, nh) for nv, nh in zip(below, self.sizes))

    # ---- bookkeeping -----------------------------------------------------------------------------
    @property
    def top(self) -> BoltzmannMachine:
        return self.rbms[-1]

    @property
    def layers(self) -> list[int]:
        """The latent layers an estimator sums over: h_1 .. h_{L-1} (h_L is summed out analytically)."""
        return self.sizes[:-1]

    @property
    def n_latent(self) -> int:
        return sum(self.layers)

    @torch.no_grad()
    def init_visible_bias(self, train_mean: torch.Tensor) -> None:
        self.rbms[0].init_visible_bias(train_mean)

    def filters(self) -> torch.Tensor:
        return self.rbms[0].filters()

    # ---- the generative model ------------------------------------------------------------------------
    def directed_logits(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """Logits of P(h_{layer-1} | h_layer) = sigmoid(b + W h) (h_0 = v), from RBM ``layer`` (1-based)."""
        rbm = self.rbms[layer - 1]
        return rbm.b + h @ rbm.W.T

    def log_likelihood(self, x: torch.Tensor, hs: list[torch.Tensor]) -> torch.Tensor:
        """log P(v | h_1)."""
        return self.visible_layer.log_prob(self.directed_logits(1, hs[0]), x)

    def log_joint(self, x: torch.Tensor, hs: list[torch.Tensor]) -> torch.Tensor:
        """log P*(v, h_1..h_{L-1}) = sum_l log P(h_{l-1} | h_l) - F_top(h_{L-1}); subtract log Z for log P."""
        below = [x] + list(hs[:-1])
        terms = [bernoulli_log_prob(self.directed_logits(i + 1, h), b) for i, (h, b) in enumerate(zip(hs, below))]
        terms.append(-self.top.free_energy(hs[-1]))
        return torch.stack(torch.broadcast_tensors(*terms)).sum(0)

    def latent_density(self, x: torch.Tensor) -> BinaryDensity:
        """log P*(x, h_1..h_{L-1}) for fixed x [chains, n_visible] as a ``BinaryDensity``: the directed
        layers' Bernoulli terms, and -F_top = b_top'h + sum softplus(c_top + h W_top) (a + sign factor)."""
        sl = layer_slices(self.layers)
        d = DensityBuilder(self.n_latent, x.shape[0], x)
        d.bernoulli(x, self.rbms[0].b, [(sl[0], self.rbms[0].W)])
        for layer in range(2, len(self.sizes)):
            d.bernoulli(sl[layer - 2], self.rbms[layer - 1].b, [(sl[layer - 1], self.rbms[layer - 1].W)])
        d.linear(sl[-1], self.top.b)
        d.softplus_factor(sl[-1], self.top.W, self.top.c, +1.0)
        return d.build()

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None, gibbs_sweeps: int = 1000):
        """Approximate samples: ``gibbs_sweeps`` block-Gibbs sweeps in the top RBM, then the directed
        layers down. Returns (v, [h_1, ..., h_{L-1}])."""
        top = self.top
        p = torch.full((n, top.n_pixels), 0.5, device=top.W.device, dtype=top.W.dtype)
        h = bernoulli_sample(p, generator)
        for _ in range(gibbs_sweeps):
            h = top.sample_x_given_h(top.sample_h(h, 1.0, generator), 1.0, generator)
        hs = [h]
        for layer in range(len(self.sizes) - 1, 0, -1):
            hs.insert(0, bernoulli_sample(torch.sigmoid(self.directed_logits(layer, hs[0])), generator))
        return hs[0], hs[1:]

    @torch.no_grad()
    def visible_probs(self, hs: list[torch.Tensor]) -> torch.Tensor:
        return self.visible_layer.mean(self.directed_logits(1, hs[0]))

    @torch.no_grad()
    def top_data(self, train: torch.Tensor, batch_size: int = 5000) -> torch.Tensor:
        """p(h_{L-1} = 1 | ...) of data rows through the RBMs below the top: the top RBM's data (its base-rate
        marginals and the reverse chains' ``data`` starts)."""
        out = []
        for s0 in range(0, train.shape[0], batch_size):
            x = train[s0:s0 + batch_size]
            x = x.to_dense() if x.is_sparse else x
            for rbm in self.rbms[:-1]:
                x = rbm.h_given_x(x)
            out.append(x)
        return torch.cat(out)

    def recognition(self) -> "DBNRecognition":
        return DBNRecognition(self)


class DBNRecognition:
    """Q(h_1..h_{L-1} | v) = prod_l Q(h_l | h_{l-1}), the greedy stack's up-pass. Same interface as
    ``nvil.models.inference.LayeredInference`` (``sample``, ``log_prob_layers``, ``log_prob``), no parameters
    of its own."""

    def __init__(self, dbn: DBN) -> None:
        self.dbn = dbn

    def logits(self, layer: int, below: torch.Tensor) -> torch.Tensor:
        rbm = self.dbn.rbms[layer - 1]
        return rbm.c + below @ rbm.W

    def sample(self, x: torch.Tensor, generator: torch.Generator | None = None):
        h, hs, log_qs = x, [], []
        for layer in range(1, len(self.dbn.sizes)):
            logits = self.logits(layer, h)
            with torch.no_grad():
                h = bernoulli_sample(torch.sigmoid(logits), generator)
            hs.append(h)
            log_qs.append(bernoulli_log_prob(logits, h))
        return hs, log_qs

    def latent_density(self, x: torch.Tensor) -> BinaryDensity:
        """log Q(h | x) for fixed x as a normalised ``BinaryDensity``."""
        sl = layer_slices(self.dbn.layers)
        d = DensityBuilder(self.dbn.n_latent, x.shape[0], x)
        d.bernoulli(sl[0], self.logits(1, x))
        for layer in range(2, len(self.dbn.sizes)):
            d.bernoulli(sl[layer - 1], self.dbn.rbms[layer - 1].c, [(sl[layer - 2], self.dbn.rbms[layer - 1].W.T)])
        return d.build()

    def log_prob_layers(self, hs: list[torch.Tensor], x: torch.Tensor) -> list[torch.Tensor]:
        below = [x] + list(hs[:-1])
        return [bernoulli_log_prob(self.logits(i + 1, b), h) for i, (b, h) in enumerate(zip(below, hs))]

    def log_prob(self, hs: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return torch.stack(torch.broadcast_tensors(*self.log_prob_layers(hs, x))).sum(0)
