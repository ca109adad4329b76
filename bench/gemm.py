"""torch's float32 product (MKL on x86) against oneDNN's (``nvil.backend.gemm``) on the shapes of this project's hot loops.

    python bench/gemm.py                     # one thread, 5 rounds
    python bench/gemm.py --threads 2 --rounds 7

Each row times one product both ways in alternation, ``--rounds`` times, and gives the medians, GFLOP/s and the
ratio; both results are compared (max |difference|). The shapes: block Gibbs / AIS on a 784-500 RBM (hidden input
[chains, 784] x [784, 500] with its bias, visible field [chains, 500] x [500, 784]); PCD's weight step on that RBM
(W += alpha v' p from 100 rows, in place); NVIL's SBN-200 products at batch 20 and 100; the HMC products of a
784-64-64 Gaussian belief net at 1,000 chains; a 2048^2 square. The CPU's vendor and AVX-512 flag are printed: MKL
runs AVX-512 only on Intel's CPUs, so the ratio is the one that ``nvil.backend.gemm.backend()`` acts on.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import markdown_table  # noqa: I001  (puts the repository root on sys.path)

import torch

from nvil.backend import gemm
from nvil.backend.cpu_kernels import cpu_flags


def cases(g: torch.Generator) -> list[tuple[str, int, object, object]]:
    """(name, multiply-adds, torch's product, oneDNN's product) for each shape."""
    def rows(m, k, p=0.3):
        return (torch.rand(m, k, generator=g) < p).float()

    w = torch.randn(784, 500, generator=g) * 0.1
    b, c = torch.randn(784, generator=g), torch.randn(500, generator=g)
    out = []
    for chains in (100, 1000):
        v, h = rows(chains, 784, 0.13), rows(chains, 500, 0.5)
        out.append((f"RBM hidden input c + v W, {chains} chains", chains * 784 * 500,
                    lambda v=v: torch.addmm(c, v, w), lambda v=v: gemm.onednn_linear(v, w.t(), c)))
        out.append((f"RBM visible field b + beta h W', {chains} chains", chains * 784 * 500,
                    lambda h=h: torch.addmm(b, h, w.t(), alpha=0.7), lambda h=h: gemm.onednn_linear(h * 0.7, w, b)))
    v, p, w2 = rows(100, 784, 0.13), torch.rand(100, 500, generator=g), w.clone()
    out.append(("PCD weight step W += alpha v' p, 100 rows (in place)", 100 * 784 * 500,
                lambda: w2.addmm_(v.t(), p, alpha=-1e-6),
                lambda: w2.copy_(gemm.onednn_linear_add(v.t() * -1e-6, w2, p.t()))))
    for batch in (20, 100):
        x, hs = rows(batch, 784, 0.13), rows(batch, 200, 0.5)
        dec, q = torch.randn(784, 200, generator=g) * 0.1, torch.randn(200, 784, generator=g) * 0.1
        bd, bq = torch.randn(784, generator=g), torch.randn(200, generator=g)
        out.append((f"SBN-200 decoder h W' + b, batch {batch}", batch * 200 * 784,
                    lambda hs=hs, dec=dec, bd=bd: torch.addmm(bd, hs, dec.t()),
                    lambda hs=hs, dec=dec, bd=bd: gemm.onednn_linear(hs, dec, bd)))
        out.append((f"SBN-200 inference x W' + b, batch {batch}", batch * 784 * 200,
                    lambda x=x, q=q, bq=bq: torch.addmm(bq, x, q.t()),
                    lambda x=x, q=q, bq=bq: gemm.onednn_linear(x, q, bq)))
    z, e, mean = torch.randn(1000, 64, generator=g), torch.randn(784, 64, generator=g), torch.randn(1000, 784, generator=g)
    out.append(("GBN emission z V' + c, 1,000 chains", 1000 * 64 * 784,
                lambda: torch.addmm(b, z, e.t()), lambda: gemm.onednn_linear(z, e, b)))
    out.append(("GBN pull-back t - m V, 1,000 chains", 1000 * 784 * 64,
                lambda: torch.addmm(z, mean, e, alpha=-1), lambda: gemm.onednn_linear_add(mean, z, -e.t())))
    sq1, sq2 = torch.randn(2048, 2048, generator=g), torch.randn(2048, 2048, generator=g)
    out.append(("square 2048^2", 2048 ** 3, lambda: sq1 @ sq2, lambda: gemm.onednn_linear(sq1, sq2.t(), None)))
    return out


def seconds(fn, min_seconds: float) -> float:
    """Seconds per call: calls batched to ``min_seconds``, after one warm-up call."""
    fn()
    t0 = time.perf_counter()
    fn()
    reps = max(3, int(min_seconds / max(1e-7, time.perf_counter() - t0)))
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--min-seconds", type=float, default=0.2, help="per timing (default 0.2)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if not torch.backends.mkldnn.is_available():
        raise SystemExit("this torch build has no oneDNN")
    flags = cpu_flags()
    print(f"CPU vendor {gemm.cpu_vendor() or '?'}, avx512f {'avx512f' in flags}, {args.threads} thread(s), "
          f"torch {torch.__version__}; nvil.backend.gemm.backend() = {gemm.backend()}")
    rows = []
    for name, macs, aten, onednn in cases(torch.Generator().manual_seed(0)):
        diff = (aten() - onednn()).abs().max().item() if "in place" not in name else float("nan")
        times = {"aten": [], "onednn": []}
        for _ in range(args.rounds):
            times["aten"].append(seconds(aten, args.min_seconds))
            times["onednn"].append(seconds(onednn, args.min_seconds))
        t_a, t_o = statistics.median(times["aten"]), statistics.median(times["onednn"])
        rows.append([name, f"{1e6 * t_a:.0f}", f"{2 * macs / t_a / 1e9:.0f}", f"{1e6 * t_o:.0f}",
                     f"{2 * macs / t_o / 1e9:.0f}", f"{t_a / t_o:.2f}x", f"{diff:.1e}"])
    print(markdown_table(["product", "torch us", "GFLOP/s", "oneDNN us", "GFLOP/s", "oneDNN speed-up",
                          "max abs diff"], rows))


if __name__ == "__main__":
    main()
