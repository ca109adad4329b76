"""How far the DBM's mean field must run, and what the joint phase costs, on checkpoints of ``experiment=dbm_mnist``:

    python bench/dbm_mean_field.py converge runs/dbm/checkpoints/last.pt [more checkpoints]
    python bench/dbm_mean_field.py speed runs/dbm/checkpoints/last.pt --threads 1,2

``converge``: on ``--batches`` minibatches of 100 training images (dynamic binarisation, fixed seeds), the reference
fixed point mu* is the float64 mean field run to a change below 1e-12 (Salakhutdinov & Hinton 2009, Sec. 3.1). For
float64 and float32 it gives the sweeps the author's criterion (max change < 1e-7, ``dbm_mf.m``) takes, and the
share of minibatches that reach the 50-sweep cap; then, for each sweep count n of the float32 mean field (plain
layer-by-layer updates, the start of ``DBM.mean_field``), the bound's shortfall from mu*'s (nats per image) and the
error of the SAP data term <x y'>_data (Frobenius norm) as a share of that term's own minibatch noise (the norm of
the difference between two minibatches' data terms at mu*, over sqrt 2): a share far below 1 is an error the
stochastic gradient cannot see. Last, for each over-relaxation ``--omegas`` (``mean_field_omega``) and tolerance
``--tols`` (``mean_field_tol``), the sweeps taken, the bound's shortfall and the data term's error.

``speed``: joint updates per second of ``learner=dbm_sap`` on the checkpoint's model, each setting in
``--settings`` (``tol:iters:omega``: mean_field_tol, mean_field_iters, mean_field_omega) timed in alternation, ``--rounds`` rounds of
``--updates`` updates each, at each ``--threads``; the medians and their ratio to the first setting.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from omegaconf import OmegaConf  # noqa: E402

from nvil.data.build import build_dataset  # noqa: E402
from nvil.data.dataset import binarize  # noqa: E402
from nvil.learners import build_learner  # noqa: E402
from nvil.models import build_model  # noqa: E402


def joint_learner(path: str, **overrides):
    """(DBM, its ``DBMSAP`` learner at the checkpoint's state, composed if the joint phase has not started, the
    training images as grey levels)."""
    ck = torch.load(path, weights_only=True)
    cfg = OmegaConf.create(ck["config"])
    for key, value in overrides.items():
        OmegaConf.update(cfg, f"learner.{key}", value)
    data = build_dataset(cfg.data)
    model = build_model(cfg.model, data.dim)[0]
    model.load_state_dict(ck["model"])
    learner = build_learner(cfg.learner, model, None, "cpu", int(cfg.get("seed", 0)))
    learner.load_learner_state(ck["learner"])
    if learner.updates <= learner.pretraining.total:
        learner.pretraining.compose()
        learner.updates = max(learner.updates, learner.pretraining.total + 1)
    return model, learner, data.splits["train"]


def minibatch(grey: torch.Tensor, i: int, size: int = 100) -> torch.Tensor:
    rows = torch.randperm(grey.shape[0], generator=torch.Generator().manual_seed(1000 + i))[:size]
    return binarize(grey[rows], "dynamic", 2000 + i)


def sweeps_to(dbm, v, tol: float, cap: int, omega: float | str = 1.0) -> tuple[int, list[torch.Tensor]]:
    """The sweeps ``DBM.mean_field`` takes to a max change below ``tol`` (at most ``cap``), and its means."""
    mus, sweeps = dbm.mean_field(v, cap, tol, omega=omega, return_sweeps=True)
    return sweeps, mus


def data_term(dbm, v, mus) -> torch.Tensor:
    x = dbm.join(v, torch.cat(mus[2::2], -1))
    y = torch.cat(mus[1::2], -1)
    return (x.T @ y / x.shape[0]) * dbm.mask


def converge(args) -> None:
    ns = [int(n) for n in args.sweeps.split(",")]
    tols = [float(t) for t in args.tols.split(",")]
    omegas = [o if o == "auto" else float(o) for o in args.omegas.split(",")]
    for path in args.checkpoints:
        dbm, learner, grey = joint_learner(path)
        dbm64 = joint_learner(path)[0].double()
        rows = {"sweeps_f64_1e-7": [], "sweeps_f32_1e-7": [], "capped_f32": 0, "noise": []}
        shortfall = {n: [] for n in ns}
        grad_err = {n: [] for n in ns}
        tol_sweeps = {(o, t): [] for o in omegas for t in tols}
        tol_err = {(o, t): [] for o in omegas for t in tols}
        tol_short = {(o, t): [] for o in omegas for t in tols}
        refs = []
        for i in range(args.batches):
            v = minibatch(grey, i)
            _, ref = sweeps_to(dbm64, v.double(), 1e-12, 2000)
            ref32 = [m.float() for m in ref]
            refs.append((v, ref32))
            n64, _ = sweeps_to(dbm64, v.double(), 1e-7, 50)
            n32, _ = sweeps_to(dbm, v, 1e-7, 50)
            rows["sweeps_f64_1e-7"].append(n64)
            rows["sweeps_f32_1e-7"].append(n32)
            rows["capped_f32"] += n32 >= 50
            bound_ref = dbm64.variational_bound(v.double(), ref).mean().item()
            g_ref = data_term(dbm, v, ref32)
            for n in ns:
                _, mus = sweeps_to(dbm, v, 0.0, n)
                shortfall[n].append(bound_ref - dbm64.variational_bound(v.double(), [m.double() for m in mus]).mean()
                                    .item())
                grad_err[n].append((data_term(dbm, v, mus) - g_ref).norm().item())
            for o, t in tol_sweeps:
                k, mus = sweeps_to(dbm, v, t, 50, o)
                tol_sweeps[o, t].append(k)
                tol_err[o, t].append((data_term(dbm, v, mus) - g_ref).norm().item())
                tol_short[o, t].append(bound_ref - dbm64.variational_bound(v.double(), [m.double() for m in mus])
                                       .mean().item())
        for (va, ra), (vb, rb) in zip(refs[::2], refs[1::2]):
            rows["noise"].append((data_term(dbm, va, ra) - data_term(dbm, vb, rb)).norm().item() / math.sqrt(2))
        noise = statistics.mean(rows["noise"])
        step = torch.load(path, weights_only=True)["step"]
        print(f"\n{path} (update {step}; joint updates {learner.joint_updates}), {args.batches} minibatches of 100")
        print(f"sweeps to max change < 1e-7: float64 median {statistics.median(rows['sweeps_f64_1e-7'])} "
              f"(range {min(rows['sweeps_f64_1e-7'])}-{max(rows['sweeps_f64_1e-7'])}); float32 median "
              f"{statistics.median(rows['sweeps_f32_1e-7'])}, {rows['capped_f32']}/{args.batches} at the cap of 50")
        print(f"minibatch noise of the data term ||G_a - G_b|| / sqrt 2: {noise:.4g}")
        print("| float32 sweeps | bound shortfall (nats/image) | data-term error / noise |")
        print("|---:|---:|---:|")
        for n in ns:
            print(f"| {n} | {statistics.mean(shortfall[n]):.2e} | {statistics.mean(grad_err[n]) / noise:.2e} |")
        print("| mean_field_omega | mean_field_tol | sweeps (median, max) | bound shortfall | data-term error / noise |")
        print("|---:|---:|---:|---:|---:|")
        for o, t in tol_sweeps:
            print(f"| {o} | {t:g} | {statistics.median(tol_sweeps[o, t])}, {max(tol_sweeps[o, t])} | "
                  f"{statistics.mean(tol_short[o, t]):.2e} | {statistics.mean(tol_err[o, t]) / noise:.2e} |")
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"checkpoint": path, "step": step, "noise": noise, **{
                    k: v for k, v in rows.items() if k != "noise"},
                    "shortfall": {n: statistics.mean(s) for n, s in shortfall.items()},
                    "grad_err_share": {n: statistics.mean(e) / noise for n, e in grad_err.items()},
                    "tol_sweeps": {f"{o}:{t}": statistics.median(s) for (o, t), s in tol_sweeps.items()}}) + "\n")


def speed(args) -> None:
    settings = [tuple(s.split(":")) for s in args.settings.split(",")]
    path = args.checkpoints[0]
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        runs = {s: [] for s in settings}
        learners = {}
        for s in settings:
            omega = (s[2] if s[2] == "auto" else float(s[2])) if len(s) > 2 else 1.0
            dbm, learner, grey = joint_learner(path, mean_field_tol=float(s[0]), mean_field_iters=int(s[1]),
                                               mean_field_omega=omega)
            learners[s] = learner
        batches = [minibatch(grey, i) for i in range(args.updates)]
        for _ in range(args.rounds):
            for s in settings:
                learner = learners[s]
                learner.step(batches[0])  # warm
                t0 = time.perf_counter()
                for v in batches:
                    learner.step(v)
                runs[s].append(args.updates / (time.perf_counter() - t0))
        base = statistics.median(runs[settings[0]])
        print(f"\n{path}, {threads} thread(s), {args.rounds} rounds of {args.updates} joint updates")
        print("| mean_field_tol : mean_field_iters : mean_field_omega | updates / s (median) | ratio to the first |")
        print("|---|---:|---:|")
        for s in settings:
            med = statistics.median(runs[s])
            print(f"| {' : '.join(s)} | {med:.2f} | {med / base:.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["converge", "speed"])
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--sweeps", default="1,2,3,5,8,10,15,20,30,50")
    p.add_argument("--tols", default="1e-7,1e-5,1e-4,1e-3")
    p.add_argument("--omegas", default="1,1.2")
    p.add_argument("--settings", default="1e-7:50:1,1e-4:50:1.2")
    p.add_argument("--threads", default="1")
    p.add_argument("--updates", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    converge(args) if args.mode == "converge" else speed(args)


if __name__ == "__main__":
    main()
