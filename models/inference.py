"""Inference networks q(h | x) for directed binary models.

Layer by layer (Mnih & Gregor 2014, Eq. 11): q(h | x) = q(h_1 | x) prod_{i=2}^{n} q(h_i | h_{i-1}).
Each layer is factorial, logits U_i h_{i-1} + c_i, or with ``autoregressive=True`` has connections
among its own units, p(h_ij | h_i,<j, h_{i-1}) (the paper's Table 2). The input x is centred by the
training mean before it enters the network, which the paper reports as essential.
"""

from __future__ import annotations

import torch
from torch import nn

from nvil.backend import gemm
from nvil.backend.native.bernoulli_log_prob import bernoulli_log_prob
from nvil.models.autoregressive import AutoregressiveLinear
from nvil.models.binary_density import BinaryDensity, DensityBuilder, layer_slices


def sigmoid_once(logits: torch.Tensor) -> torch.Tensor:
    """sigmoid(logits); logits repeated along a stride-0 leading dimension (the K-sample bounds' first layer, the
    same for every sample) pass through the sigmoid once per distinct row and are expanded back."""
    if logits.dim() == 3 and logits.stride(0) == 0:
        return torch.sigmoid(logits[0]).expand(logits.shape)
    return torch.sigmoid(logits)


class LayeredInference(nn.Module):
    """Inference network q(h | x) = q(h_1 | x) prod_{i=2}^{n} q(h_i | h_{i-1}) for a directed binary model.

    Layer by layer (Mnih & Gregor 2014, Eq. 11), each layer factorial with logits U_i h_{i-1} + c_i, or with
    ``autoregressive=True`` with connections among its own units, p(h_ij | h_i,<j, h_{i-1}) (the paper's Table 2).
    The input x is centred by the training mean (``set_input_mean``) before it enters the network.

    Parameters
    ----------
    n_visible : int
        The number of visible units: the width of x.
    layers : list of int
        [|h_1|, ..., |h_n|], the sizes of the latent layers from the data up (those of the model it serves).
    autoregressive : bool, default False
        Give each layer strictly lower-triangular connections among its own units (the paper's autoregressive
        inference network) instead of a factorial q(h_i | h_{i-1}).

    Examples
    --------
    >>> import torch
    >>> from nvil.models.inference import LayeredInference
    >>> q = LayeredInference(6, [4, 3])
    >>> x = torch.bernoulli(torch.full((5, 6), 0.5))
    >>> hs, log_qs = q.sample(x)
    >>> [h.shape for h in hs], [lq.shape for lq in log_qs]
    ([torch.Size([5, 4]), torch.Size([5, 3])], [torch.Size([5]), torch.Size([5])])
    >>> torch.allclose(q.log_prob(hs, x), log_qs[0] + log_qs[1])
    True
    >>> q.factorial, LayeredInference(6, [4], autoregressive=True).factorial
    (True, False)
    """

    def __init__(self, n_visible: int, layers: list[int], autoregressive: bool = False) -> None:
        super().__init__()
        sizes = [int(n_visible)] + [int(n) for n in layers]
        # encoders[i] maps h_i to the logits of h_{i+1} (h_0 = centred x).
        self.encoders = nn.ModuleList(gemm.Linear(sizes[i], sizes[i + 1]) for i in range(len(layers)))
        self.within = nn.ModuleList(AutoregressiveLinear(n) for n in sizes[1:]) if autoregressive else None
        self.register_buffer("input_mean", torch.zeros(int(n_visible)))

    @torch.no_grad()
    def set_input_mean(self, mean: torch.Tensor) -> None:
        """Set the mean that centres x before it enters the network (the training data's mean, in place).

        Parameters
        ----------
        mean : torch.Tensor
            ``[n_visible]`` the training mean of x, copied into the buffer ``input_mean``.
        """
        self.input_mean.copy_(mean)

    @property
    def layered_bernoulli(self) -> bool:
        """Every layer Bernoulli with logits affine in the layer below: always True for this network.

        Affine in the layer below (and, autoregressive, in the layer's own preceding units): the case NVIL's
        hand-derived gradients cover (``nvil.learners.fused``).
        """
        return True

    @property
    def factorial(self) -> bool:
        """Every layer factorial (not autoregressive): one uniform per unit decides it, all units at once."""
        return self.within is None

    def centre(self, x: torch.Tensor) -> torch.Tensor:
        """x minus the training mean: the input of the first layer.

        Parameters
        ----------
        x : torch.Tensor
            ``[..., n_visible]`` data.

        Returns
        -------
        torch.Tensor
            ``x - input_mean``, the same shape.
        """
        return x - self.input_mean

    def _layer_log_prob(self, i: int, base_logits: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        if self.within is None:
            return bernoulli_log_prob(base_logits, h)
        return self.within[i].log_prob(base_logits, h)

    def _first_logits(self, x: torch.Tensor) -> torch.Tensor:
        """U_1 (x - mean) + c_1. When x repeats one batch along a stride-0 leading dimension (the
        ``x.unsqueeze(0).expand(K, ...)`` of the K-sample bounds), the logits are computed once per example and
        expanded: the same values, without K copies of the largest matmul."""
        enc = self.encoders[0]
        if x.dim() == 3 and x.stride(0) == 0:
            return enc(self.centre(x[0])).expand(x.shape[0], -1, -1)
        return enc(self.centre(x))

    def layer_logits(self, i: int, below: torch.Tensor) -> torch.Tensor:
        """The logits of layer i (0-based) given the layer below it: U_i h_{i-1} + c_i.

        The layer below is x for i = 0, centred here. With autoregressive layers this is the part that does not
        depend on the layer's own units. When x repeats one batch along a stride-0 leading dimension (the K-sample
        bounds), the first layer's logits are computed once per example and expanded.

        Parameters
        ----------
        i : int
            The layer, 0-based (0 is h_1, whose layer below is x).
        below : torch.Tensor
            ``[..., |h_{i-1}|]`` the layer below (x, uncentred, for i = 0).

        Returns
        -------
        torch.Tensor
            ``[..., |h_i|]`` logits.
        """
        return self._first_logits(below) if i == 0 else self.encoders[i](below)

    def sample(self, x: torch.Tensor, generator: torch.Generator | None = None
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Draw h ~ q(h | x) layer by layer, with each layer's log q(h_i | h_{i-1}).

        Each layer is drawn with ``generator`` (factorial layers: u < sigmoid(logits), u ~ U(0, 1)).

        Parameters
        ----------
        x : torch.Tensor
            ``[..., n_visible]`` data (any leading dimensions: samples, examples).
        generator : torch.Generator or None, default None
            Source of randomness; None uses torch's global generator.

        Returns
        -------
        tuple of (list of torch.Tensor, list of torch.Tensor)
            ``(h_layers, log_q_layers)``: binary samples ``[..., |h_i|]`` (no gradient) and log q(h_i | h_{i-1})
            ``[...]`` (with gradient), one of each per layer, from the data up.
        """
        h = x
        hs, log_qs = [], []
        for i in range(len(self.encoders)):
            base = self.layer_logits(i, x if i == 0 else h)
            with torch.no_grad():
                if self.within is not None:
                    h = self.within[i].sample(base, generator)
                else:
                    u = torch.rand(base.shape, generator=generator, device=base.device, dtype=base.dtype)
                    h = (u < sigmoid_once(base)).to(base.dtype)
            hs.append(h)
            log_qs.append(self._layer_log_prob(i, base, h))
        return hs, log_qs

    def log_prob_layers(self, hs: list[torch.Tensor], x: torch.Tensor) -> list[torch.Tensor]:
        """[log q(h_1 | x), log q(h_2 | h_1), ...]; broadcasts over leading dimensions.

        Parameters
        ----------
        hs : list of torch.Tensor
            [h_1, ..., h_n], binary ``[..., |h_i|]``.
        x : torch.Tensor
            ``[..., n_visible]`` data.

        Returns
        -------
        list of torch.Tensor
            One ``[...]`` log-probability per layer, each summed over the layer's units.
        """
        below = [self.centre(x)] + list(hs[:-1])
        return [self._layer_log_prob(i, enc(v), h) for i, (enc, v, h) in enumerate(zip(self.encoders, below, hs))]

    def log_prob(self, hs: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """log q(h | x) = log q(h_1 | x) + sum_{i>=2} log q(h_i | h_{i-1}) (Eq. 11): the layers' terms summed.

        Parameters
        ----------
        hs : list of torch.Tensor
            [h_1, ..., h_n], binary ``[..., |h_i|]``.
        x : torch.Tensor
            ``[..., n_visible]`` data.

        Returns
        -------
        torch.Tensor
            ``[...]`` log q(h | x), the layers' terms broadcast together.
        """
        return torch.stack(torch.broadcast_tensors(*self.log_prob_layers(hs, x))).sum(0)

    def latent_density(self, x: torch.Tensor) -> BinaryDensity:
        """log q(h | x) for fixed x [chains, n_visible] as a normalised ``BinaryDensity`` over h.

        Parameters
        ----------
        x : torch.Tensor
            ``[chains, n_visible]`` data, one row per chain.

        Returns
        -------
        BinaryDensity
            log q(h | x) over h = [h_1, ..., h_n] side by side, ``[chains, sum(layers)]``.
        """
        sizes = [enc.out_features for enc in self.encoders]
        sl = layer_slices(sizes)
        d = DensityBuilder(sum(sizes), x.shape[0], x)
        for i, enc in enumerate(self.encoders):
            within = [] if self.within is None else [(sl[i], self.within[i].masked_weight())]
            if i == 0:
                d.bernoulli(sl[0], enc(self.centre(x)), within)
            else:
                d.bernoulli(sl[i], enc.bias, [(sl[i - 1], enc.weight)] + within)
        return d.build()
