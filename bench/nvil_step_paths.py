"""Two choices inside NVIL's fused step on this CPU, each timed both ways in one process: the optimiser's step (torch's
fused Adam against ``nvil.learners.adam.Adam``'s C step) and the centred sparse inputs (``nvil.native.sparse_rows``
against the dense GEMMs).

    python bench/nvil_step_paths.py                    # one thread, 7 rounds
    python bench/nvil_step_paths.py --threads 2 --rounds 9

Table 1, Adam's step alone on NVIL's SBN-200 parameters (0.4 M in three groups, as ``build_optimizer`` makes them):
with tiny tensors of the same count (what is left is the Python per step), with the tensors in cache, and with 64 MB
written between steps (cold, as in the training loop, where the step's products evict m and v). Table 2, one NVIL
update at batch 20 and 100 (``trainer.accel`` auto and compile, the paper's SGD preset) with the sparse-input path
forced on and off (``sparse_rows.VECTORISED``: the learners take it only where the kernels are vectorised by hand).
Each row alternates its two sides ``--rounds`` times and gives the medians and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import markdown_table  # noqa: I001  (puts the repository root on sys.path)

import torch
from omegaconf import OmegaConf

from models.inference import LayeredInference
from models.sbn import SBN
from nvil.learners.adam import Adam
from nvil.learners.nvil import NVIL
from nvil.native import sparse_rows

SHAPES = [(200, 784), (200,), (784, 200), (784,), (100, 784), (100,), (1, 100), (1,)]  # q, decoder, baseline


def per_call(fn, calls: int, between=None) -> float:
    """Milliseconds per call of ``fn`` (``between`` runs before each call, untimed)."""
    total = 0.0
    for _ in range(calls):
        if between is not None:
            between()
        start = time.perf_counter()
        fn()
        total += time.perf_counter() - start
    return total / calls * 1e3


def adam_pair(tiny: bool):
    """Torch's fused Adam and ours over the same parameters, each with its own copy and gradients."""
    g = torch.Generator().manual_seed(0)
    sides = []
    for make in (lambda groups: torch.optim.Adam(groups, lr=1e-3, fused=True),
                 lambda groups: Adam(groups, lr=1e-3, betas=(0.9, 0.999))):
        ps = [torch.nn.Parameter(torch.randn(*((1,) * len(s) if tiny else s), generator=g)) for s in SHAPES]
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g) * 1e-3
        opt = make([{"params": ps[:2], "lr": 1e-3}, {"params": ps[2:4], "lr": 2e-4}, {"params": ps[4:], "lr": 1e-3}])
        if isinstance(opt, Adam):
            opt.accelerate("auto", "cpu")
        sides.append(opt.step)
    return sides


def nvil_step(optimizer: str, mode: str, batch: int, sparse: bool):
    cfg = OmegaConf.load("configs/learner/nvil.yaml")
    cfg.optimizer, cfg.lr = optimizer, (0.006 if optimizer == "sgd" else 0.001)
    torch.manual_seed(0)
    learner = NVIL(SBN(784, [200]), LayeredInference(784, [200]), cfg, "cpu", 0)
    learner.inference.set_input_mean(torch.full((784,), 0.13))  # centred x, as trained on MNIST
    saved, sparse_rows.VECTORISED = sparse_rows.VECTORISED, sparse
    try:
        learner.accelerate(mode, "cpu")
    finally:
        sparse_rows.VECTORISED = saved
    x = (torch.rand(batch, 784, generator=torch.Generator().manual_seed(1)) < 0.13).float()
    return lambda: learner.step(x)


def alternate(a, b, rounds: int, calls: int, between=None) -> tuple[float, float]:
    for fn in (a, b):
        per_call(fn, 20, between)  # warm-up (and compile)
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(per_call(a, calls, between))
        tb.append(per_call(b, calls, between))
    return statistics.median(ta), statistics.median(tb)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    big = torch.empty(16 * 1024 * 1024)
    rows = []
    for name, tiny, between in (("tiny tensors (the Python per step)", True, None), ("in cache", False, None),
                                ("cold (64 MB written between steps)", False, lambda: big.add_(1.0))):
        t_torch, t_ours = alternate(*adam_pair(tiny), args.rounds, 200, between)
        rows.append([name, f"{t_torch:.3f}", f"{t_ours:.3f}", f"{t_torch / t_ours:.2f}x"])
    print(f"Adam's step, NVIL's SBN-200 parameters, {args.threads} thread(s), ms per step (median of {args.rounds}):")
    print(markdown_table(["case", "torch fused", "C step", "speed-up"], rows))
    rows = []
    for optimizer in ("sgd",):  # Adam keeps the dense products (torch's fused state would copy input-major weights)
        for mode in ("auto", "compile"):
            for batch in (20, 100):
                dense, sparse = alternate(nvil_step(optimizer, mode, batch, False),
                                          nvil_step(optimizer, mode, batch, True), args.rounds, 100)
                rows.append([optimizer, mode, str(batch), f"{dense:.3f}", f"{sparse:.3f}", f"{dense / sparse:.2f}x"])
    print(f"\nNVIL update, SBN-200, {args.threads} thread(s), ms per update (sparse_rows.VECTORISED here: "
          f"{sparse_rows.VECTORISED}):")
    print(markdown_table(["optimizer", "accel", "batch", "dense", "sparse inputs", "sparse speed-up"], rows))


if __name__ == "__main__":
    main()
