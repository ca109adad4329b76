"""A command's wall time on an idle machine and beside a busy neighbour: one process that spins on one core, as
another user's job on a shared node does. Prints one JSON line with both times and their ratio.

    python bench/busy_neighbour.py                                   # the README's default job (python train.py)
    python bench/busy_neighbour.py --repeats 3 -- python train.py trainer.max_steps=5000 final_eval.num_examples=1000
    python bench/busy_neighbour.py -- python train.py trainer.threads=2   # the same job with both threads forced

The idle and busy runs alternate (idle first), so a machine whose speed drifts slows both alike; the figure is the
median of ``--repeats`` pairs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def spin(stop) -> None:
    """The neighbour: pure Python arithmetic on one core until told to stop."""
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x = (x * 1_103_515_245 + 12_345) % 2_147_483_648


def timed(cmd: list[str], busy: bool) -> tuple[float, str]:
    """(wall seconds, the command's last line on stdout) of one run, with or without the neighbour."""
    stop = multiprocessing.Event()
    neighbour = multiprocessing.Process(target=spin, args=(stop,), daemon=True) if busy else None
    if neighbour:
        neighbour.start()
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            started = time.perf_counter()
            out = subprocess.run([*cmd, f"hydra.run.dir={run_dir}"] if "train.py" in " ".join(cmd) else cmd,
                                 cwd=ROOT, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            return time.perf_counter() - started, (out.stdout.strip().splitlines() or [""])[-1]
    finally:
        if neighbour:
            stop.set()
            neighbour.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("command", nargs="*", default=[sys.executable, "train.py"])
    args = parser.parse_args()
    idle, busy, last = [], [], ""
    for _ in range(args.repeats):
        for times, neighbour in ((idle, False), (busy, True)):
            seconds, last = timed(args.command, busy=neighbour)
            times.append(seconds)
    i, b = statistics.median(idle), statistics.median(busy)
    print(json.dumps({"command": " ".join(args.command), "idle_s": round(i, 1), "busy_s": round(b, 1),
                      "busy_over_idle": round(b / i, 2), "repeats": args.repeats, "last_line": last}))


if __name__ == "__main__":
    main()
