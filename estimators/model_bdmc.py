"""Bidirectional Monte Carlo on a user's model (Grosse, Ghahramani & Adams 2015): for (z, x) drawn from the model,
forward AIS from the base (a stochastic lower bound on log p(x)) and reverse AIS from the exact posterior sample z (a
stochastic upper bound), along ``nvil.estimators.model_paths.ModelPath``; a mean gap above ``max_gap`` says the schedule
is too short for forward AIS on real data. It also checks that ``log_likelihood`` and ``sample_likelihood`` agree on
whether x depends on z (``likelihood_consistency``).
"""

from __future__ import annotations

import math

import torch

from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.core.ops import mean_and_stderr
from nvil.estimators.annealing import ais
from nvil.estimators.base import check_seed
from nvil.estimators.model_bounds import check_start, eval_mode, protocol, stream
from nvil.estimators.model_paths import BINARY_MOVES, ModelPath, pilot_steps
from nvil.estimators.reverse_ais import BDMC, BDMCResult
from nvil.models.protocol import ProtocolModel

CONSISTENCY_PAIRS = 200  # simulated pairs of the likelihood_consistency check (at least)


def likelihood_consistency(pm: ProtocolModel, n: int, generator) -> dict:
    """Do ``log_likelihood`` and ``sample_likelihood`` agree on whether x depends on z?

    For z, z' from the prior and x ~ p(x | z), E[log p(x | z) - log p(x | z')] = E[KL(p(. | z) || p(. | z'))], which
    is positive wherever the sampler's draws depend on z. Two draws x, x2 from the same z lie closer together than
    draws from different z exactly when they do: dependence = ||x - x'||^2 - ||x - x2||^2, x' ~ p(x | z'). The
    check fails when the draws depend on z (dependence above 5 standard errors) while the log-likelihood ratio does
    not exceed 2 of its own (a ``log_likelihood`` that ignores z, or scores another model than the sampler draws)."""
    z = pm.sample_prior(n, generator)
    x = pm.sample_likelihood(z, generator)
    x2 = pm.sample_likelihood(z, generator)
    z_other, x_other = z.roll(1, 0), x.roll(1, 0)
    ratio = (pm.log_likelihood(x, z) - pm.log_likelihood(x, z_other)).double()
    flat = lambda t: t.reshape(t.shape[0], -1).double()  # noqa: E731
    dependence = (flat(x) - flat(x_other)).square().sum(1) - (flat(x) - flat(x2)).square().sum(1)

    def score(t):
        mean, se = mean_and_stderr(t)
        return mean / se if se > 0 else (math.inf if mean > 0 else 0.0)

    return {"log_likelihood_ratio_z": score(ratio), "sampler_dependence_z": score(dependence)}


class ModelBDMC(BDMC):
    """``estimator=bdmc`` on a user's model: ``num_simulated`` (z, x) pairs from ``sample_prior`` and
    ``sample_likelihood``, ``num_chains`` forward and reverse AIS runs each along ``ModelPath``, both directions with
    the HMC step sizes a pilot run fixed in advance for each simulated example (so that every move, forward or
    reverse, is a kernel chosen independently of its chain). The settings are ``ModelAIS``'s, whose schedule it
    certifies."""

    name = "bdmc"
    runs_name = "num_chains"

    def __init__(self, *, num_simulated: int = 50, num_betas: int = 1000, schedule: str = "sigmoid",
                 num_chains: int = 16, start: str | None = None, batch_size: int = 50, max_gap: float = 1.0,
                 num_leapfrog: int = 10, step_size: float = 0.05, target_accept: float = 0.65,
                 max_step_size: float | None = 10.0, adapt: bool = True, pilot_chains: int = 2, moves: str = "gibbs",
                 num_moves: int | None = None, num_flips: int = 1) -> None:
        if schedule == "adaptive":
            raise ConfigError("estimator.schedule must be a fixed ladder (sigmoid, linear or paper) for a user's model")
        super().__init__(num_simulated=num_simulated, num_betas=num_betas, schedule=schedule, num_runs=num_chains,
                         batch_size=batch_size, max_gap=max_gap, num_leapfrog=num_leapfrog, step_size=step_size,
                         target_accept=target_accept, adapt=adapt)
        check_start(start)
        self.start = start
        self.pilot_chains = positive_int(pilot_chains, "estimator.pilot_chains")
        self.path_settings = path_settings(num_leapfrog, target_accept, adapt, max_step_size, moves, num_moves,
                                           num_flips)

    def latent_model(self, model, inference=None) -> ProtocolModel:
        pm = protocol(model)
        pm.require_simulation("estimator=bdmc")
        return pm

    def check(self, model, inference=None) -> None:
        self.latent_model(model)

    @staticmethod
    def continuous(lm) -> bool:
        return not lm.binary

    def target(self, lm) -> str:
        return "ais"

    @torch.no_grad()
    def simulate(self, lm: ProtocolModel, n: int, generator):
        z = lm.sample_prior(n, generator)
        return lm.sample_likelihood(z, generator), z

    def run_batch(self, lm: ProtocolModel, v, h, generator):
        progress = self.batch_progress
        step = lambda k, increment: progress.advance()  # noqa: E731
        progress.plan(2 * (len(self.betas) - 1))
        start = self.start or lm.default_base()
        steps = fixed_steps(lm, v, start, self.betas, self.num_runs, self.pilot_chains, self.step_size, generator,
                            self.path_settings)
        path = ModelPath(lm, v, lm.base(start, v), steps=steps, **self.path_settings)
        state = path.state(path.base.sample(1, generator)[0])
        log_w, final = ais(path, state, self.betas, generator, on_step=step)
        log_w_rev, final_rev = ais(path, path.state(h), self.betas.flip(0), generator, on_step=step)
        moves = max(1, len(self.betas) - 2)
        return log_w, log_w_rev, {"accept_forward": (final.accept_sum / moves).cpu(),
                                  "accept_reverse": (final_rev.accept_sum / moves).cpu()}

    @torch.no_grad()
    def estimate(self, model, data=None, *, seed: int = 0, generator=None, progress=None, **_) -> BDMCResult:
        """Simulate ``num_simulated`` pairs and sandwich each one's log p(x); ``data`` is not used."""
        pm = self.latent_model(model)
        check_seed(seed)
        device = model_device(pm)
        if generator is None:
            generator = torch.Generator(device=device).manual_seed(seed)
        with eval_mode(pm):
            result = super().estimate(pm, None, seed=seed, generator=generator, progress=progress)
            g = torch.Generator(device=device).manual_seed(stream(seed, "consistency"))
            scores = likelihood_consistency(pm, max(self.num_simulated, CONSISTENCY_PAIRS), g)
        dependent, ratio = scores["sampler_dependence_z"], scores["log_likelihood_ratio_z"]
        result.check("likelihood_consistency", not (dependent > 5 and ratio < 2),
                     f"likelihood_consistency: draws of sample_likelihood(z) depend on z ({dependent:.1f} standard "
                     f"errors) but log_likelihood(x, z) hardly does (its ratio at the drawing z over another z is "
                     f"{ratio:.1f} standard errors above 0): log_likelihood ignores z or scores a different model than "
                     "sample_likelihood draws from")
        result.extras.update({k: round(v, 2) if math.isfinite(v) else v for k, v in scores.items()})
        result.extras["start"] = self.start or pm.default_base()
        if not pm.binary:
            result.extras.pop("form", None)
        return result


def model_device(pm: ProtocolModel) -> torch.device:
    """Where the user's model computes: its first parameter's device (a module), else the CPU."""
    params = getattr(pm.obj, "parameters", None)
    first = next(iter(params()), None) if callable(params) else None
    return first.device if first is not None else torch.device("cpu")


def fixed_steps(pm: ProtocolModel, x, start: str, betas, chains: int, pilot_chains: int, step_size: float, generator,
                settings: dict) -> dict | None:
    """HMC step sizes for the chains of ``x`` (``chains`` rows per example, example-major) fixed in advance by a
    pilot run (``nvil.estimators.model_paths.pilot_steps``); None for binary z or without adaptation (every chain
    then moves with ``step_size``)."""
    if pm.binary:
        return None
    examples = x[::chains]
    if not settings["adapt"]:
        constant = torch.full((x.shape[0],), float(step_size), device=x.device)
        return {beta: constant for beta in betas.tolist()}
    pilot = {k: v for k, v in settings.items() if k != "adapt"}
    return pilot_steps(pm, examples, start, betas, pilot_chains, step_size, chains, generator, **pilot)


def path_settings(num_leapfrog, target_accept, adapt, max_step_size, moves, num_moves, num_flips) -> dict:
    """``ModelPath``'s keywords, checked."""
    if moves not in BINARY_MOVES:
        raise ConfigError(f"estimator.moves must be one of {list(BINARY_MOVES)}, got {moves!r}")
    return {"num_leapfrog": positive_int(num_leapfrog, "estimator.num_leapfrog"),
            "target_accept": positive_float(target_accept, "estimator.target_accept"), "adapt": bool(adapt),
            "max_step_size": None if max_step_size is None else positive_float(max_step_size, "estimator.max_step_size"),
            "moves": moves, "num_moves": positive_int(num_moves, "estimator.num_moves", allow_none=True),
            "num_flips": positive_int(num_flips, "estimator.num_flips")}
