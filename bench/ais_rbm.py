"""Time and achieved GFLOP/s of AIS for a 784-500 RBM's log Z (the paper schedule), next to this machine's
matmul peak measured in the same run: a 2048^2 square matmul, and the AIS-shaped [chains x 784] @ [784 x 500]
matmul itself (the fairer ceiling for small chain counts).

    python bench/ais_rbm.py                         # 100 chains, 14,500 betas, CPU
    python bench/ais_rbm.py --chains 100,1000 --device cuda --checkpoint PATH
    python bench/ais_rbm.py --chains 100,1000,10000 --num-betas 1450,290,29 --accel none,compile --threads 2

Each AIS step is two [chains x 784] x [784 x 500] matmuls (h | v and the next hidden input), 4 * chains *
784 * 500 flop; elementwise work (the one-pass weight increment, two sigmoids, the uniforms) is not counted, so 100% of
peak is out of reach. ``--num-betas`` takes one value for every chain count, or one per chain count: the
schedule is the paper's spacing at that many steps. The work per step does not depend on the number of
betas, so GFLOP/s and the share of peak are those of the full 14,500-step run; the log Z of a shorter
schedule is a cruder (lower) estimate, and the table says how many betas each row used. Without
--checkpoint the RBM has random N(0, 0.1) weights (the cost does not depend on the values).

On a shared machine the load changes between the peak's half second and the run, so each row also takes
``--rounds`` rounds of (10 AIS steps, then the 20 AIS-shaped matmuls they contain) back to back, on the same
path: "interleaved" is the median over the rounds of matmul time / AIS time, each round's two timings taken under
the same load. "CPU ms/step" is the process's CPU time per step of the full run (all threads).
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import ROOT, markdown_table, sync  # noqa: F401,I001

import torch

from nvil.estimators.ais_rbm import RBMPath, base_rate, rbm_log_z

from nvil.estimators.annealing import ais, schedule
from nvil.backend.accel import MODES
from nvil.models.rbm import BoltzmannMachine
from nvil.backend import gemm
from nvil.app.evaluation import load_model


def matmul_gflops(device, m: int, k: int, n: int, min_seconds: float = 0.5) -> float:
    """GFLOP/s of an [m x k] @ [k x n] matmul (best of a few timed batches), by the product AIS itself uses
    (``nvil.backend.gemm``: oneDNN on an AMD CPU with AVX-512, else torch's)."""
    a = torch.randn(m, k, device=device)
    b = torch.randn(k, n, device=device)
    gemm.matmul(a, b)
    sync(device)
    t0 = time.perf_counter()
    gemm.matmul(a, b)
    sync(device)
    reps = max(1, int(min_seconds / 3 / max(1e-6, time.perf_counter() - t0)))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            gemm.matmul(a, b)
        sync(device)
        best = min(best, (time.perf_counter() - t0) / reps)
    return 2 * m * k * n / best / 1e9


@torch.no_grad()
def interleaved_share(rbm, base, chains: int, mode: str, rounds: int, steps: int = 10) -> float:
    """Median over ``rounds`` of (time of the 2 x ``steps`` AIS-shaped matmuls) / (time of ``steps`` AIS steps),
    each pair timed back to back (``steps`` moves at betas in [0.5, 0.6], and one more weight increment)."""
    device = rbm.W.device
    g = torch.Generator(device=device).manual_seed(1)
    path = RBMPath(rbm, base, mode)
    state = path.sample_base(chains, g)
    betas = torch.linspace(0.5, 0.6, steps + 2, dtype=torch.float64)
    a, w = torch.randn(chains, rbm.n_pixels, device=device), torch.randn(rbm.n_pixels, rbm.n_hidden, device=device)
    state = ais(path, state, betas, g)[1]  # warm-up (and compile)
    shares = []
    for _ in range(rounds):
        sync(device)
        t0 = time.perf_counter()
        state = ais(path, state, betas, g)[1]
        sync(device)
        t1 = time.perf_counter()
        for _ in range(2 * steps):
            gemm.matmul(a, w)
        sync(device)
        shares.append((time.perf_counter() - t1) / (t1 - t0))
    return statistics.median(shares)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chains", default="100")
    p.add_argument("--num-betas", default="14500", help="one value, or one per chain count (comma list)")
    p.add_argument("--accel", default="none", help=f"comma list of {list(MODES)}; one row per chain count and mode")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--checkpoint", default=None, help="an RBM checkpoint (default: a random 784-500 RBM)")
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds per row (0: none)")
    args = p.parse_args()
    device = torch.device(args.device)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    chain_counts = [int(c) for c in args.chains.split(",")]
    num_betas = [int(b) for b in args.num_betas.split(",")]
    if len(num_betas) == 1:
        num_betas = num_betas * len(chain_counts)
    modes = [m.strip() for m in args.accel.split(",") if m.strip()]
    if len(num_betas) != len(chain_counts) or any(m not in MODES for m in modes):
        p.error("--num-betas needs one value or one per chain count, and --accel modes from " + str(list(MODES)))
    torch.manual_seed(0)
    if args.checkpoint:
        rbm = load_model(args.checkpoint, device)[0]
    else:
        rbm = BoltzmannMachine(784, 500).to(device)
        with torch.no_grad():
            rbm.W.normal_(0, 0.1)
    train = (torch.rand(1000, rbm.n_visible, device=device) < 0.13).float()
    base = base_rate(rbm, train)
    square = matmul_gflops(device, 2048, 2048, 2048)
    print(f"square 2048^2 matmul: {square:.1f} GFLOP/s (products: {gemm.backend()})", flush=True)
    rows = []
    for chains, nb in zip(chain_counts, num_betas):
        shaped = matmul_gflops(device, chains, rbm.n_pixels, rbm.n_hidden)
        betas = schedule("paper", nb)
        for mode in modes:
            g = torch.Generator(device=device).manual_seed(0)
            rbm_log_z(rbm, base, chains, schedule("paper", 20), g, accel=mode)  # warm-up (and compile)
            sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            est = rbm_log_z(rbm, base, chains, betas, g, accel=mode)
            sync(device)
            sec, cpu = time.perf_counter() - t0, time.process_time() - c0
            gflops = 4 * chains * rbm.n_pixels * rbm.n_hidden * nb / 1e9 / sec
            share = f"{100 * interleaved_share(rbm, base, chains, mode, args.rounds):.0f}%" if args.rounds else "-"
            rows.append([str(chains), str(nb), mode, f"{est.log_z:.2f} ± {est.stderr:.2f}", f"{sec:.1f}",
                         f"{1e3 * sec / nb:.2f}", f"{1e3 * cpu / nb:.2f}", f"{gflops:.1f}", f"{square:.1f}",
                         f"{100 * gflops / square:.0f}%", f"{shaped:.1f}", f"{100 * gflops / shaped:.0f}%", share])
            print(f"{chains} chains, {mode}: {sec:.1f} s, {100 * gflops / shaped:.0f}% of the AIS-shaped peak", flush=True)
    print(f"\nAIS, paper schedule (betas per row; GFLOP/s per step does not depend on it), {rbm.n_pixels}-{rbm.n_hidden} "
          f"RBM on {device} ({torch.get_num_threads()} threads, torch {torch.__version__}):")
    print(markdown_table(["chains", "betas", "accel", "log Z", "seconds", "ms/step", "CPU ms/step", "GFLOP/s",
                          "square peak", "of square peak", "AIS-shape peak", "of AIS-shape peak",
                          "of AIS-shape peak, interleaved"], rows))


if __name__ == "__main__":
    main()
