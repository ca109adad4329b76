"""A budget instead of a guess: an annealing estimator run small first, then with twice the chains and twice the
temperatures, until its certificate holds or the next doubling would overrun the budget.

``within_budget(cls, settings, seconds, estimate, seed)`` starts from a sixteenth of the estimator's temperatures and a
quarter of its chains (its defaults, or what ``settings`` gives), at least ``MIN_BETAS`` and ``MIN_CHAINS``; SMC from
a quarter of its particles at a conditional ESS share of 0.5 (``first_and_next``). After each round it stops when
the result is certified; otherwise it predicts the next round's cost as four times this round's (chains x
temperatures, each doubled; from the second round on, the growth the rounds showed, between two and four times) and
stops when the time spent plus that would exceed ``seconds``. The
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
MIN_PARTICLES = 2
START_CESS = 0.5
CHAIN_KEYS = ("num_chains", "num_runs")  # what the annealing estimators call their chains per example
AUTO_SECONDS = 300.0  # budget="auto": the seconds an estimate given no schedule may grow within
SCHEDULE_KEYS = ("num_betas", "schedule", "num_chains", "num_runs", "num_particles", "cess")


def size_keys(cls) -> tuple[str, str]:
    """The two keywords of ``cls`` a budget grows: (temperatures, chains) for AIS, (``cess``, particles) for SMC,
    whose temperatures follow its conditional ESS target."""
    params = inspect.signature(cls).parameters
    if "cess" in params and "num_particles" in params:
        return "cess", "num_particles"
    chains = next((k for k in CHAIN_KEYS if k in params), None)
    if "num_betas" not in params or chains is None:
        raise ConfigError(f"budget= grows an annealing estimator's temperatures and chains; {cls.__name__} has no "
                          "num_betas and num_chains to grow (use budget with estimator=ais, smc, ais_hmc, bdmc, "
                          "ais_posterior or raise)")
    return "num_betas", chains


def check_budget(seconds) -> float:
    if isinstance(seconds, str) and seconds == "auto":
        return AUTO_SECONDS
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"budget must be a positive number of seconds or auto, got {seconds!r}")
    return float(seconds)


def resolve_budget(cls, settings: dict, budget) -> float | None:
    """The seconds ``budget=`` asks for: a number as given; None, none (the schedule of ``settings`` and the
    defaults); ``"auto"``, ``AUTO_SECONDS`` where ``cls`` grows (``size_keys``) and ``settings`` name no part of its
    schedule (``SCHEDULE_KEYS``), else none: a schedule the user gave is run as given."""
    if budget is None:
        return None
    if isinstance(budget, str) and budget == "auto":
        try:
            size_keys(cls)
        except ConfigError:
            return None
        return None if any(k in settings for k in SCHEDULE_KEYS) else AUTO_SECONDS
    return check_budget(budget)


def first_and_next(cls, settings: dict) -> tuple[dict, Callable[[dict], dict]]:
    """(the first round's two sizes, the doubling from one round's to the next's) for ``cls`` with ``settings``
    (its defaults where they are silent). AIS: a sixteenth of the temperatures and a quarter of the chains, both
    doubled each round. SMC: a quarter of the particles at a conditional ESS share of 0.5; each round doubles the
    particles and quarters 1 - cess, which doubles the temperatures (for small steps 1 - CESS share = (d beta)^2
    Var(log f_1 - log f_0), so the steps go as sqrt(1 - cess))."""
    size, count = size_keys(cls)
    defaults = inspect.signature(cls).parameters
    full = {k: settings.get(k, defaults[k].default) for k in (size, count)}
    if size == "cess":
        first = {"cess": min(START_CESS, float(full["cess"])), count: max(MIN_PARTICLES, int(full[count]) // 4)}
        return first, lambda r: {"cess": 1 - (1 - r["cess"]) / 4, count: 2 * r[count]}
    first = {size: max(MIN_BETAS, int(full[size]) // 16), count: max(MIN_CHAINS, int(full[count]) // 4)}
    return first, lambda r: {size: 2 * r[size], count: 2 * r[count]}


def within_budget(cls, settings: dict, seconds: float, estimate: Callable, seed: int = 0) -> Result:
    """``cls(**settings)`` grown by doubling (the module docstring) within ``seconds``; ``estimate(est, seed)`` runs
    one round with that round's seed and returns its ``Result``."""
    first, double = first_and_next(cls, settings)
    return grow(lambda sizes: cls(**{**settings, **sizes}), first, double, seconds, estimate, seed)


def round_seed(seed: int, r: int) -> int:
    """The seed of round ``r``: ``seed`` itself for the first, so a budget that certifies at once gives the fixed
    schedule's number."""
    return seed if r == 0 else stream(seed, f"budget round {r}")


def grow(make: Callable, first: dict, double: Callable[[dict], dict], seconds: float, estimate: Callable,
         seed: int = 0) -> Result:
    """The doubling itself: ``make(sizes)`` builds each round's estimator from its two sizes (a dict of keywords),
    starting from ``first``, ``double(sizes)`` giving the next round's."""
    seconds = check_budget(seconds)
    sizes = dict(first)
    rounds, t0 = [], time.perf_counter()
    while True:
        t = time.perf_counter()
        result = estimate(make(sizes), round_seed(seed, len(rounds)))
        took = time.perf_counter() - t
        rounds.append({**sizes, "seconds": round(took, 3), "certified": result.certified,
                       "failed": list(getattr(result, "failed", []))})
        spent = time.perf_counter() - t0
        # temperatures x chains quadruple; a round's fixed costs grow less, so the rounds seen so far say by how much
        growth = 4.0 if len(rounds) < 2 else min(4.0, max(2.0, took / max(rounds[-2]["seconds"], 1e-3)))
        next_cost = growth * took
        if result.certified or spent + next_cost > seconds:
            break
        sizes = double(sizes)
    summary = {"seconds": seconds, "spent": round(spent, 3), "rounds": rounds}
    if not result.certified:
        following = ", ".join(f"{k}={round(v, 6)}" for k, v in double(sizes).items())
        summary["stopped"] = (f"not certified within the budget of {seconds:g} s (spent {spent:.1f} s); the next "
                              f"doubling ({following}) would take about {next_cost:.0f} s more")
        result.warnings.append(f"budget: {summary['stopped']}")
    result.extras["budget"] = summary
    return result
