"""REBAR's and RELAX's control variate (``nvil.learners.discrete.relaxed``): eta, the temperature lambda and
RELAX's network r_rho, and the pieces r_rho is evaluated with."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

CV_INPUTS = ("relaxed", "x_z")
CV_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}
CV_OBJECTIVES = ("parameters", "logits")
CV_NOISE = ("independent", "common")


def mlp(n_in: int, hidden: int, depth: int, activation: str) -> nn.Sequential:
    """``depth`` hidden layers of ``hidden`` units, then one output, the output layer started at zero (so RELAX
    starts as REBAR)."""
    layers, width = [], n_in
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), CV_ACTIVATIONS[activation]()]
        width = hidden
    layers.append(nn.Linear(width, 1))
    nn.init.zeros_(layers[-1].weight)
    nn.init.zeros_(layers[-1].bias)
    return nn.Sequential(*layers)


class ControlVariate(nn.Module):
    """eta, the temperature lambda (as its log) and, for RELAX, r_rho (``hidden`` units per layer, ``depth`` layers),
    either one net on every layer's relaxed (or, below the relaxed one, hard) units (``inputs="relaxed"``), or, as in
    the RELAX authors' code, one net per latent layer i on (x - mean, z_i, 2 b_<i - 1): the centred input, layer i's
    logistic sample before the sigmoid, and the hard layers below (``inputs="x_z"``)."""

    def __init__(self, eta: float, temperature: float, sizes: list[int], hidden: int | None, n_visible: int = 0,
                 inputs: str = "relaxed", depth: int = 1, activation: str = "tanh") -> None:
        super().__init__()
        self.eta = nn.Parameter(torch.tensor(float(eta)))
        self.log_temperature = nn.Parameter(torch.tensor(math.log(float(temperature))))
        self.net, self.nets = None, None
        if hidden and inputs == "relaxed":
            self.net = mlp(sum(sizes), int(hidden), depth, activation)
        elif hidden:
            self.nets = nn.ModuleList(mlp(n_visible + sum(sizes[:i + 1]), int(hidden), depth, activation)
                                      for i in range(len(sizes)))

    def networks(self) -> list[nn.Module]:
        """r_rho's networks (none for REBAR)."""
        return [self.net] if self.net is not None else list(self.nets or [])


def on_parts(net: nn.Sequential, parts: list[torch.Tensor]) -> torch.Tensor:
    """net(cat(parts, -1)), the first Linear applied part by part on the weight's column blocks: a part without the
    stacked (z, z~) dimension (x - mean, the hard layers below) is multiplied once per example, not once per stacked
    copy, and the sum broadcasts. The same function as concatenating the parts (tests/test_discrete_estimators.py)."""
    first = net[0]
    blocks = first.weight.split([t.shape[-1] for t in parts], dim=1)
    pre = first.bias
    for t, w in zip(parts, blocks):
        pre = pre + F.linear(t, w)
    return net[1:](pre)


def _cat_broadcast(parts: list[torch.Tensor]) -> torch.Tensor:
    """``parts`` concatenated along the last dimension, their leading dimensions broadcast (z and z~ stacked)."""
    lead = torch.broadcast_shapes(*(t.shape[:-1] for t in parts))
    return torch.cat([t.expand(*lead, t.shape[-1]) for t in parts], -1)
