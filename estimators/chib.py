"""The Chib-style estimator of Murray & Salakhutdinov 2009 (Sec. 3, Fig. 1), unbiased for P(v) at any S.

For a test case v, a special state h* (a sample of Q(h | v), then deterministic hill-climbing in
log P(v, h) to a local mode), S Markov-chain steps and T sequential Gibbs leaving P(h | v) invariant:

    1. s ~ Uniform{1..S}
    2. h^(s) ~ T~(. <- h*)                              (T~: the same single-site updates in reverse order)
    3-4. h^(s') ~ T(. <- h^(s'-1))    for s' = s+1..S
    5-6. h^(s') ~ T~(. <- h^(s'+1))   for s' = s-1 down to 1
    7. P(v) ~= P(v, h*) / [(1/S) sum_{s'} T(h* <- h^(s'))]

with T(h* <- h) = prod_j P(h*_j | h*_{1..j-1}, h_{j+1..M}, v) (Eq. 11), evaluated by one forced sweep from h
(``SequentialGibbs.sweep(force=h_star)``). Chains are test cases x runs, each with its own s: all chains
step together, chain c going forward for its first S - s steps and then, restarted at its h^(s), backward,
so no chain waits for another and nothing loops over chains. exp(estimate) is unbiased for P(v) (their
Eq. 15), so log P(v) is under-estimated in expectation.
"""

from __future__ import annotations

import torch

from estimators.posterior import LatentModel, PerExample
from nvil.config import positive_int
from nvil.mcmc.sequential_gibbs import SequentialGibbs
from nvil.ops import log_mean_exp


@torch.no_grad()
def chib_log_p(gibbs: SequentialGibbs, h_star: torch.Tensor, num_steps: int, generator=None) -> torch.Tensor:
    """log of the Fig. 1 estimate of sum_h f(h), f the Gibbs target, for each chain: log f(h*) - log p_hat."""
    chains = h_star.shape[0]
    S = num_steps
    s = torch.randint(0, S, (chains,), generator=generator, device=h_star.device)  # 0-based position of h^(s)
    forward_steps = S - 1 - s  # states after h^(s); the other s states come before it
    h_s, _ = gibbs.sweep(h_star, reverse=True, generator=generator)  # step 2
    log_t = [gibbs.sweep(h_s, force=h_star)[1]]
    h = h_s
    for t in range(1, S):
        backward = t > forward_steps
        restart = (t == forward_steps + 1)[:, None]
        h = torch.where(restart, h_s, h)  # the backward run starts again from h^(s)
        h, _ = gibbs.sweep(h, reverse=backward, generator=generator)
        log_t.append(gibbs.sweep(h, force=h_star)[1])
    log_p_hat = log_mean_exp(torch.stack(log_t).double(), 0)  # log (1/S) sum T(h* <- h^(s'))
    return gibbs.log_prob(h_star).double() - log_p_hat


class Chib(PerExample):
    """``estimator=chib``: ``num_steps`` = S, ``num_runs`` independent runs per test case (their P(v) estimates
    averaged), ``hill_climb`` for h*."""

    name = "chib"

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.num_steps = positive_int(cfg.get("num_steps"), "estimator.num_steps")
        self.max_climb = positive_int(cfg.get("max_hill_climb_sweeps", 100), "estimator.max_hill_climb_sweeps")
        self.hill_climb = bool(cfg.get("hill_climb", True))

    def settings(self) -> dict:
        return {"num_steps": self.num_steps, "hill_climb": self.hill_climb}

    def run_batch(self, lm: LatentModel, x: torch.Tensor, generator) -> torch.Tensor:
        gibbs = SequentialGibbs([(1.0, lm.joint(x))])
        h_star = lm.sample_q(x, generator)
        if self.hill_climb:
            h_star, _ = gibbs.hill_climb(h_star, self.max_climb)
        return chib_log_p(gibbs, h_star, self.num_steps, generator)
