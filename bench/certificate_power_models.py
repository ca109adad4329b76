"""The power of the per-example certificate (``nvil.evaluate_model``) on protocol models, the users' own models
written against ``nvil.models.protocol``, whose exact log p(x) is known: how often a right estimate is certified
within the budget, and whether a certified estimate's band (``extras["mean_log_p_band"]``) ever misses the exact
mean log p(x).

    python bench/certificate_power_models.py                        # 10 runs per row, 32 examples, 1 thread
    python bench/certificate_power_models.py --runs 20 --threads 2
    python bench/certificate_power_models.py --budget 10 --models linear,binary  # a stated 10 s budget

The models (from tests/test_user_model.py and tests/test_laplace.py), each with its exact log p(x) in float64:

- ``linear 2-5``: ``LinearGaussianVAE(d=2, v=5, sigma=1)``, continuous latents and a deliberately rough proposal
  q(z | x); p(x) = N(x; b, W W^T + sigma^2 I);
- ``sharp 10-40``: ``NoProposal(d=10, v=40, sigma=0.1)``, a sharp linear-Gaussian posterior and no proposal: AIS
  starts from a Laplace fit of each posterior;
- ``binary 10-12``: ``BinaryVAE()``, 10 binary latents and 12 binary visibles, p(x) by summing the 1,024 latent
  states.

Each run draws ``--examples`` rows from the model (data seed 1000 + run) and estimates them with seed = run:

- ``budget``: ``evaluate_model(model, x)`` with no settings: ``estimator=ais`` grown by doubling within the
  ``"auto"`` budget (300 s), or within ``--budget`` seconds;
- ``smc budget``: ``estimator="smc"`` with no settings, the same budget;
- ``fixed``: ``estimator="ais"``, ``budget=None``, ``--fixed-betas`` x ``--fixed-chains`` (500 x 16): a fixed
  schedule that certifies every model here, for the cost comparison (``ModelAIS``'s defaults, 1000 x 16, take
  twice as long; ``--fixed-betas 1000``);
- ``too short``: ``budget=None``, 5 betas x 2 chains;
- ``shift -d`` / ``shift +d``: every certified ``budget`` and ``smc budget`` run with its estimate moved by
  ``--shift`` nats (``log_p`` and every chain's estimate), its checks run again by the estimator's own functions
  (``PerExample.certify``, which also recomputes the band; ``ModelAIS.check_reverse`` against the same reverse
  runs (both sides); ``ModelAIS.compare_with_iwae`` against the same IWAE draws; the BDMC checks on simulated data do not depend on the estimate and are kept): a number that is not
  what the runs gave.

Columns: runs; ``certified``; ``band holds exact``: runs, certified or not, whose band contains the exact mean
log p(x) (on a shift row, the band moved with the estimate: it must be 0, a band that still holds the exact value
2 nats away being too wide to be of use); ``cert., band misses``: certified runs whose band misses it (the number
that must be 0 on the other rows); ``cert., > 3 MC SE``: certified runs whose mean is more than 3 Monte Carlo
standard errors from the exact mean (the delta-method SE of the mean over examples of log-mean-exp over chains, the
same sigma the band uses); the median seconds per run and, for the budget rows, the median number of rounds. On a shift row, runs counts the certified runs shifted, and a
certified shifted run is a wrong number certified. The default run (32 examples, 10 runs, 1 thread) took 17 minutes
on one thread of a 2-core x86 CPU whose cores two training runs also used, two thirds of it in the ``fixed`` rows
(BDMC on 50 simulated examples at 500 x 16); hence 500 betas there rather than ``ModelAIS``'s 1000, which would
bring it to about 20 minutes. Not run by CI; tests/test_certificate_power.py checks the binary model with fixed
seeds.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import math
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "tests", ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from nvil.backend.cpu_kernels import choose_kernels  # noqa: E402

choose_kernels()  # as the entry points do, before torch's first operation

import torch  # noqa: E402

import nvil  # noqa: E402
from nvil.estimators import ModelAIS  # noqa: E402
from nvil.estimators.base import Result  # noqa: E402
from nvil.estimators.protocol_view import protocol  # noqa: E402
from test_laplace import NoProposal  # noqa: E402
from test_user_model import BinaryVAE, LinearGaussianVAE  # noqa: E402

MODELS = ("linear", "sharp", "binary")


@dataclass
class Run:
    """One estimate of one run's rows, with the rows' exact mean log p(x) and its wall-clock seconds."""

    result: Result
    exact: float
    seconds: float
    x: torch.Tensor


@torch.no_grad()
def enumerated_log_p(model, x: torch.Tensor) -> torch.Tensor:
    """log p(x) of each row by summing over every binary latent state, in float64: logsumexp over z of
    log p(z) + log p(x | z)."""
    m = copy.deepcopy(model).double()
    states = torch.tensor(list(itertools.product([0.0, 1.0], repeat=m.latent.size)), dtype=torch.float64)
    prior = m.log_prior(states)
    return torch.stack([torch.logsumexp(prior + m.log_likelihood(row.expand(len(states), -1), states), 0)
                        for row in x.double()])


@torch.no_grad()
def gaussian_log_p(model, x: torch.Tensor) -> torch.Tensor:
    """The linear-Gaussian model's closed form (its ``exact_log_p``), computed in float64."""
    return copy.deepcopy(model).double().exact_log_p(x.double())


def build(name: str):
    """(label, model, exact log p function) of the bench's model ``name``."""
    if name == "linear":
        return "linear 2-5 (proposal)", LinearGaussianVAE(d=2, v=5, sigma=1.0), gaussian_log_p
    if name == "sharp":
        return "sharp 10-40 (Laplace start)", NoProposal(d=10, v=40, sigma=0.1), gaussian_log_p
    if name == "binary":
        return "binary 10-12", BinaryVAE(), enumerated_log_p
    raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")


@torch.no_grad()
def simulate(model, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return model.sample_likelihood(model.sample_prior(n, g), g)


def run(model, x: torch.Tensor, exact: float, seed: int, **kwargs) -> Run:
    t0 = time.perf_counter()
    result = nvil.evaluate_model(model, x, seed=seed, **kwargs)
    return Run(result, exact, time.perf_counter() - t0, x)


def mc_stderr(result: Result) -> float:
    """The Monte Carlo standard error of ``mean_log_p`` by the delta method (``per_example.monte_carlo_band``'s
    sigma): sqrt(sum_i var_r(w_ir) / (R mean_r(w_ir)^2)) / n over examples i and chains r."""
    per_run = result.run_log_p.double().T  # [examples, runs]
    w = torch.exp(per_run - per_run.max(1, keepdim=True).values)
    rel_var = (w.var(1) / w.shape[1] / w.mean(1) ** 2).nan_to_num(0.0)
    return math.sqrt(float(rel_var.sum())) / w.shape[0]


def band_holds(r: Run) -> bool:
    """The certificate's band [low, high] for the mean contains the exact mean log p(x) (an open end holds)."""
    lo, hi = r.result.extras.get("mean_log_p_band", [None, None])
    return (lo is None or lo <= r.exact) and (hi is None or r.exact <= hi)


def shifted(r: Run, model, delta: float) -> Run:
    """``r`` with every estimate moved by ``delta`` nats and the estimate's checks run again: the per-example ones
    and the band (``PerExample.certify``; the ESS and the run spread do not move), ``reverse_order`` and ``reverse_gap`` against the
    same reverse runs (AIS; ``ModelAIS.check_reverse``), ``above_iwae`` against the same
    IWAE draws (``ModelAIS.compare_with_iwae`` with the result's seed and the default IWAE settings every row here
    uses), and the checks on simulated data (BDMC, likelihood consistency), which do not see the estimate, as
    they were."""
    res = r.result
    out = replace(res, log_p=res.log_p + delta, run_log_p=res.run_log_p + delta, checks=[], failed=[], warnings=[],
                  extras={k: v for k, v in res.extras.items() if k != "mean_log_p_band"})
    est = ModelAIS()  # certify and compare_with_iwae read the runs' shape, the IWAE samples, start and batch size
    est.certify(out, out.run_log_p.T)
    if "reverse_order" in res.checks:  # against the same reverse runs (their mean is in extras)
        est.check_reverse(out)
    if "above_iwae" in res.checks:
        est.compare_with_iwae(protocol(model), r.x, out, res.seed, 0)
    for name in res.checks:
        if name not in out.checks:
            out.check(name, name not in res.failed, f"{name}: failed in the unshifted estimate")
    return Run(out, r.exact, 0.0, r.x)


def cells(model: str, exact: float, setting: str, runs: list[Run], budget: bool) -> list[str]:
    cert = [r for r in runs if r.result.certified is True]
    holds, misses = sum(band_holds(r) for r in runs), sum(not band_holds(r) for r in cert)
    far = sum(abs(r.result.mean_log_p - r.exact) > 3 * mc_stderr(r.result) for r in cert)
    seconds = statistics.median(r.seconds for r in runs) if runs and runs[0].seconds else None
    rounds = (statistics.median(len(r.result.extras["budget"]["rounds"]) for r in runs)
              if budget and runs else None)
    return [model, f"{exact:.3f}", setting, str(len(runs)), f"{len(cert)} / {len(runs)}", str(holds),
            str(misses), str(far), "" if seconds is None else f"{seconds:.2f}",
            "" if rounds is None else f"{rounds:g}"]


HEAD = ["model", "exact mean log p (mean over runs)", "row", "runs", "certified", "band holds exact", "cert., band misses",
        "cert., > 3 MC SE", "median s", "median rounds"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--examples", type=int, default=32)
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated: {', '.join(MODELS)}")
    p.add_argument("--budget", type=float, default=None, help="seconds per budget run (default: auto, 300 s)")
    p.add_argument("--fixed-betas", type=int, default=500)
    p.add_argument("--fixed-chains", type=int, default=16)
    p.add_argument("--shift", type=float, default=2.0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    budget = "auto" if args.budget is None else args.budget
    budget_name = "auto, 300 s" if args.budget is None else f"{args.budget:g} s"
    t0 = time.perf_counter()
    print(f"{args.runs} runs per row, {args.examples} examples per run, budget {budget_name}, fixed "
          f"{args.fixed_betas} x {args.fixed_chains}, shift {args.shift:g} nats, {args.threads} threads", flush=True)
    table = []
    for name in args.models.split(","):
        label, model, exact_fn = build(name)
        rows: dict[str, list[Run]] = {"budget": [], "smc budget": [], "fixed": [], "too short": []}
        exacts = []
        for seed in range(args.runs):
            x = simulate(model, args.examples, 1000 + seed)
            exact = exact_fn(model, x).mean().item()
            exacts.append(exact)
            rows["budget"].append(run(model, x, exact, seed, budget=budget))
            rows["smc budget"].append(run(model, x, exact, seed, estimator="smc", budget=budget))
            rows["fixed"].append(run(model, x, exact, seed, estimator="ais", budget=None,
                                     num_betas=args.fixed_betas, num_chains=args.fixed_chains))
            rows["too short"].append(run(model, x, exact, seed, estimator="ais", budget=None, num_betas=5,
                                         num_chains=2))
            b, s = rows["budget"][-1], rows["smc budget"][-1]
            print(f"  {name} run {seed}: exact {exact:.4f}; budget {b.result.mean_log_p:.4f} "
                  f"{b.result.extras['mean_log_p_band']} {b.result.certified} {b.seconds:.1f} s; smc "
                  f"{s.result.mean_log_p:.4f} {s.result.certified} {s.seconds:.1f} s; fixed "
                  f"{rows['fixed'][-1].result.certified} {rows['fixed'][-1].seconds:.1f} s", file=sys.stderr,
                  flush=True)
        certified = [r for r in rows["budget"] + rows["smc budget"] if r.result.certified is True]
        full = {f"budget ({budget_name})": (rows["budget"], True),
                f"smc budget ({budget_name})": (rows["smc budget"], True),
                f"fixed ({args.fixed_betas} x {args.fixed_chains})": (rows["fixed"], False),
                "too short (5 x 2)": (rows["too short"], False),
                f"budget and smc, shift -{args.shift:g}": ([shifted(r, model, -args.shift) for r in certified], False),
                f"budget and smc, shift +{args.shift:g}": ([shifted(r, model, args.shift) for r in certified], False)}
        for setting, (runs, is_budget) in full.items():
            table.append(cells(label, statistics.mean(exacts), setting, runs, is_budget))
            print(" | ".join(table[-1]), file=sys.stderr, flush=True)
    from common import markdown_table  # noqa: E402  (hydra and the app, imported only to print)

    print(markdown_table(HEAD, table))
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
