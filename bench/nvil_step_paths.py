"""NVIL's step on its two paths, timed both ways in one process: the hand-derived gradients (``nvil.learners.fused``,
the fast path of ``nvil.backend.registry``'s ``nvil_hand_derived``) against autograd's gradients of the same surrogate
(the definition).

    python bench/nvil_step_paths.py                    # one thread, 7 rounds
    python bench/nvil_step_paths.py --threads 2 --rounds 9

One NVIL update of an SBN-200 on MNIST-like binary batches (13% of the pixels on, the input centred) at batch 20 and
100, with the default preset's Adam and the paper's SGD, ``trainer.accel=auto`` in a short run (eager) and in a run of
50,000 updates (the hand-derived step compiled). Each row alternates its two sides ``--rounds`` times and gives the
medians and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import markdown_table  # noqa: I001  (puts the repository root on sys.path)

import torch

from nvil.models.inference import LayeredInference
from nvil.models.sbn import SBN
from nvil.learners.nvil import NVIL


def per_call(fn, calls: int) -> float:
    """Milliseconds per call of ``fn``."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def nvil_step(optimizer: str, steps: int | None, batch: int, hand_derived: bool):
    torch.manual_seed(0)  # configs/learner/nvil.yaml's settings (the constructor's defaults) but the optimiser's
    learner = NVIL(SBN(784, [200]), LayeredInference(784, [200]), device="cpu", seed=0, optimizer=optimizer,
                   lr=0.006 if optimizer == "sgd" else 0.001)
    learner.inference.set_input_mean(torch.full((784,), 0.13))  # centred x, as trained on MNIST
    if not hand_derived:
        learner.fused = None  # autograd's gradients of the surrogate
    learner.accelerate("auto", "cpu", steps)
    x = (torch.rand(batch, 784, generator=torch.Generator().manual_seed(1)) < 0.13).float()
    return lambda: learner.step(x)


def alternate(a, b, rounds: int, calls: int) -> tuple[float, float]:
    for fn in (a, b):
        per_call(fn, 20)  # warm-up (and compile)
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(per_call(a, calls))
        tb.append(per_call(b, calls))
    return statistics.median(ta), statistics.median(tb)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for optimizer in ("adam", "sgd"):
        for steps, run in ((None, "short (eager)"), (50_000, "50,000 updates (compiled)")):
            for batch in (20, 100):
                autograd, fused = alternate(nvil_step(optimizer, steps, batch, False),
                                            nvil_step(optimizer, steps, batch, True), args.rounds, 100)
                rows.append([optimizer, run, str(batch), f"{autograd:.3f}", f"{fused:.3f}",
                             f"{autograd / fused:.2f}x"])
    print(f"NVIL update, SBN-200, {args.threads} thread(s), trainer.accel=auto, ms per update "
          f"(median of {args.rounds}):")
    print(markdown_table(["optimizer", "run", "batch", "autograd", "hand-derived", "speed-up"], rows))


if __name__ == "__main__":
    main()
