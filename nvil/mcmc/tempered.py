"""Tempered transitions (Neal 1996), as Salakhutdinov 2009 uses them in Trans-SAP (Algorithm 2).

Inverse temperatures beta_0 < ... < beta_S = 1 and p_s proportional to p*^beta_s, T_s block Gibbs at
beta_s, T~_s its reverse. From the current state x^S:

    heat:  x^s  ~ T_s(. <- x^{s+1})          for s = S-1, ..., 0
    cool:  x~^0 = x^0;  x~^{s+1} ~ T~_s(. <- x~^s)   for s = 0, ..., S-1
    accept x~^S with probability min(1, A),
    log A = sum_{s=1}^{S} (beta_s - beta_{s-1}) [log p*(x~^s) - log p*(x^s)].

(Neal's product prod_i p_{i+1}(x^_i) / p_i(x^_i) * p_i(x'_i) / p_{i+1}(x'_i) in this indexing: the
heating terms at the inputs of T_s, the cooling terms at the outputs of T~_s; the hottest state x^0
enters neither, and the normalising constants cancel.) log A accumulates on the fly, so memory is one state per chain; each chain accepts or
rejects on its own. The exact invariance test in tests/ checks this indexing on a tiny RBM.
"""

from __future__ import annotations

import torch

from nvil.core.errors import ConfigError
from nvil.mcmc.gibbs import BlockGibbs
from nvil.models.rbm import State


def uniform_betas(num_betas: int, beta_min: float) -> torch.Tensor:
    """num_betas inverse temperatures spaced uniformly from beta_min to 1 (the paper: 50 from 0.9 to 1)."""
    if not isinstance(num_betas, int) or num_betas < 2:
        raise ConfigError(f"learner.tt.num_betas must be an integer >= 2, got {num_betas!r}")
    if isinstance(beta_min, bool) or not isinstance(beta_min, (int, float)) or not 0 < beta_min <= 1:
        raise ConfigError(f"learner.tt.beta_min must be a number in (0, 1], got {beta_min!r}")
    return torch.linspace(float(beta_min), 1.0, num_betas, dtype=torch.float64)


def check_ladder(betas, what: str, dtype=torch.float64) -> torch.Tensor:
    """betas as a tensor, refused unless strictly increasing and ending at the target, beta = 1."""
    betas = torch.as_tensor(betas, dtype=dtype)
    if betas.numel() < 2 or betas[-1] != 1 or not torch.all(betas[1:] > betas[:-1]):
        raise ConfigError(f"{what} increasing inverse temperatures ending at 1")
    return betas


class TemperedTransitions:
    """``accel`` (``nvil.backend.accel``) compiles the block-Gibbs sweeps (``BlockGibbs``); the run itself is unchanged.

    Each sweep's state is weighed with the hidden input a(x) = c + x'W that the sweep uses anyway (the heating
    sweep starts from it, the cooling sweep ends with it), so a run costs two matmuls per temperature and
    direction, not three."""

    def __init__(self, model, betas: torch.Tensor, accel: str = "none") -> None:
        betas = check_ladder(betas, "tempered transitions need")
        self.model = model
        self.betas = betas.tolist()
        self.forward = BlockGibbs(model, accel=accel)
        self.backward = self.forward.reverse()

    def init(self, x: torch.Tensor, generator=None) -> State:
        """Chains at x with h ~ p(h | x)."""
        return self.model.init_chains(x, generator)

    def reverse(self) -> "TemperedTransitions":
        """A tempered-transitions run satisfies detailed balance with respect to its target (Neal 1996, Sec. 3):
        T~ = T."""
        return self

    @torch.no_grad()
    def step(self, state: State, beta=1.0, generator=None) -> tuple[State, dict]:
        """One tempered-transitions run from ``state``. The target is p^beta (``beta`` a float, 1 by default; the
        ladder is scaled by it: beta_s -> beta * beta_s)."""
        b, S = self.betas, len(self.betas) - 1
        if beta != 1:
            b = [beta * b_s for b_s in b]
        m = self.model
        log_a = torch.zeros(state.x.shape[0], dtype=torch.float64, device=state.x.device)
        x = state
        for s in range(S - 1, -1, -1):  # heat: x^s ~ T_s(. <- x^{s+1})
            a = m.hidden_input(x.x)
            log_a -= (b[s + 1] - b[s]) * m.log_unnormalised(x, a).double()
            x, _ = self.forward.step(x, b[s], generator, hidden_input=a)
        for s in range(S):  # cool: x~^{s+1} ~ T~_s(. <- x~^s)
            x, info = self.backward.step(x, b[s], generator)
            log_a += (b[s + 1] - b[s]) * m.log_unnormalised(x, info.get("hidden_input")).double()
        u = torch.rand(log_a.shape, generator=generator, device=log_a.device, dtype=log_a.dtype)
        accept = torch.log(u) < log_a
        keep = accept.unsqueeze(-1)
        new = State(torch.where(keep, x.x, state.x), torch.where(keep, x.h, state.h))
        return new, {"accept_rate": accept.float().mean(), "accepted": accept}
