"""A budget instead of a guess: an annealing estimator run small first, then with twice the chains and twice the
temperatures, until its certificate holds or the next doubling would overrun the budget.

``within_budget(cls, settings, seconds, estimate, seed)`` starts from a sixteenth of the estimator's temperatures and a
quarter of its chains (its defaults, or what ``settings`` gives), at least ``MIN_BETAS`` and ``MIN_CHAINS``. After
each round it stops when the result is certified; otherwise it predicts the next round's cost as four times this
round's (chains x temperatures, each doubled; from the second round on, the growth the rounds showed, between
two and four times) and stops when the time spent plus that would exceed ``seconds``. The
result of the last round carries ``budget``: the seconds allowed and spent, every round's settings, time and outcome
(the checks that failed), and where it stopped short, what the next doubling would have cost.

Every round is a fresh estimate with its own seed (``round_seed``: the caller's for the first, a stream of it for
each later one), so the rounds that came before do not bias the one kept
beyond the choice to stop (a certified estimate is kept as soon as one appears; the certificate's checks are what
says it can be trusted).
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable

from nvil.core.errors import ConfigError
from nvil.estimators.base import Result
from nvil.estimators.protocol_view import stream

MIN_BETAS = 10
MIN_CHAINS = 2
CHAIN_KEYS = ("num_chains", "num_runs")  # what the annealing estimators call their chains per example


def size_keys(cls) -> tuple[str, str]:
    """(temperatures, chains): the keywords of ``cls`` that set the two sizes a budget doubles."""
    params = inspect.signature(cls).parameters
    chains = next((k for k in CHAIN_KEYS if k in params), None)
    if "num_betas" not in params or chains is None:
        raise ConfigError(f"budget= grows an annealing estimator's temperatures and chains; {cls.__name__} has no "
                          "num_betas and num_chains to grow (use budget with estimator=ais, ais_hmc, bdmc, "
                          "ais_posterior or raise)")
    return "num_betas", chains


def check_budget(seconds) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"budget must be a positive number of seconds, got {seconds!r}")
    return float(seconds)


def full_sizes(cls, settings: dict) -> tuple[str, int, str, int]:
    """(temperatures key, its full value, chains key, its full value) for ``cls`` built with ``settings``."""
    betas_key, chains_key = size_keys(cls)
    defaults = inspect.signature(cls).parameters
    return (betas_key, int(settings.get(betas_key, defaults[betas_key].default)),
            chains_key, int(settings.get(chains_key, defaults[chains_key].default)))


def round_seed(seed: int, r: int) -> int:
    """The seed of round ``r``: ``seed`` itself for the first, so a budget that certifies at once gives the fixed
    schedule's number."""
    return seed if r == 0 else stream(seed, f"budget round {r}")


def within_budget(cls, settings: dict, seconds: float, estimate: Callable, seed: int = 0) -> Result:
    """``cls(**settings)`` grown by doubling (the module docstring) within ``seconds``; ``estimate(est, seed)`` runs
    one round with that round's seed and returns its ``Result``."""
    betas_key, full_betas, chains_key, full_chains = full_sizes(cls, settings)
    return grow(lambda betas, chains: cls(**{**settings, betas_key: betas, chains_key: chains}), full_betas,
                full_chains, seconds, estimate, seed, (betas_key, chains_key))


def grow(make: Callable, full_betas: int, full_chains: int, seconds: float, estimate: Callable, seed: int = 0,
         names: tuple[str, str] = ("num_betas", "num_chains")) -> Result:
    """The doubling itself: ``make(betas, chains)`` builds each round's estimator, ``names`` are what the user
    calls the two sizes (the JSON rounds and the warning use them)."""
    seconds = check_budget(seconds)
    betas_key, chains_key = names
    betas, chains = max(MIN_BETAS, full_betas // 16), max(MIN_CHAINS, full_chains // 4)
    rounds, t0 = [], time.perf_counter()
    while True:
        t = time.perf_counter()
        result = estimate(make(betas, chains), round_seed(seed, len(rounds)))
        took = time.perf_counter() - t
        rounds.append({betas_key: betas, chains_key: chains, "seconds": round(took, 3),
                       "certified": result.certified, "failed": list(getattr(result, "failed", []))})
        spent = time.perf_counter() - t0
        # chains x temperatures quadruple; a round's fixed costs grow less, so the rounds seen so far say by how much
        growth = 4.0 if len(rounds) < 2 else min(4.0, max(2.0, took / max(rounds[-2]["seconds"], 1e-3)))
        next_cost = growth * took
        if result.certified or spent + next_cost > seconds:
            break
        betas, chains = 2 * betas, 2 * chains
    summary = {"seconds": seconds, "spent": round(spent, 3), "rounds": rounds}
    if not result.certified:
        summary["stopped"] = (f"not certified within the budget of {seconds:g} s (spent {spent:.1f} s); the next "
                              f"doubling ({betas_key}={2 * betas}, {chains_key}={2 * chains}) would take about "
                              f"{next_cost:.0f} s more")
        result.warnings.append(f"budget: {summary['stopped']}")
    result.extras["budget"] = summary
    return result
