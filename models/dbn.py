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
    """Deep belief network (Hinton, Osindero & Teh 2006): directed sigmoid layers under an undirected top RBM.

    A stack of binary RBMs with layer sizes [n_visible, H_1, ..., H_L], RBM l joining layer l - 1 (layer 0 the
    pixels) to layer l. Trained greedily (``nvil.learners.greedy.Greedy``), the stack defines

        P(v, h_1, ..., h_L) = P(v | h_1) P(h_1 | h_2) ... P(h_{L-2} | h_{L-1}) P(h_{L-1}, h_L),

    with P(h_{l-1} | h_l) = sigmoid(b_l + W_l h_l) (RBM l's visible bias and weights) and the top RBM's
    P(h_{L-1}, h_L). Summing h_L out analytically (Murray & Salakhutdinov 2009, Eq. 16) gives
    ``P*(v, h_1, ..., h_{L-1}) = Z P(v, h_1, ..., h_{L-1})`` (``log_joint``), so every estimate of log P(v)
    subtracts one estimate of log Z, the top RBM's partition function. The latent units an estimator sums over are
    h_1 .. h_{L-1} (``layers``); ``recognition()`` is the approximate posterior greedy learning leaves behind, the
    factorial up-pass Q(h_l | h_{l-1}) = sigmoid(c_l + W_l' h_{l-1}).

    Parameters
    ----------
    n_visible : int
        Number of binary pixels.
    sizes : list of int
        Hidden layer sizes [H_1, ..., H_L] from the bottom up; at least two (one hidden layer is an RBM:
        ``model=rbm``).

    Attributes
    ----------
    rbms : torch.nn.ModuleList
        The L binary ``BoltzmannMachine``s, bottom first: RBM l has weights W_l ``(H_{l-1}, H_l)``, visible bias
        b_l (the directed layer's) and hidden bias c_l (the up-pass's).
    capabilities : frozenset of str
        ``TOP_MACHINE``, ``LAYER_STACK``, ``BINARY_LATENTS`` and ``CLOSED_FORM_LIKELIHOOD``
        (``nvil.models.protocol``).
    data_support : str
        ``"binary"``: data rows hold binary pixels.
    visible_layer : nvil.models.visible.Bernoulli
        Every layer of the stack is binary.

    Raises
    ------
    ValueError
        If ``sizes`` has fewer than two layers.

    Examples
    --------
    >>> import itertools
    >>> import torch
    >>> from nvil.models import DBN
    >>> dbn = DBN(6, [4, 3])
    >>> dbn.layers, dbn.n_latent                       # h_2 is summed out analytically
    ([4], 4)
    >>> v, hs = dbn.sample(2, gibbs_sweeps=10)
    >>> v.shape, [h.shape for h in hs]
    (torch.Size([2, 6]), [torch.Size([2, 4])])
    >>> dbn.log_joint(v, hs).shape
    torch.Size([2])
    >>> states = lambda n: torch.tensor(list(itertools.product([0.0, 1.0], repeat=n)))
    >>> v_all, h_all = states(6).repeat_interleave(16, 0), states(4).repeat(64, 1)   # every (v, h_1)
    >>> log_p_star = dbn.log_joint(v_all, [h_all])
    >>> bool(torch.isclose(torch.logsumexp(log_p_star, 0), dbn.top.log_z_exact(), atol=1e-4))   # sums to Z
    True
    >>> hs_q, log_qs = dbn.recognition().sample(v)     # the up-pass Q(h_1 | v)
    >>> [h.shape for h in hs_q], [q.shape for q in log_qs]
    ([torch.Size([2, 4])], [torch.Size([2])])
    """

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
        """The top RBM, ``rbms[-1]``: its log Z normalises every estimate, and ``top_data`` gives its data rows."""
        return self.rbms[-1]

    @property
    def layers(self) -> list[int]:
        """The latent layers an estimator sums over: h_1 .. h_{L-1} (h_L is summed out analytically)."""
        return self.sizes[:-1]

    @property
    def n_latent(self) -> int:
        """Number of latent units an estimator sums over: H_1 + ... + H_{L-1}."""
        return sum(self.layers)

    @torch.no_grad()
    def init_visible_bias(self, train_mean: torch.Tensor) -> None:
        """Set the bottom RBM's visible biases b_1 at the data marginals: the logit of the mean pixel.

        Parameters
        ----------
        train_mean : torch.Tensor
            ``(n_visible,)`` mean of the training rows.
        """
        self.rbms[0].init_visible_bias(train_mean)

    def filters(self) -> torch.Tensor:
        """The bottom RBM's receptive fields, for TensorBoard image grids.

        Returns
        -------
        torch.Tensor
            ``(H_1, n_visible)``: W_1', detached.
        """
        return self.rbms[0].filters()

    # ---- the generative model ------------------------------------------------------------------------
    def directed_logits(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """Logits of P(h_{layer-1} | h_layer) = sigmoid(b + W h) (h_0 = v), from RBM ``layer`` (1-based).

        Parameters
        ----------
        layer : int
            l, from 1 (the logits of v given h_1) to L - 1 (those of h_{L-2} given h_{L-1}).
        h : torch.Tensor
            ``(chains, H_l)`` binary states of layer l.

        Returns
        -------
        torch.Tensor
            ``(chains, H_{l-1})`` logits b_l + W_l h_l.
        """
        rbm = self.rbms[layer - 1]
        return rbm.b + h @ rbm.W.T

    def log_likelihood(self, x: torch.Tensor, hs: list[torch.Tensor]) -> torch.Tensor:
        """log P(v | h_1), the bottom directed layer's Bernoulli log-likelihood.

        Parameters
        ----------
        x : torch.Tensor
            ``(chains, n_visible)`` binary pixels v.
        hs : list of torch.Tensor
            The latent layers [h_1, ..., h_{L-1}], each ``(chains, H_l)``; only h_1 is read.

        Returns
        -------
        torch.Tensor
            ``(chains,)`` log P(v | h_1).
        """
        return self.visible_layer.log_prob(self.directed_logits(1, hs[0]), x)

    def log_joint(self, x: torch.Tensor, hs: list[torch.Tensor]) -> torch.Tensor:
        """``log P*(v, h_1..h_{L-1}) = sum_l log P(h_{l-1} | h_l) - F_top(h_{L-1})``; subtract log Z for log P.

        F_top is the top RBM's free energy, its hidden layer h_L summed out (Murray & Salakhutdinov 2009, Eq. 16),
        and log Z that RBM's log partition function.

        Parameters
        ----------
        x : torch.Tensor
            ``(chains, n_visible)`` binary pixels v.
        hs : list of torch.Tensor
            The latent layers [h_1, ..., h_{L-1}], each ``(chains, H_l)`` binary.

        Returns
        -------
        torch.Tensor
            ``(chains,)`` log P*(v, h_1, ..., h_{L-1}) (the terms' shapes broadcast).
        """
        below = [x] + list(hs[:-1])
        terms = [bernoulli_log_prob(self.directed_logits(i + 1, h), b) for i, (h, b) in enumerate(zip(hs, below))]
        terms.append(-self.top.free_energy(hs[-1]))
        return torch.stack(torch.broadcast_tensors(*terms)).sum(0)

    def latent_density(self, x: torch.Tensor) -> BinaryDensity:
        """``log P*(x, h_1..h_{L-1})`` for fixed x as a ``BinaryDensity`` over the latent units, layer 1 first.

        The density holds the directed layers' Bernoulli terms, and -F_top = b_top'h + sum softplus(c_top + h W_top)
        (a + sign factor), in the form single-site Gibbs updates cheaply (``nvil.models.binary_density``); its
        ``log_prob`` of the concatenated layers is ``log_joint``.

        Parameters
        ----------
        x : torch.Tensor
            ``(chains, n_visible)`` binary pixels, one row per chain.

        Returns
        -------
        BinaryDensity
            log P*(x, h) as a function of h ``(chains, H_1 + ... + H_{L-1})``.
        """
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
        """Draw ``n`` approximate samples: block Gibbs in the top RBM, then the directed layers down.

        ``gibbs_sweeps`` block-Gibbs sweeps in the top RBM from uniform h_{L-1}, then h_{l-1} ~ P(h_{l-1} | h_l)
        down to v, without autograd.

        Parameters
        ----------
        n : int
            Number of independent chains, one sample each.
        generator : torch.Generator or None, default None
            Source of randomness; None uses torch's global generator.
        gibbs_sweeps : int, default 1000
            Block-Gibbs sweeps in the top RBM.

        Returns
        -------
        tuple of (torch.Tensor, list of torch.Tensor)
            ``(v, [h_1, ..., h_{L-1}])``: v ``(n, n_visible)`` and each h_l ``(n, H_l)``, all binary.
        """
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
        """The pixel means P(v = 1 | h_1) = sigmoid(b_1 + W_1 h_1), what sample grids show.

        Parameters
        ----------
        hs : list of torch.Tensor
            The latent layers [h_1, ..., h_{L-1}], each ``(chains, H_l)``; only h_1 is read.

        Returns
        -------
        torch.Tensor
            ``(chains, n_visible)`` probabilities, without autograd.
        """
        return self.visible_layer.mean(self.directed_logits(1, hs[0]))

    @torch.no_grad()
    def top_data(self, train: torch.Tensor, batch_size: int = 5000) -> torch.Tensor:
        """The top RBM's data: rows pushed up through the RBMs below it as probabilities p(h_{L-1} = 1 | ...).

        p(h_{L-1} = 1 | ...) of data rows through the RBMs below the top, each layer's probabilities the input of
        the next: the top RBM's data (its base-rate marginals and the reverse chains' ``data`` starts). Sparse
        batches are made dense; no autograd.

        Parameters
        ----------
        train : torch.Tensor
            ``(rows, n_visible)`` data rows, dense or sparse.
        batch_size : int, default 5000
            Rows pushed up at a time.

        Returns
        -------
        torch.Tensor
            ``(rows, H_{L-1})`` probabilities.
        """
        out = []
        for s0 in range(0, train.shape[0], batch_size):
            x = train[s0:s0 + batch_size]
            x = x.to_dense() if x.is_sparse else x
            for rbm in self.rbms[:-1]:
                x = rbm.h_given_x(x)
            out.append(x)
        return torch.cat(out)

    def recognition(self) -> "DBNRecognition":
        """The approximate posterior Q(h_1..h_{L-1} | v) that greedy learning leaves behind: the stack's up-pass.

        Returns
        -------
        DBNRecognition
            Q(h_l | h_{l-1}) = sigmoid(c_l + W_l' h_{l-1}), on this DBN's parameters (none of its own).
        """
        return DBNRecognition(self)


class DBNRecognition:
    """Q(h_1..h_{L-1} | v) = prod_l Q(h_l | h_{l-1}), the greedy stack's up-pass. Same interface as
    ``nvil.models.inference.LayeredInference`` (``sample``, ``log_prob_layers``, ``log_prob``), no parameters
    of its own."""

    def __init__(self, dbn: DBN) -> None:
        self.dbn = dbn

    def logits(self, layer: int, below: torch.Tensor) -> torch.Tensor:
        """Logits c_l + W_l' h_{l-1} of Q(h_l | h_{l-1}) for ``layer`` l (1-based; h_0 = v), ``(chains, H_l)``."""
        rbm = self.dbn.rbms[layer - 1]
        return rbm.c + below @ rbm.W

    def sample(self, x: torch.Tensor, generator: torch.Generator | None = None):
        """Draw h_1, ..., h_{L-1} up the stack from Q, with each layer's log Q(h_l | h_{l-1}).

        Parameters
        ----------
        x : torch.Tensor
            ``(chains, n_visible)`` binary pixels.
        generator : torch.Generator or None, default None
            Source of randomness; None uses torch's global generator.

        Returns
        -------
        tuple of (list of torch.Tensor, list of torch.Tensor)
            ``([h_1, ..., h_{L-1}], [log Q(h_1 | v), ...])``: states ``(chains, H_l)`` (drawn without autograd)
            and ``(chains,)`` log probabilities (differentiable in the weights).
        """
        h, hs, log_qs = x, [], []
        for layer in range(1, len(self.dbn.sizes)):
            logits = self.logits(layer, h)
            with torch.no_grad():
                h = bernoulli_sample(torch.sigmoid(logits), generator)
            hs.append(h)
            log_qs.append(bernoulli_log_prob(logits, h))
        return hs, log_qs

    def latent_density(self, x: torch.Tensor) -> BinaryDensity:
        """log Q(h | x) for fixed x as a normalised ``BinaryDensity`` over h_1 .. h_{L-1}, layer 1 first."""
        sl = layer_slices(self.dbn.layers)
        d = DensityBuilder(self.dbn.n_latent, x.shape[0], x)
        d.bernoulli(sl[0], self.logits(1, x))
        for layer in range(2, len(self.dbn.sizes)):
            d.bernoulli(sl[layer - 1], self.dbn.rbms[layer - 1].c, [(sl[layer - 2], self.dbn.rbms[layer - 1].W.T)])
        return d.build()

    def log_prob_layers(self, hs: list[torch.Tensor], x: torch.Tensor) -> list[torch.Tensor]:
        """[log Q(h_1 | v), ..., log Q(h_{L-1} | h_{L-2})], each ``(chains,)``, for given layers ``hs``."""
        below = [x] + list(hs[:-1])
        return [bernoulli_log_prob(self.logits(i + 1, b), h) for i, (b, h) in enumerate(zip(below, hs))]

    def log_prob(self, hs: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """log Q(h_1..h_{L-1} | v), the sum of ``log_prob_layers``, ``(chains,)``."""
        return torch.stack(torch.broadcast_tensors(*self.log_prob_layers(hs, x))).sum(0)
