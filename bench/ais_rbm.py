"""Time and achieved GFLOP/s of AIS for a 784-500 RBM's log Z (the paper schedule, 14,500 betas), next to
this machine's matmul peak measured in the same run.

    python bench/ais_rbm.py                         # 100 chains, CPU
    python bench/ais_rbm.py --chains 100,1000 --device cuda --checkpoint PATH

Each AIS step is two [chains x 784] x [784 x 500] matmuls (h | v and the next hidden input), 4 * chains *
784 * 500 flop; elementwise work is not counted. Without --checkpoint the RBM has random N(0, 0.1) weights
(the cost does not depend on the values).
"""

from __future__ import annotations

import argparse
import time

from common import ROOT, markdown_table  # noqa: F401,I001

import torch

from estimators.ais import base_rate, rbm_log_z, schedule
from models.rbm import BoltzmannMachine
from nvil.evaluation import load_model


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak(device, n: int = 2048, reps: int = 20) -> float:
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chains", default="100")
    p.add_argument("--num-betas", type=int, default=14500)
    p.add_argument("--device", default="cpu")
    p.add_argument("--checkpoint", default=None, help="an RBM checkpoint (default: a random 784-500 RBM)")
    args = p.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    if args.checkpoint:
        rbm = load_model(args.checkpoint, device)[0]
    else:
        rbm = BoltzmannMachine(784, 500).to(device)
        with torch.no_grad():
            rbm.W.normal_(0, 0.1)
    train = (torch.rand(1000, rbm.n_visible, device=device) < 0.13).float()
    base = base_rate(rbm, train)
    betas = schedule("paper", args.num_betas)
    peak = matmul_peak(device)
    rows = []
    for chains in [int(c) for c in args.chains.split(",")]:
        g = torch.Generator(device=device).manual_seed(0)
        rbm_log_z(rbm, base, chains, schedule("paper", 50), g)  # warm-up
        sync(device)
        t0 = time.perf_counter()
        est = rbm_log_z(rbm, base, chains, betas, g)
        sync(device)
        sec = time.perf_counter() - t0
        gflop = 4 * chains * rbm.n_pixels * rbm.n_hidden * args.num_betas / 1e9
        rows.append([str(chains), f"{est.log_z:.2f} ± {est.stderr:.2f}", f"{sec:.1f}", f"{gflop / sec:.1f}",
                     f"{peak:.1f}", f"{100 * gflop / sec / peak:.0f}%"])
        print(rows[-1], flush=True)
    print(f"\nAIS, paper schedule ({args.num_betas} betas), {rbm.n_pixels}-{rbm.n_hidden} RBM on {device} "
          f"({torch.get_num_threads()} threads):")
    print(markdown_table(["chains", "log Z", "seconds", "GFLOP/s", "matmul peak GFLOP/s", "of peak"], rows))


if __name__ == "__main__":
    main()
