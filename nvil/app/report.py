"""The human line: one sentence on stderr after each estimate's JSON line on stdout, read from that line alone,
so that an evaluation, a final evaluation and ``python -m nvil.app.merge`` say it alike::

    ais: log p(v) = -84.57 ± 0.21 nats over 10,000 test examples [certified: hard bound, log Z interval 0.03 nats]
    iwae: log p(v) >= -120.07 ± 0.26 nats over 10,000 test examples [stochastic lower bound; no certificate]
    chib: log p(v) = -85.90 ± 3.01 nats over 50 test examples [not certified: the spread of the test-set mean ...]

What it states is what the JSON line holds: the mean and its standard error, the examples, and the certificate
(``certified``, ``checks``, ``warnings``: ``nvil.estimators.base.Certificate``), with the numbers behind the
checks that passed or the first reason one failed."""

from __future__ import annotations

import math

# What an estimator's number is, where "an estimate of log p(v)" does not say it all.
LOWER_BOUNDS = {"iwae": "stochastic lower bound", "elbo": "stochastic lower bound",
                "dbn_bound": "lower bound (Murray & Salakhutdinov 2009, Eq. 17)",
                "dbm_bound": "mean-field lower bound (Salakhutdinov & Hinton 2009)"}
NATURE = {**LOWER_BOUNDS, "harmonic": "the harmonic mean over-estimates"}
REASON_CHARS = 120  # the first failure's reason is cut here; the warning lines above hold it whole


def headline(line: dict) -> str:
    """The human line of one JSON line (``Result.summary()``, or a merged line)."""
    name = line.get("estimator", "estimate")
    n = line.get("num_examples")
    kind = "simulated" if name == "bdmc" else line.get("split", "test")
    where = f"over {n:,} {kind} example{'s' if n != 1 else ''}" if isinstance(n, int) else ""
    if "error_rate" in line:  # estimator=classify
        rate, se = line.get("error_rate"), line.get("stderr")
        value = f"{100 * rate:.2f}% ± {100 * se:.2f}%" if _finite(rate) and _finite(se) else "not a number"
        return f"{name}: error rate = {value} {where} [{line.get('method') or 'classifier'}; no certificate]"
    mean, se = _nats(line.get("mean_log_p")), _nats(line.get("stderr"))
    is_bound = name in LOWER_BOUNDS or "lower_bound" in line  # an estimator that reports a bound names it there
    if name == "bdmc" and "mean_log_p_upper" in line:
        statement = f"log p(v) between {mean} and {_nats(line['mean_log_p_upper'])} ± {se} nats"
    else:
        statement = f"log p(v) {'>=' if is_bound else '='} {mean} ± {se} nats"
    if "perplexity" in line:
        bound = "" if line.get("perplexity_is") == "exact" else " at most"
        where += f", perplexity{bound} {line['perplexity']:,} per word"
    tags = [NATURE[name]] if name in NATURE else [line["lower_bound"]] if is_bound else []
    tags.append(certificate(line))
    spent = budget_spent(line)
    if spent:
        tags.append(spent)
    return f"{name}: {statement} {where} [{'; '.join(tags)}]"


def budget_spent(line: dict) -> str:
    """What a budget spent (``nvil.estimators.budget``): ``budget: 6 s of 300 s, round 1 (num_betas=62,
    num_chains=4)``; "" for an estimate run once."""
    budget = line.get("budget")
    if not isinstance(budget, dict) or not _finite(budget.get("spent")) or not budget.get("rounds"):
        return ""
    last = {k: v for k, v in budget["rounds"][-1].items() if k not in ("seconds", "certified", "failed")}
    sizes = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in last.items())
    return (f"budget: {budget['spent']:.0f} s of {budget.get('seconds', 0):g} s, round {len(budget['rounds'])}"
            f" ({sizes})")


def certificate(line: dict) -> str:
    """``certified: <the evidence>``, ``not certified: <the first reason>`` or ``no certificate``."""
    certified = line.get("certified")
    if certified is None:
        return "no certificate"
    if certified is False:
        failed, warnings = line.get("failed_checks") or [], line.get("warnings") or []
        reason = _short(warnings[0]) if warnings else ", ".join(failed) + " failed"
        more = len(failed) - 1
        return f"not certified: {reason}" + (f" (and {more} more failed check{'s' * (more > 1)})" if more > 0 else "")
    return "certified: " + ", ".join(evidence(line))


def evidence(line: dict) -> list[str]:
    """The passed checks in words, with their numbers from the line."""
    checks = line.get("checks") or []
    out = []
    if "enumeration" in checks:
        out.append("exact, by enumeration")
    if "hard_lower_bound" in checks:
        out.append("hard bound")
    band = line.get("log_z_band")
    if isinstance(band, list) and len(band) == 2 and all(_finite(b) for b in band):
        out.append(f"log Z interval {_nats(band[1] - band[0])} nats")
    elif "ess" in checks and _finite(line.get("log_z_ess")):
        out.append(f"ESS {line['log_z_ess']:g} of {line.get('log_z_num_chains', '?')} chains")
    if "bdmc_gap" in checks and _finite(line.get("bdmc_gap")):
        out.append(f"BDMC gap {_nats(line['bdmc_gap'])} nats")
    if "reverse_gap" in checks and _finite(line.get("ais_minus_reverse")):
        out.append(f"reverse sandwich {_nats(-line['ais_minus_reverse'])} nats")
    if "example_ess" in checks:
        out.append("per-example ESS")
    if "run_spread" in checks and _finite(line.get("run_spread")):
        runs, unit = (line["num_runs"], "runs") if "num_runs" in line else (line.get("num_chains", "?"), "chains")
        out.append(f"run spread {_nats(line['run_spread'])} nats over {runs} {unit}")
    return out or [c.replace("_", " ") for c in checks]


def _short(warning: str) -> str:
    """A warning's first clause of substance (``bdmc_gap: the mean gap ...`` loses its ``bdmc_gap:``), cut."""
    parts = [p for p in warning.split(": ") if len(p) >= 20] or [warning]
    text = parts[0].split("; ")[0].rstrip(".")
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 3].rstrip() + "..."


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _nats(x) -> str:
    """Two decimals; a small non-zero number to two significant figures; JSON null as "n/a"."""
    if not _finite(x):
        return "n/a"
    return f"{x:.2g}" if 0 < abs(x) < 0.01 else f"{x:.2f}"
