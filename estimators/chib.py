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

from estimators.ais_hmc import ContinuousLatent
from estimators.posterior import LatentModel, PerExample
from nvil.config import positive_float, positive_int
from nvil.errors import ConfigError
from nvil.mcmc.mh import PROPOSALS, MetropolisHastings
from nvil.mcmc.sequential_gibbs import SequentialGibbs
from nvil.ops import log_mean_exp


@torch.no_grad()
def chib_log_p(op, h_star: torch.Tensor, num_steps: int, generator=None) -> torch.Tensor:
    """log of the Fig. 1 estimate of sum_h f(h) (or its integral), f the target of the transition operator
    ``op``, for each chain: log f(h*) - log p_hat. ``op`` gives ``step(h, reverse, generator)`` (reverse: the
    reverse operator T~, a bool or a per-chain bool tensor), ``log_transition(to, frm)`` = log T(to <- frm) and
    ``log_prob(h)`` = log f(h): sequential Gibbs for binary latents, Metropolis-Hastings for continuous ones."""
    chains = h_star.shape[0]
    S = num_steps
    s = torch.randint(0, S, (chains,), generator=generator, device=h_star.device)  # 0-based position of h^(s)
    forward_steps = S - 1 - s  # states after h^(s); the other s states come before it
    h_s = op.step(h_star, reverse=True, generator=generator)  # step 2
    log_t = [op.log_transition(h_star, h_s)]
    h = h_s
    for t in range(1, S):
        backward = t > forward_steps
        restart = (t == forward_steps + 1)[:, None]
        h = torch.where(restart, h_s, h)  # the backward run starts again from h^(s)
        h = op.step(h, reverse=backward, generator=generator)
        log_t.append(op.log_transition(h_star, h))
    log_p_hat = log_mean_exp(torch.stack(log_t).double(), 0)  # log (1/S) sum T(h* <- h^(s'))
    return op.log_prob(h_star).double() - log_p_hat


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


def climb_to_mode(log_f, h: torch.Tensor, steps: int, lr: float) -> torch.Tensor:
    """Deterministic hill-climbing in log f from h for every chain at once: ``steps`` Adam steps on
    -sum_chains log f (each chain's gradient is its own), the continuous counterpart of the argmax sweeps."""
    h = h.detach().clone().requires_grad_(True)
    opt = torch.optim.Adam([h], lr=lr)
    with torch.enable_grad():
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            (-log_f(h).sum()).backward()
            opt.step()
    return h.detach()


class ChibMH(PerExample):
    """``estimator=chib_mh``: the Fig. 1 construction for continuous latents (Murray & Salakhutdinov 2009,
    appendix) with Metropolis-Hastings transitions: ``proposal=langevin`` (HMC with one leapfrog step) or
    ``random_walk``, fixed per-chain step size ``step_size``. h* is a prior sample hill-climbed to a local mode
    of log p(x, s) (``hill_climb_steps`` Adam steps at ``hill_climb_lr``). A run whose chain rejects its way back
    to h* estimates p(x) = 0; ``zero_runs`` in the JSON counts them."""

    name = "chib_mh"

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.num_steps = positive_int(cfg.get("num_steps"), "estimator.num_steps")
        self.step_size = positive_float(cfg.get("step_size", 0.1), "estimator.step_size")
        self.proposal = cfg.get("proposal", "langevin")
        if self.proposal not in PROPOSALS:
            raise ConfigError(f"estimator.proposal must be one of {list(PROPOSALS)}, got {self.proposal!r}")
        self.climb_steps = positive_int(cfg.get("hill_climb_steps", 200), "estimator.hill_climb_steps")
        self.climb_lr = positive_float(cfg.get("hill_climb_lr", 0.05), "estimator.hill_climb_lr")
        self.form = cfg.get("form", "auxiliary")
        self.zero_runs = 0

    def latent_model(self, model, inference):
        return ContinuousLatent(model, self.name, self.form)

    def settings(self) -> dict:
        return {"num_steps": self.num_steps, "proposal": self.proposal, "step_size": self.step_size, "form": self.form,
                "zero_runs": self.zero_runs}

    def run_batch(self, lm, x: torch.Tensor, generator) -> torch.Tensor:
        log_f = lambda s: lm.log_joint(x, s)  # noqa: E731
        h_star = climb_to_mode(log_f, lm.sample_prior(x.shape[0], generator, x.device), self.climb_steps, self.climb_lr)
        log_p = chib_log_p(MetropolisHastings(log_f, self.step_size, self.proposal), h_star, self.num_steps, generator)
        self.zero_runs += int(torch.isneginf(log_p).sum())
        return log_p
