"""The power of the certified AIS log Z (nvil.estimators.certify) on held-out RBMs whose log Z is enumerable: how
often a right estimate is certified, and whether every wrong one is flagged.

    python bench/certificate_power.py                     # 10 runs per row, 100 chains, 1000 betas
    python bench/certificate_power.py --runs 20 --threads 2
    python bench/certificate_power.py --samplers smc,budget  # adaptive tempered SMC and the budget mode only

The models: RBMs trained by PCD on prototype data (their persistent chains kept as a checkpoint keeps them: not
equilibrium samples of the final parameters), a random RBM with strong weights (multimodal), and a barrier RBM
whose strong mode no forward chain from the base rate reaches, and the top machines of a DBN and of a DBM
(the machines whose log Z those families' estimates need). Each is run with

- ``enough``: the adaptive ladder with ``--betas`` steps (the estimate is right on all but the barrier model);
- ``few``: a linear ladder of each of ``--few-betas`` steps (too coarse);
- ``shift -d`` / ``shift +d``: the ``enough`` runs' forward log Z moved by ``--shift`` nats and checked again
  (a number that is not what the runs gave);
- ``particles only``: ``enough`` with the reverse chains from the stored particles alone (a start that lags the
  model; the rows without stored particles are skipped);
- ``smc``: ``estimator=smc``'s sampler (``--particles`` x ``--smc-runs``, conditional ESS share ``--cess``) in place
  of forward AIS, with the same certificate; ``smc coarse``: 8 particles x 4 runs at a share of 0.3 (too coarse);
  ``smc shift -d`` / ``+d`` as above;
- ``budget``: ``estimator=ais`` within ``--budget`` seconds from its defaults (``nvil.estimators.budget``), the
  log Z and certificate of its last round.

Columns: runs; ``off``: runs whose forward log Z is more than 3 SE (+ 0.01 nats) from the exact value;
``certified``; ``cert. & off``: certified runs whose forward log Z is off; ``cert. & outside``: certified runs
whose band (``CertifiedLogZ.band``), widened by 3 SE of each side, misses the exact value (the number that must be
0); the reverse source each run kept (f: forward-resampled, p: stored particles, d: data); the mean seconds per run.
Not run by CI;
tests/test_certificate_power.py checks two such models with fixed seeds.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nvil.backend.cpu_kernels import choose_kernels  # noqa: E402

choose_kernels()  # as the entry points do, before torch's first operation

import torch  # noqa: E402

from nvil.estimators.ais_rbm import base_rate  # noqa: E402
from nvil.estimators.certify import SOURCES, CertifiedLogZ, certified_log_z, run_checks  # noqa: E402
from nvil.estimators.settings import CertifySettings  # noqa: E402
from nvil.estimators.smc import SMCSampler  # noqa: E402
from nvil.mcmc.gibbs import BlockGibbs  # noqa: E402
from nvil.models.dbm import DBM  # noqa: E402
from nvil.models.dbn import DBN  # noqa: E402
from nvil.models.rbm import BoltzmannMachine, State  # noqa: E402

CERT = CertifySettings()


@dataclass
class Case:
    """An RBM with its exact log Z, training rows (base rate, probes, data starts) and stored particles."""

    name: str
    model: BoltzmannMachine
    rows: torch.Tensor
    particles: torch.Tensor | None
    exact: float


def prototype_rows(V: int, K: int, n: int, flip: float, seed: int) -> torch.Tensor:
    """n rows, each one of K random binary prototypes with every pixel flipped with probability ``flip``."""
    g = torch.Generator().manual_seed(seed)
    protos = (torch.rand(K, V, generator=g) < 0.5).float()
    noise = (torch.rand(n, V, generator=g) < flip).float()
    return (protos[torch.randint(0, K, (n,), generator=g)] + noise) % 2


@torch.no_grad()
def pcd_rbm(rows: torch.Tensor, H: int, steps: int, lr: float, seed: int,
            chains: int = 100) -> tuple[BoltzmannMachine, torch.Tensor]:
    """(an RBM trained by persistent contrastive divergence, one block-Gibbs sweep per update on ``chains``
    persistent chains, batches of 100 rows; the chains at the end): the particles a PCD checkpoint stores."""
    torch.manual_seed(seed)
    m = BoltzmannMachine(rows.shape[1], H)
    mean = rows.mean(0).clamp(0.02, 0.98)
    m.W.normal_(0, 0.01)
    m.c.zero_()
    m.b.copy_(torch.log(mean / (1 - mean)))
    g = torch.Generator().manual_seed(seed)
    gibbs, state = BlockGibbs(m), State((torch.rand(chains, rows.shape[1], generator=g) < 0.5).float(), None)
    for _ in range(steps):
        x = rows[torch.randint(0, len(rows), (100,), generator=g)]
        state, _ = gibbs.step(state, 1.0, g)
        p_data, p_model = torch.sigmoid(m.hidden_input(x)), torch.sigmoid(m.hidden_input(state.x))
        m.W += lr * (x.T @ p_data / len(x) - state.x.T @ p_model / len(state.x))
        m.b += lr * (x.mean(0) - state.x.mean(0))
        m.c += lr * (p_data.mean(0) - p_model.mean(0))
    return m, state.x


@torch.no_grad()
def random_rbm(seed: int, V: int = 20, H: int = 12, scale: float = 2.0) -> BoltzmannMachine:
    """W ~ N(0, scale^2), b ~ N(-1, 1), c ~ N(0, 1): strong weights, several modes."""
    torch.manual_seed(seed)
    m = BoltzmannMachine(V, H)
    m.W.normal_(0, scale)
    m.b.normal_(-1, 1)
    m.c.normal_(0, 1)
    return m


@torch.no_grad()
def barrier_rbm(seed: int = 0, width: int = 30) -> BoltzmannMachine:
    """40 pixels, 12 hidden units; hidden unit 0 switches on ``width`` pixels together behind a barrier (W = 10,
    c_0 = -150, isolated from the rest): a mode worth tens of nats that no chain from a sparse base rate reaches."""
    torch.manual_seed(seed)
    m = BoltzmannMachine(40, 12)
    m.W.normal_(0, 0.3)
    m.b.fill_(-3.0)
    m.c.normal_(0, 0.5)
    m.W[:, 0] = 0.0
    m.W[:width, 0] = 10.0
    m.W[:width, 1:] = 0.0
    m.c[0] = -150.0
    return m


def case(name: str, model: BoltzmannMachine, rows: torch.Tensor, particles=None) -> Case:
    return Case(name, model, rows, particles, model.log_z_exact().double().item())


def pcd_case(V: int, K: int, flip: float, H: int, steps: int, lr: float, seed: int) -> Case:
    rows = prototype_rows(V, K, 2000, flip, seed)
    m, particles = pcd_rbm(rows, H, steps, lr, seed)
    return case(f"pcd {V}-{H}", m, rows, particles)


@torch.no_grad()
def top_machine_case(family: str, seed: int) -> Case:
    """The machine whose log Z a DBN's or a DBM's estimate needs (``model.top``), its rows from data as the
    estimators make them (``top_data``): a DBN 16-12-10 whose layers are RBMs trained by PCD on prototype rows,
    stacked greedily; a DBM 14-10-8 with weights N(0, 0.7^2) over prototype rows."""
    rows = prototype_rows(16 if family == "dbn" else 14, 4, 2000, 0.03, seed)
    if family == "dbn":
        dbn = DBN(16, [12, 10])
        first, _ = pcd_rbm(rows, 12, 1000, 0.1, seed)
        dbn.rbms[0].load_state_dict(first.state_dict())
        h = (torch.sigmoid(first.hidden_input(rows)) > torch.rand(len(rows), 12, generator=torch.Generator()
                                                                   .manual_seed(seed))).float()
        top, particles = pcd_rbm(h, 10, 1000, 0.1, seed + 1)
        dbn.top.load_state_dict(top.state_dict())
        return case("dbn 16-12-10 top", dbn.top, dbn.top_data(rows), particles)
    torch.manual_seed(seed)
    dbm = DBM(14, [10, 8])
    dbm.top.W.normal_(0, 0.7)
    dbm.top.b.normal_(-1, 0.5)
    dbm.top.c.normal_(0, 0.5)
    dbm.constrain_()
    return case("dbm 14-10-8 top", dbm.top, dbm.top_data(rows))


def held_out_cases(seed: int = 100) -> list[Case]:
    """The bench's models (seeds apart from the test's)."""
    sparse = lambda V: (torch.rand(500, V, generator=torch.Generator().manual_seed(seed)) < 0.1).float()  # noqa: E731
    return [pcd_case(20, 4, 0.05, 10, 1000, 0.1, seed), pcd_case(24, 6, 0.03, 14, 2000, 0.2, seed),
            pcd_case(30, 8, 0.02, 16, 2000, 0.3, seed), pcd_case(28, 10, 0.02, 20, 2000, 0.3, seed),
            case("random 20-12", random_rbm(seed), sparse(20)), case("barrier 40-12", barrier_rbm(seed), sparse(40)),
            top_machine_case("dbn", seed), top_machine_case("dbm", seed)]


def certify(c: Case, schedule: str, num_betas: int, chains: int, seed: int, sources=SOURCES,
            sampler=None) -> CertifiedLogZ:
    g = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    out = certified_log_z(c.model, base_rate(c.model, c.rows), {"num_chains": chains, "schedule": schedule,
                                                                 "num_betas": num_betas},
                          CERT, g, data_rows=c.rows, particles=c.particles, sources=sources, sampler=sampler)
    out.seconds["total"] = time.perf_counter() - t0
    return out


def smc_certify(c: Case, particles: int, runs: int, cess: float, seed: int) -> CertifiedLogZ:
    sampler = SMCSampler(particles, runs, cess, 0.5, 1, 100_000, 2)
    return certify(c, "adaptive", 1000, particles * runs, seed, sampler=sampler)


def budget_certify(c: Case, seconds: float, seed: int) -> CertifiedLogZ:
    """``estimator=ais`` grown within ``seconds`` (``within_budget``): its last round's certified log Z."""
    from nvil.estimators.ais import AIS
    from nvil.estimators.budget import within_budget

    kept = []

    def one_round(est, round_seed):
        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(round_seed)
        kept.append(est.certified_log_z(c.model, c.rows, c.rows, g, False, c.particles))
        kept[-1].seconds["total"] = time.perf_counter() - t0
        return SimpleNamespace(certified=kept[-1].certified, failed=kept[-1].failed, warnings=[], extras={})

    within_budget(AIS, {}, seconds, one_round, seed)
    kept[-1].seconds["total"] = sum(k.seconds["total"] for k in kept)
    return kept[-1]


def shifted(c: CertifiedLogZ, delta: float, cert: CertifySettings = CERT) -> CertifiedLogZ:
    """``c`` with its forward log Z moved by ``delta`` nats and its checks run again."""
    lo, hi = c.forward.log_z_3sd
    fwd = replace(c.forward, log_z=c.forward.log_z + delta,
                  log_z_3sd=(None if lo is None else lo + delta, None if hi is None else hi + delta))
    out = replace(c, forward=fwd, checks=[], failed=[], warnings=[])
    run_checks(out, cert)
    return out


def off(c: CertifiedLogZ, exact: float) -> bool:
    """The forward log Z is more than 3 SE (+ 0.01 nats) from the exact value."""
    return abs(c.forward.log_z - exact) > 3 * c.forward.stderr + 0.01


def outside(c: CertifiedLogZ, exact: float) -> bool:
    """The exact value is outside the band [low, high] widened by 3 SE of each side (+ 0.01 nats)."""
    lo, hi = c.band()
    hi = c.forward.log_z if hi is None else hi
    se = 3 * max(c.forward.stderr, 0.0 if c.reverse is None else c.reverse.stderr) + 0.01
    return not lo - se <= exact <= hi + se


def row(name: str, setting: str, runs: list[CertifiedLogZ], exact: float) -> str:
    bad, ok = [off(c, exact) for c in runs], [c.certified is True for c in runs]
    src = Counter(c.reverse_source[0] for c in runs if c.reverse_source)
    return " | ".join([name, f"{exact:.2f}", setting, str(len(runs)), str(sum(bad)), str(sum(ok)),
                       str(sum(b and o for b, o in zip(bad, ok))),
                       str(sum(outside(c, exact) and o for c, o in zip(runs, ok))),
                       " ".join(f"{k}{v}" for k, v in sorted(src.items())),
                       f"{sum(c.seconds.get('total', 0.0) for c in runs) / len(runs):.2f}"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--chains", type=int, default=100)
    p.add_argument("--betas", type=int, default=1000)
    p.add_argument("--few-betas", default="5,30", help="comma-separated ladder lengths")
    p.add_argument("--shift", type=float, default=2.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--samplers", default="ais,smc,budget", help="which rows: ais, smc, budget (comma-separated)")
    p.add_argument("--particles", type=int, default=50)
    p.add_argument("--smc-runs", type=int, default=10)
    p.add_argument("--cess", type=float, default=0.9)
    p.add_argument("--budget", type=float, default=30.0, help="seconds per budget run")
    args = p.parse_args()
    samplers = set(args.samplers.split(","))
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    print(f"{args.runs} runs per row, {args.chains} chains, {args.betas} betas (few: {args.few_betas}), shift "
          f"{args.shift} nats, {args.threads} threads")
    print(" | ".join(["model", "exact log Z", "setting", "runs", "off", "certified", "cert. & off", "cert. & outside",
                      "reverse source", "seconds"]), flush=True)
    seeds, few = range(args.runs), [int(k) for k in args.few_betas.split(",")]
    for c in held_out_cases():
        rows = {}
        if "ais" in samplers:
            enough = [certify(c, "adaptive", args.betas, args.chains, s) for s in seeds]
            rows[f"enough ({args.betas} adaptive)"] = enough
            for k in few:
                rows[f"few ({k} linear)"] = [certify(c, "linear", k, args.chains, s) for s in seeds]
            rows.update({f"shift -{args.shift:g}": [shifted(r, -args.shift) for r in enough],
                         f"shift +{args.shift:g}": [shifted(r, args.shift) for r in enough]})
            if c.particles is not None:
                rows["particles only"] = [certify(c, "adaptive", args.betas, args.chains, s, ("particles",))
                                          for s in seeds]
        if "smc" in samplers:
            smc = [smc_certify(c, args.particles, args.smc_runs, args.cess, s) for s in seeds]
            rows[f"smc ({args.particles}x{args.smc_runs}, cess {args.cess:g})"] = smc
            rows["smc coarse (8x4, cess 0.3)"] = [smc_certify(c, 8, 4, 0.3, s) for s in seeds]
            rows.update({f"smc shift -{args.shift:g}": [shifted(r, -args.shift) for r in smc],
                         f"smc shift +{args.shift:g}": [shifted(r, args.shift) for r in smc]})
        if "budget" in samplers:
            rows[f"budget {args.budget:g} s (ais)"] = [budget_certify(c, args.budget, s) for s in seeds]
        for setting, runs in rows.items():
            print(row(c.name, setting, runs, c.exact), flush=True)
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
