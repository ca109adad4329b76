"""Murray & Salakhutdinov 2009, Fig. 2 (left): the variational bound, the Chib-style estimator at S = 5..40
and per-case AIS on 50 MNIST test cases (5 per class) of a 784-500-2000 DBN, all sharing one AIS log Z.

    python bench/chib_vs_ais.py                            # trains experiment=dbn_mnist first if needed
    python bench/chib_vs_ais.py --checkpoint PATH --steps 5,10,20,40 --ais-betas 100,1000 --full-test 10000

Prints a table (estimate, standard error over cases, seconds) and saves the figure (estimate against
Markov-chain steps, the bound and AIS as lines). Then runs Chib at the largest S on ``--full-test`` cases.
Paper: bound -87.05, AIS (10,000 temperatures) -85.20, Chib (S = 40) -85.22 on 50 cases; full test set -84.55.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import ROOT, markdown_table, rel  # noqa: I001

import torch
from omegaconf import OmegaConf

import nvil.app.main as train
from nvil.estimators import build_estimator
from nvil.estimators.log_z import top_log_z
from nvil.core.config import estimator_config
from nvil.data import build_model_data
from nvil.app.evaluation import first_per_class, load_model

PAPER = {"bound": -87.05, "ais_10000": -85.20, "ais_1000": -86.05, "ais_100": -89.59, "chib_40": -85.22,
         "chib_full": -84.55, "bound_full": -86.22}


def run(name: str, overrides: dict, model, x, train_rows, checkpoint, seed: int) -> tuple[dict, float]:
    cfg = OmegaConf.merge(estimator_config(name), overrides)
    est = build_estimator(cfg)
    inputs = {"train": train_rows, "checkpoint": checkpoint} if name != "harmonic" else {}
    t0 = time.perf_counter()
    result = est.estimate(model, x, seed=seed, generator=torch.Generator(device=x.device).manual_seed(seed), **inputs)
    return result.summary(), time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=None, help="a DBN checkpoint (default: train experiment=dbn_mnist in --out)")
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "chib_vs_ais"))
    p.add_argument("--steps", default="5,10,20,40", help="Chib S values")
    p.add_argument("--runs", type=int, default=10, help="Chib runs per case (paper: 10)")
    p.add_argument("--ais-betas", default="100,1000", help="per-case AIS temperatures (paper: 100, 1000, 10000)")
    p.add_argument("--ais-runs", type=int, default=10)
    p.add_argument("--log-z-betas", type=int, default=14500)
    p.add_argument("--log-z-schedule", default="adaptive", help="adaptive (certified default) | paper")
    p.add_argument("--log-z-chains", type=int, default=100)
    p.add_argument("--full-test", type=int, default=0, help="test cases for the final Chib run (paper: 10000)")
    p.add_argument("--full-batch", type=int, default=1000, help="test cases per batch in the full-test run")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)

    checkpoint = Path(args.checkpoint) if args.checkpoint else out / "dbn" / "checkpoints" / "last.pt"
    if not checkpoint.exists():
        from hydra import compose, initialize_config_dir

        with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
            cfg = compose("train", overrides=["experiment=dbn_mnist", "final_eval.enabled=false",
                                               f"trainer.device={args.device}", "print_config=false"])
        train.train(cfg, out / "dbn")
    model, _, payload = load_model(checkpoint, device)
    data = build_model_data(OmegaConf.create(payload["config"]["data"]), device,
                            labels=bool(payload["config"]["model"].get("labels", False)))
    x50, train_rows = first_per_class(data.split("test"), data, "test", 5, "chib"), data.split("train")

    shared = {"log_z": {"num_betas": args.log_z_betas, "schedule": args.log_z_schedule, "num_chains": args.log_z_chains}}
    log_z_cfg = OmegaConf.merge(estimator_config("chib").log_z, shared["log_z"])
    est, cached = top_log_z(model, train_rows, log_z_cfg, checkpoint, progress=True)
    lo, hi = est.band()
    print(f"top-RBM log Z = {est.log_z:.3f} +- {est.stderr:.3f} (3 SD band {est.forward.log_z_3sd}), ESS "
          f"{est.forward.ess:.1f}, hard lower bound {est.bound.value if est.bound else float('nan'):.3f}, band "
          f"[{lo:.3f}, {hi if hi is not None else float('nan'):.3f}], certified {est.certified} {est.warnings}, "
          f"{sum(est.seconds.values()):.0f} s{' (cached)' if cached else ''}", flush=True)

    rows, series = [], {"chib": []}
    bound, sec = run("dbn_bound", {**shared, "num_samples": 100}, model, x50, train_rows, checkpoint, args.seed)
    rows.append(["variational bound (Eq. 17)", f"{bound['mean_log_p']:.2f} ± {bound['stderr_examples']:.2f}", f"{sec:.1f}", f"{PAPER['bound']}"])
    print(rows[-1], flush=True)
    for s in [int(v) for v in args.steps.split(",")]:
        r, sec = run("chib", {**shared, "num_steps": s, "num_runs": args.runs}, model, x50, train_rows, checkpoint, args.seed)
        series["chib"].append((s, r["mean_log_p"], r["stderr_examples"]))
        rows.append([f"Chib S={s}, {args.runs} runs", f"{r['mean_log_p']:.2f} ± {r['stderr_examples']:.2f} (run spread {r['run_spread']:.2f})",
                     f"{sec:.1f}", f"{PAPER['chib_40']}" if s == 40 else ""])
        print(rows[-1], flush=True)
    ais_lines = []
    for k in [int(v) for v in args.ais_betas.split(",") if v]:
        r, sec = run("ais_posterior", {**shared, "num_betas": k, "num_runs": args.ais_runs}, model, x50, train_rows,
                     checkpoint, args.seed)
        ais_lines.append((k, r["mean_log_p"]))
        rows.append([f"AIS {k} temperatures, {args.ais_runs} runs", f"{r['mean_log_p']:.2f} ± {r['stderr_examples']:.2f}",
                     f"{sec:.1f}", f"{PAPER.get(f'ais_{k}', '')}"])
        print(rows[-1], flush=True)
    table = markdown_table(["estimator (50 test cases, 5 per class)", "mean log p(v) ± SE over cases", "seconds", "paper"], rows)
    print(table)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    steps, means, ses = zip(*series["chib"])
    ax.errorbar(steps, means, yerr=ses, marker="o", label="Chib-style estimator")
    ax.axhline(bound["mean_log_p"], color="k", ls="--", label="variational bound")
    for k, m in ais_lines:
        ax.axhline(m, ls=":", label=f"AIS, {k} temperatures")
    ax.set_xlabel("Markov chain steps S")
    ax.set_ylabel("estimated test log-probability")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "chib_vs_ais.png", dpi=120)
    print(f"figure: {rel(out / 'chib_vs_ais.png')}")

    full = None
    if args.full_test:
        s = max(int(v) for v in args.steps.split(","))
        xt = data.split("test")[: args.full_test]
        full, sec = run("chib", {**shared, "num_steps": s, "num_runs": 1, "batch_size": args.full_batch}, model, xt,
                        train_rows, checkpoint, args.seed)
        print(f"Chib S={s}, 1 run, first {xt.shape[0]} test cases: {full['mean_log_p']:.2f} ± {full['stderr']:.2f} "
              f"({sec:.0f} s; paper, all 10,000: {PAPER['chib_full']})", flush=True)
        full_bound, sec = run("dbn_bound", {**shared, "num_samples": 100, "batch_size": args.full_batch}, model, xt,
                              train_rows, checkpoint, args.seed)
        print(f"variational bound, first {xt.shape[0]} test cases: {full_bound['mean_log_p']:.2f} ± "
              f"{full_bound['stderr']:.2f} ({sec:.0f} s; paper, all 10,000: {PAPER['bound_full']})", flush=True)
        full = {"chib": full, "bound": full_bound}
    (out / "results.json").write_text(json.dumps({"log_z": est.to_dict(), "table": rows, "full": full}, indent=1))


if __name__ == "__main__":
    main()
