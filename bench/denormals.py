"""Training speed with denormals flushed to zero and without (``trainer.flush_denormal``, nvil/backend/denormals.py).

    python bench/denormals.py                                   # every case below, 2 rounds, 1 thread
    python bench/denormals.py --cases relax,rebar --rounds 3 --threads 1

Each case continues a committed checkpoint of a long run (``bench/checkpoints/``: the state a run is in after
hours of training, where denormals appear; a fresh model has none) for a fixed number of updates in a fresh
``python train.py`` process, once with ``trainer.flush_denormal=true`` and once with ``false``, alternating in
rotated order each round so a busy machine slows both alike. The table gives each side's median updates/s (the
loop's own rate: updates, validation and checkpoints) and the median of the per-round ratios with their range.
Every process runs with ``--threads`` torch threads (OMP_NUM_THREADS).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, cpu_name, markdown_table  # noqa: I001

CHECKPOINTS = ROOT / "bench" / "checkpoints"
# name: (checkpoint, updates to time, overrides)
CASES = {
    "relax": ("discrete_relax_relax_s0.pt", 2_000, []),
    "rebar": ("discrete_relax_rebar_s0.pt", 3_000, []),
    "ws_sbn200": ("ws_sbn200.pt", 20_000, ["trainer.accel=auto"]),
    "nvil_fdarn200": ("nvil_fdarn200.pt", 20_000, ["trainer.accel=auto"]),
    "nvil_sbn200_ar": ("nvil_sbn200_ar.pt", 10_000, ["trainer.accel=auto"]),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES), help=f"comma list of {list(CASES)} (default: all)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of (on, off) per case (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every case's updates (default 1)")
    args = p.parse_args(argv)
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in args.cases if c not in CASES]
    if unknown or not args.cases:
        p.error(f"unknown or missing cases {unknown}; known: {list(CASES)}")
    if args.rounds < 1 or args.threads < 1 or not args.scale > 0:
        p.error("--rounds and --threads must be positive integers, --scale a positive number")
    return args


def checkpoint_step(path: Path) -> int:
    import torch
    return int(torch.load(path, map_location="cpu", weights_only=True)["step"])


def timed_run(checkpoint: Path, updates: int, overrides: list[str], flush: bool, threads: int, work: Path) -> float:
    """Updates per second of ``updates`` updates continued from ``checkpoint`` in a fresh train.py process."""
    run_dir = work / f"run_{flush}"
    shutil.rmtree(run_dir, ignore_errors=True)
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copy(checkpoint, run_dir / "checkpoints" / "last.pt")
    argv = [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", "trainer.resume=true",
            f"trainer.max_steps={checkpoint_step(checkpoint) + updates}", "trainer.progress=false",
            "trainer.tensorboard=false", "trainer.patience=null", "final_eval.enabled=false",
            f"trainer.flush_denormal={str(flush).lower()}", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"error: {checkpoint.name} (flush_denormal={flush}): {out.stderr.strip().splitlines()[-1:]}")
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith('{"train"'))
    return float(json.loads(line)["train"]["steps_per_second"])


def main(argv=None) -> None:
    args = parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="denormals_") as tmp:
        for name in args.cases:
            file, updates, overrides = CASES[name]
            updates = max(1, round(updates * args.scale))
            rates = {True: [], False: []}
            for r in range(args.rounds):
                for flush in ((True, False) if r % 2 == 0 else (False, True)):
                    rates[flush].append(timed_run(CHECKPOINTS / file, updates, overrides, flush, args.threads,
                                                  Path(tmp)))
                    print(f"{name} round {r} flush_denormal={flush}: {rates[flush][-1]:.1f} updates/s", flush=True)
            ratios = [on / off for on, off in zip(rates[True], rates[False])]
            rows.append([name, file, f"{updates:,}", f"{statistics.median(rates[True]):.1f}",
                         f"{statistics.median(rates[False]):.1f}", f"{statistics.median(ratios):.2f}x",
                         f"{min(ratios):.2f}-{max(ratios):.2f}"])
    print(f"\n**Denormals flushed vs not** ({cpu_name()}, {args.threads} thread(s), {args.rounds} rounds, "
          f"medians)\n")
    print(markdown_table(["case", "checkpoint", "updates", "flushed upd/s", "not flushed upd/s", "speed-up",
                          "per-round range"], rows))


if __name__ == "__main__":
    main()
