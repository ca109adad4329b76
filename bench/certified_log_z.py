"""The top RBM's log Z of a DBN checkpoint (or an RBM's log Z), before and after certification: the paper's fixed
ladder and the adaptive one on the same budget, each with its certificate (hard lower bound, reverse AIS, ESS).

    python bench/certified_log_z.py --checkpoint outputs/dbn/checkpoints/last.pt --betas 14500 --chains 100
    python bench/certified_log_z.py --checkpoint RBM.pt --schedules paper,adaptive --threads 2

Prints one table row per schedule; not run by CI.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nvil.backend.cpu_kernels import choose_kernels  # noqa: E402

choose_kernels()  # as the entry points do, before torch's first operation

from nvil.estimators.ais_rbm import base_rate
from nvil.estimators.certify import certified_log_z, certify_settings  # noqa: E402
from nvil.estimators.reverse_starts import stored_particles  # noqa: E402
from nvil.estimators.log_z import has_top_log_z  # noqa: E402
from nvil.data import build_model_data  # noqa: E402
from nvil.app.evaluation import load_model  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--schedules", default="paper,adaptive")
    p.add_argument("--betas", type=int, default=14500)
    p.add_argument("--chains", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model, _, payload = load_model(Path(args.checkpoint), device)
    data = build_model_data(OmegaConf.create(payload["config"]["data"]), device,
                            labels=bool(payload["config"]["model"].get("labels", False)))
    rbm, rows = (model.top, model.top_data(data.split("train"))) if has_top_log_z(model) else \
        (model, data.split("train"))
    particles = stored_particles(payload, rbm.n_visible)
    base = base_rate(rbm, rows)
    print(f"{type(model).__name__ + ' top machine' if has_top_log_z(model) else 'RBM'} {rbm.n_visible}-{rbm.n_hidden}, {args.chains} chains, "
          f"{args.betas} betas, reverse chains from "
          f"{'stored particles' if particles is not None else 'a Gibbs run from training rows'}, "
          f"{args.threads} threads, {time.strftime('%Y-%m-%d')}", flush=True)
    header = ["schedule", "log Z ± SE", "ESS", "log-w SD", "hard lower bound", "reverse log Z", "certified", "s"]
    print(" | ".join(header))
    for kind in args.schedules.split(","):
        t0 = time.perf_counter()
        c = certified_log_z(rbm, base, {"num_chains": args.chains, "schedule": kind, "num_betas": args.betas},
                            certify_settings({}), torch.Generator(device=device).manual_seed(args.seed),
                            data_rows=rows, particles=particles)
        sec = time.perf_counter() - t0
        print(" | ".join([kind, f"{c.log_z:.2f} ± {c.stderr:.2f}", f"{c.forward.ess:.1f}", f"{c.forward.log_w_sd:.2f}",
                          f"{c.bound.value:.2f}", f"{c.reverse.log_z:.2f}", str(c.certified), f"{sec:.0f}"]), flush=True)
        for w in c.warnings:
            print(f"    warning: {w}", flush=True)
        print(f"    seconds: {({k: round(v, 1) for k, v in c.seconds.items()})}", flush=True)


if __name__ == "__main__":
    main()
