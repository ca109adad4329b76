"""torch's AVX-512 CPU kernels against its AVX2 kernels on this machine (nvil/backend/cpu_kernels.py chooses AVX2).

    python bench/cpu_kernels.py                                 # element-wise ops, the hot loops eager, IWAE
    python bench/cpu_kernels.py --parts loops --compile         # the hot loops compiled too
    python bench/cpu_kernels.py --rounds 5 --threads 1

Every measurement runs in a fresh process with ``ATEN_CPU_CAPABILITY`` set to each kernel set in turn (torch picks
its kernels once per process), the sets alternating within each of ``--rounds`` rounds so a change in the machine's
load falls on both; the tables give the median of the rounds and the ratio avx512 / avx2 (> 1: AVX2 is faster).

- ``ops``: ms per call of an element-wise op on a [100, 500] float32 tensor (50,000 elements: an AIS step's hidden
  inputs at 100 chains), one thread;
- ``loops``: ``bench/profile_hot_loops.py`` (NVIL step, block Gibbs, tempered transitions, HMC, AIS), eager, or
  with ``--compile`` also ``torch.compile``d (each set in its own compile cache, nvil/backend/cpu_kernels.py); a process
  that dies is reported with its signal;
- ``iwae``: seconds of ``evaluate.py estimator=iwae`` (K = 1000) on ``--examples`` test images of the committed
  ``bench/checkpoints/nvil_sbn200_sgd.pt``, and its estimate (which must not depend on the kernel set).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import tempfile

from common import ROOT, markdown_table  # noqa: I001  (puts the repository root on sys.path)

SETS = ("avx512", "avx2")
OPS = ("softplus", "log1p", "expm1", "exp", "log", "sigmoid", "tanh")
OPS_SCRIPT = r"""
import json, sys, time, torch
import torch.nn.functional as F
torch.set_num_threads(1)
x = torch.rand(100, 500) * 4 - 2
fns = {"softplus": F.softplus, "log1p": lambda t: torch.log1p(t.abs()), "expm1": torch.expm1, "exp": torch.exp,
       "log": lambda t: torch.log(t.abs()), "sigmoid": torch.sigmoid, "tanh": torch.tanh}
out = {"capability": torch.backends.cpu.get_cpu_capability()}
for name in sys.argv[1].split(","):
    f = fns[name]
    for _ in range(20):
        f(x)
    t0 = time.perf_counter()
    for _ in range(200):
        f(x)
    out[name] = (time.perf_counter() - t0) / 200 * 1e3
print(json.dumps(out))
"""


def child(argv: list[str], kernel_set: str, threads: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "ATEN_CPU_CAPABILITY": kernel_set, "OMP_NUM_THREADS": str(threads)}
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)


def died(proc: subprocess.CompletedProcess) -> str | None:
    """'signal N' / 'exit N' for a child that failed, else None."""
    if proc.returncode == 0:
        return None
    return f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"


def ops_rounds(args) -> dict:
    times = {s: {op: [] for op in OPS} for s in SETS}
    for _ in range(args.rounds):
        for s in SETS:
            proc = child([sys.executable, "-c", OPS_SCRIPT, ",".join(OPS)], s, 1)
            if died(proc):
                raise SystemExit(f"the element-wise probe failed under {s}: {proc.stderr[-500:]}")
            for op, ms in json.loads(proc.stdout.strip().splitlines()[-1]).items():
                if op in OPS:
                    times[s][op].append(ms)
    return times


def loops_rounds(args, mode: str) -> tuple[dict, dict]:
    """{set: {loop: [ms per round]}} of profile_hot_loops.py at ``mode``, and {set: why a round died}."""
    times, deaths = {s: {} for s in SETS}, {s: [] for s in SETS}
    for _ in range(args.rounds):
        for s in SETS:
            proc = child([sys.executable, "bench/profile_hot_loops.py", "--accel", mode, "--repeats", "3",
                          "--threads", str(args.threads), "--loops", args.loops], s, args.threads)
            for line in proc.stdout.splitlines():
                if line.startswith("['"):
                    row = ast.literal_eval(line)
                    times[s].setdefault(row[0], []).append(float(row[1]))
            if died(proc):
                deaths[s].append(died(proc))
    return times, deaths


def iwae_rounds(args) -> tuple[dict, dict]:
    seconds, estimates = {s: [] for s in SETS}, {s: set() for s in SETS}
    for _ in range(args.rounds):
        for s in SETS:
            with tempfile.TemporaryDirectory() as tmp:  # the JSON lines go there, not beside the checkpoint
                proc = child([sys.executable, "evaluate.py", "checkpoint=bench/checkpoints/nvil_sbn200_sgd.pt",
                              "estimator=iwae", f"eval.num_examples={args.examples}", "eval.progress=false",
                              f"eval.output={tmp}/iwae.jsonl"], s, args.threads)
            if died(proc):
                raise SystemExit(f"evaluate.py failed under {s}: {proc.stderr[-500:]}")
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            seconds[s].append(result["seconds"])
            estimates[s].add(result["mean_log_p"])
    return seconds, estimates


def ratio_rows(times: dict, fmt: str = "{:.3f}") -> list[list[str]]:
    rows = []
    for key in dict.fromkeys(k for s in SETS for k in times[s]):  # in order; a loop missing on one side too
        med = {s: statistics.median(times[s][key]) if times[s].get(key) else None for s in SETS}
        cells = [fmt.format(med[s]) if med[s] is not None else "died" for s in SETS]
        ratio = f"{med['avx512'] / med['avx2']:.2f}x" if None not in med.values() else "-"
        rows.append([key, *cells, ratio])
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="ops,loops,iwae")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--loops", default="nvil,gibbs,tt,hmc,ais", help="profile_hot_loops.py --loops")
    p.add_argument("--compile", action="store_true", help="also time the loops under torch.compile")
    p.add_argument("--examples", type=int, default=300, help="test images for the IWAE part")
    args = p.parse_args()
    parts = args.parts.split(",")
    print(f"{args.rounds} rounds, the kernel sets alternating, {args.threads} thread(s); medians, ms unless said")
    if "ops" in parts:
        print("\nElement-wise ops on [100, 500] float32, one thread:\n")
        print(markdown_table(["op", "avx512 ms", "avx2 ms", "avx512 / avx2"], ratio_rows(ops_rounds(args))))
    if "loops" in parts:
        for mode in ("none", "compile") if args.compile else ("none",):
            times, deaths = loops_rounds(args, mode)
            print(f"\nbench/profile_hot_loops.py, accel={mode}:\n")
            print(markdown_table(["loop", "avx512 ms", "avx2 ms", "avx512 / avx2"], ratio_rows(times)))
            for s in SETS:
                if deaths[s]:
                    print(f"\n{s}: {len(deaths[s])} of {args.rounds} processes died ({', '.join(deaths[s])}); the "
                          f"loops after the last row it printed are missing")
    if "iwae" in parts:
        seconds, estimates = iwae_rounds(args)
        print(f"\nevaluate.py estimator=iwae (K = 1000), {args.examples} test images of nvil_sbn200_sgd.pt:\n")
        print(markdown_table(["", "avx512", "avx2", "avx512 / avx2"],
                             ratio_rows({s: {"seconds": seconds[s]} for s in SETS}, "{:.2f}")
                             + [["mean log p", *(", ".join(f"{e:.4f}" for e in sorted(estimates[s])) for s in SETS),
                                 "same" if estimates["avx512"] == estimates["avx2"] else "differ"]]))


if __name__ == "__main__":
    main()
