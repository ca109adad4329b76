"""Greedy pretraining of a deep Boltzmann machine with the modified RBMs of Salakhutdinov & Hinton 2009 (Sec. 3.1).

A DBM's layer l gets input from below and from above, so a stack of plain RBMs would count the evidence twice once
joined. The stack is trained instead with RBMs whose conditionals are doubled on the side that the DBM will
complete: the bottom RBM doubles its bottom-up input (two tied copies of v), the top RBM its top-down input, a
middle RBM both,

    p(h = 1 | x) = sigmoid(u_l (c + x'W)),    p(x = 1 | h) = sigmoid(d_l (b + W h)),
    u_l = 2 below the top, 1 at the top;      d_l = 1 at the bottom, 2 above it.

Each RBM trains by CD-1 on binary states of the layer below: v itself for the bottom one, then states drawn from the
doubled up-pass of the RBMs already trained. The update is that of the author's ``rbm.m``: the statistics
<x p(h | x)'> of the data minus those of one reconstruction, a weight cost on W, and momentum,
inc <- m inc + lr (grad - weightcost W). The weights go into the DBM as they are; its biases compose the RBMs'
(``compose``): b = b_1, c_l = c_l + b_{l+1} below the top, c_L = c_L, as the author's ``dbm_mf.m`` does
(``hidbiases = hidbiases + visbiases_l2``).
"""

from __future__ import annotations

import torch

from nvil.models.dbm import DBM
from nvil.models.visible import bernoulli_sample


class ModifiedRBM:
    """RBM l of the pretraining stack (1-based): W is the DBM's own W_l (a view, updated in place); b and c are the
    RBM's own biases, kept until ``compose``."""

    def __init__(self, dbm: DBM, layer: int, b: torch.Tensor, c: torch.Tensor) -> None:
        self.layer = layer
        self.W = dbm.weight(layer)
        self.b, self.c = b, c
        top = len(dbm.sizes)
        self.up = 2.0 if layer < top else 1.0
        self.down = 1.0 if layer == 1 else 2.0
        self.inc = {"W": torch.zeros_like(self.W), "b": torch.zeros_like(b), "c": torch.zeros_like(c)}

    def h_given_x(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.up * (self.c + x @ self.W))

    def x_given_h(self, h: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.down * (self.b + h @ self.W.T))

    @torch.no_grad()
    def cd1(self, x: torch.Tensor, lr: float, weight_cost: float, momentum: float, generator) -> torch.Tensor:
        """One CD-1 update on binary rows x; returns the squared reconstruction error per row."""
        p_pos = self.h_given_x(x)
        recon = self.x_given_h(bernoulli_sample(p_pos, generator))
        x_neg = bernoulli_sample(recon, generator)
        p_neg = self.h_given_x(x_neg)
        n = x.shape[0]
        grads = {"W": (x.T @ p_pos - x_neg.T @ p_neg) / n - weight_cost * self.W,
                 "b": (x - x_neg).mean(0), "c": (p_pos - p_neg).mean(0)}
        for name, param in (("W", self.W), ("b", self.b), ("c", self.c)):
            self.inc[name].mul_(momentum).add_(grads[name], alpha=lr)
            param.add_(self.inc[name])
        return ((x - recon) ** 2).sum(-1)

    def state(self) -> dict:
        return {"layer": self.layer, "b": self.b, "c": self.c, **{f"inc_{k}": v for k, v in self.inc.items()}}

    def load(self, state: dict) -> None:
        self.b.copy_(state["b"])
        self.c.copy_(state["c"])
        for k, v in self.inc.items():
            v.copy_(state[f"inc_{k}"])


class Pretraining:
    """The stack's schedule: RBM l trains for ``steps[l - 1]`` updates, the rate ``lr``, weight cost
    ``weight_cost``, momentum ``momentum_initial`` for each RBM's first ``momentum_switch`` updates, then
    ``momentum``. ``biases`` holds each trained RBM's (b, c) until ``compose`` writes the DBM's."""

    def __init__(self, dbm: DBM, steps: list[int], lr: float, weight_cost: float, momentum: float,
                 momentum_initial: float, momentum_switch: int) -> None:
        self.dbm, self.steps = dbm, list(steps)
        self.lr, self.weight_cost = lr, weight_cost
        self.momentum, self.momentum_initial, self.momentum_switch = momentum, momentum_initial, momentum_switch
        self.ends = torch.tensor(self.steps).cumsum(0).tolist()
        self.biases: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.rbm: ModifiedRBM | None = None

    @property
    def total(self) -> int:
        return self.ends[-1] if self.ends else 0

    def layer_at(self, updates: int) -> int:
        """The RBM (1-based) that update number ``updates`` trains."""
        return 1 + sum(updates >= e for e in self.ends)

    def current(self, updates: int) -> ModifiedRBM:
        return self.rbm_for(self.layer_at(updates))

    def rbm_for(self, layer: int) -> ModifiedRBM:
        """RBM ``layer``, the RBMs below it finished first: their biases kept (a finished RBM's own, or an RBM given no
        updates: its starting biases)."""
        while len(self.biases) < layer - 1:
            below = self.rbm if self.rbm is not None and self.rbm.layer == len(self.biases) + 1 else \
                self.fresh(len(self.biases) + 1)
            self.biases.append((below.b.clone(), below.c.clone()))
            self.rbm = None
        if self.rbm is None or self.rbm.layer != layer:
            self.rbm = self.fresh(layer)
        return self.rbm

    def fresh(self, layer: int) -> ModifiedRBM:
        """RBM ``layer`` before its first update: the visible bias of the data for the first, zeros elsewhere."""
        dbm, w = self.dbm, self.dbm.top.W
        b = dbm.bias(0).detach().clone() if layer == 1 else torch.zeros(dbm.widths[layer - 1], dtype=w.dtype,
                                                                        device=w.device)
        return ModifiedRBM(dbm, layer, b, torch.zeros(dbm.widths[layer], dtype=w.dtype, device=w.device))

    @torch.no_grad()
    def up(self, v: torch.Tensor, layer: int, generator) -> torch.Tensor:
        """Binary states of layer ``layer - 1`` for data v: drawn from the doubled up-pass of the trained RBMs."""
        x = v
        for l, (_, c) in enumerate(self.biases[: layer - 1], start=1):
            x = bernoulli_sample(torch.sigmoid(2.0 * (c + x @ self.dbm.weight(l))), generator)
        return x

    @torch.no_grad()
    def step(self, v: torch.Tensor, updates: int, generator) -> dict[str, torch.Tensor]:
        rbm = self.current(updates)
        layer = self.layer_at(updates)
        start = self.ends[layer - 2] if layer > 1 else 0
        momentum = self.momentum_initial if updates - start < self.momentum_switch else self.momentum
        err = rbm.cd1(self.up(v, layer, generator), self.lr, self.weight_cost, momentum, generator)
        return {"pretrain/layer": torch.tensor(float(layer)), "pretrain/reconstruction_error": err.mean()}

    @torch.no_grad()
    def compose(self) -> None:
        """The DBM's biases from the trained RBMs: b = b_1, c_l = c_l + b_{l+1}, c_L = c_L."""
        L = len(self.dbm.sizes)
        if self.total == 0:  # no pretraining (pretrain_steps=0): the machine keeps its own initial biases
            return
        self.rbm_for(L)
        self.biases.append((self.rbm.b.clone(), self.rbm.c.clone()))
        self.rbm = None
        self.dbm.bias(0).copy_(self.biases[0][0])
        for l in range(1, L + 1):
            c = self.biases[l - 1][1] + (self.biases[l][0] if l < L else 0.0)
            self.dbm.bias(l).copy_(c)
        self.dbm.constrain_()

    def state(self) -> dict:
        return {"biases": [[b, c] for b, c in self.biases],
                "rbm": None if self.rbm is None else self.rbm.state()}

    def load(self, state: dict, updates: int) -> None:
        self.biases = [(pair[0], pair[1]) for pair in state["biases"]]
        self.rbm = None
        if state["rbm"] is not None:
            self.rbm = self.fresh(int(state["rbm"]["layer"]))
            self.rbm.load(state["rbm"])
