"""Before and after: the hot loops of this checkout against another git revision, timed the same way.

    python bench/before_after.py --before 84772de            # the revision before the hot-loop changes
    python bench/before_after.py --before HEAD~3 --repeats 9 --threads 1

The older revision is checked out into a temporary git worktree. The same timing code (below, using only APIs
both revisions have: ``NVIL.step``, ``BlockGibbs.step``, ``TemperedTransitions.step``, ``rbm_log_z``) runs in a
fresh subprocess per revision and repeat, alternating before / after, so a busy machine slows both alike; the
table gives the median milliseconds per call and the speed-up. Every process uses ``--threads`` torch threads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, markdown_table  # noqa: I001

CHILD = r'''
import json, sys, time
import torch
root, threads = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, root)
torch.set_num_threads(threads)
from omegaconf import OmegaConf
from models import build_model
from models.rbm import BoltzmannMachine
from nvil.learners import build_learner
from nvil.mcmc import BlockGibbs, TemperedTransitions, uniform_betas
from estimators.ais import base_rate, rbm_log_z, schedule

def per_call(fn, n):
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3

out = {}
torch.manual_seed(0)
cfg = OmegaConf.load(f"{root}/configs/learner/nvil.yaml")
model, inference = build_model(OmegaConf.create({"name": "sbn", "layers": [200], "inference": {}}), 784)
nvil = build_learner(cfg, model, inference, torch.device("cpu"), 0)
for batch in (20, 100):
    x = (torch.rand(batch, 784) < 0.13).float()
    out[f"NVIL step, SBN-200, batch {batch}"] = per_call(lambda: nvil.step(x), 100 if batch == 20 else 40)
rbm = BoltzmannMachine(784, 500)
with torch.no_grad():
    rbm.W.normal_(0, 0.1)
g = torch.Generator().manual_seed(0)
for chains in (100, 1000):
    state = rbm.init_chains((torch.rand(chains, 784) < 0.13).float(), g)
    gibbs = BlockGibbs(rbm)
    out[f"Gibbs sweep, RBM 784-500, {chains} chains"] = per_call(lambda: gibbs.step(state, 1.0, g), 20)
tt = TemperedTransitions(rbm, uniform_betas(50, 0.9))
state = rbm.init_chains((torch.rand(100, 784) < 0.13).float(), g)
out["tempered-transitions run, 50 betas, 100 chains"] = per_call(lambda: tt.step(state, generator=g), 5)
base = base_rate(rbm, (torch.rand(1000, 784) < 0.13).float())
for chains in (100, 1000):
    betas = schedule("paper", 200)
    out[f"AIS step, RBM 784-500, {chains} chains"] = per_call(lambda: rbm_log_z(rbm, base, chains, betas, g), 2) / 200
print(json.dumps(out))
'''


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="git revision to compare with (e.g. a commit hash)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.before], check=True,
                       capture_output=True)
        try:
            times: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
            for _ in range(args.repeats):
                for side, root in (("before", old), ("after", ROOT)):
                    run = subprocess.run([sys.executable, "-c", CHILD, str(root), str(args.threads)], cwd=root,
                                         capture_output=True, text=True, check=True)
                    for k, v in json.loads(run.stdout.splitlines()[-1]).items():
                        times[side].setdefault(k, []).append(v)
                print(".", end="", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)
    rows = []
    for k in times["after"]:
        b, a = statistics.median(times["before"][k]), statistics.median(times["after"][k])
        rows.append([k, f"{b:.3f}", f"{a:.3f}", f"{b / a:.2f}x"])
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"\nbefore = {args.before}, after = {head.stdout.strip()} (+ working tree); CPU, {args.threads} thread(s), "
          f"median of {args.repeats} alternating runs")
    print(markdown_table(["loop", "before ms", "after ms", "speed-up"], rows))


if __name__ == "__main__":
    main()
