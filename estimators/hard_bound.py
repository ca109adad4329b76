"""A hard lower bound on a Boltzmann machine's log Z from probe states: Z = sum_x p*(x) = sum_h p*(h), so every
state gives log Z >= log p*(state), and a set of distinct states gives log Z >= logsumexp of their log p*.

Probes on the hidden side use log p*(h) = c'h + sum_i softplus(b_i + W_i h)
(``BoltzmannMachine.log_unnormalised_hidden``), on the binary visible side -F(x): all-off, all-on and one-hot
states, training rows, the persistent particles a checkpoint stores, every AIS end state, and joint modes found
by iterated conditional modes (``climb``) from many starts. An AIS estimate below this bound is wrong, whatever its
ESS says (``nvil.estimators.certify``).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from nvil.core.ops import chunks
from nvil.models.rbm import BoltzmannMachine


@dataclass
class HardBound:
    """log Z >= ``value``: the larger of the log-sum-exps of log p* over the distinct hidden and visible probes."""

    value: float
    best_single: float
    source: str       # the probe set holding the single best state
    num_probes: int   # distinct states evaluated


def binary_states(model: BoltzmannMachine, x: torch.Tensor, generator=None) -> torch.Tensor:
    """x made a valid state: binary pixels thresholded at 0.5 (probabilities from data or a DBN's up-pass),
    labels one-hot at their largest entry."""
    v, y = model.split(x)
    v = model.visible_layer.as_state(v)
    if y is None:
        return v
    return torch.cat([v, torch.nn.functional.one_hot(y.argmax(-1), model.n_labels).to(x.dtype)], -1)


@torch.no_grad()
def climb(model: BoltzmannMachine, h: torch.Tensor, max_iters: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """Iterated conditional modes on -E(x, h) from every row of h at once: x = argmax p(x | h), then
    h = argmax p(h | x), until no chain changes. Each half-step never lowers p*(x, h)."""
    for _ in range(max_iters):
        x = model.x_mode_given_h(h)
        new = (model.hidden_input(x) > 0).to(h.dtype)
        if torch.equal(new, h):
            break
        h = new
    return model.x_mode_given_h(h), h


@torch.no_grad()
def hard_lower_bound(model: BoltzmannMachine, visible_probes: dict[str, torch.Tensor], generator=None,
                     num_climb: int = 256) -> HardBound:
    """The hard lower bound on log Z from the probe states (see the module docstring). ``visible_probes`` maps a
    name (``training rows``, ``persistent particles``, ``AIS end states``) to rows of x; probes are scored in
    float64 on a copy of the model, so rounding cannot lift the bound above the truth."""
    m = copy.deepcopy(model).double()
    dev, H = m.W.device, m.n_hidden
    xs = {k: binary_states(m, v.to(dev, torch.float64)) for k, v in visible_probes.items() if v is not None and len(v)}
    hs: dict[str, torch.Tensor] = {}
    if m.hidden_marginal_tractable:
        eye = torch.eye(H, device=dev, dtype=torch.float64) if H <= 4096 else torch.zeros(0, H, device=dev, dtype=torch.float64)
        hs["all-off, all-on and one-hot hidden states"] = torch.cat([torch.zeros(1, H, device=dev, dtype=torch.float64),
                                                                      torch.ones(1, H, device=dev, dtype=torch.float64), eye])
        for k, x in xs.items():  # each probe's most probable h, and a draw of h
            a = m.hidden_input(x)
            p = torch.sigmoid(a)
            hs[f"hidden states of {k}"] = torch.cat([(a > 0).double(), (torch.rand(p.shape, generator=generator,
                                                     device=dev, dtype=torch.float64) < p).double()])
    starts = torch.cat([(torch.rand(num_climb, H, generator=generator, device=dev, dtype=torch.float64) < 0.5).double(),
                        torch.zeros(1, H, device=dev, dtype=torch.float64)]
                       + [(m.hidden_input(x[:num_climb]) > 0).double() for x in xs.values()])
    x_mode, h_mode = climb(m, starts)
    if m.hidden_marginal_tractable:
        hs["hill-climbed states"] = h_mode
    if m.visible_layer.discrete:
        V = m.n_pixels
        corners = torch.cat([torch.zeros(1, V, device=dev, dtype=torch.float64), torch.ones(1, V, device=dev, dtype=torch.float64)])
        if m.n_labels:
            corners = torch.cat([corners, torch.nn.functional.one_hot(torch.zeros(2, dtype=torch.long, device=dev),
                                                                       m.n_labels).double()], -1)
        xs["all-off and all-on visible states"] = corners
        xs["hill-climbed states"] = x_mode
    else:  # log p*(x) of real-valued pixels is a density, not a lower bound on Z
        xs = {}
    best, source, sides, count = -math.inf, "", [], 0
    for side, states, score in (("hidden", hs, m.log_unnormalised_hidden), ("visible", xs, lambda x: -m.free_energy(x))):
        if not states:
            continue
        names = list(states)
        allx = torch.cat([states[k] for k in names])
        owner = torch.cat([torch.full((len(states[k]),), i, device=dev) for i, k in enumerate(names)])
        uniq, inverse = torch.unique(allx, dim=0, return_inverse=True)
        first = torch.full((len(uniq),), len(allx), device=dev, dtype=torch.long).scatter_reduce(
            0, inverse, torch.arange(len(allx), device=dev), "amin")
        scores = torch.cat([score(uniq[s0:s1]) for s0, s1 in chunks(len(uniq), 4096)])
        count += len(uniq)
        sides.append(torch.logsumexp(scores, 0).item())
        top = scores.argmax()
        if scores[top].item() > best:
            best, source = scores[top].item(), f"{names[int(owner[first[top]])]} ({side} side)"
    return HardBound(max(sides), best, source, count)
