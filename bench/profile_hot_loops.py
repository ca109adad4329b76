"""Where the time goes: the hot loops, timed (and optionally profiled) with each acceleration mode.

    python bench/profile_hot_loops.py                                   # every loop, accel none vs compile, CPU
    python bench/profile_hot_loops.py --loops gibbs,ais --profile       # plus torch.profiler's top ops
    python bench/profile_hot_loops.py --device cuda --accel none,compile,cudagraphs --threads 0

Loops (fixed seeds, random parameters: the cost does not depend on the values):

- ``nvil``:  one NVIL update (``NVIL.step``) of an SBN-200 on 784 binary pixels, batch 20 and 100;
- ``gibbs``: one block-Gibbs sweep of a 784-500 RBM at beta = 1, 100 and 1,000 chains;
- ``tt``:    one tempered-transitions run (``--tt-betas`` betas from 0.9 to 1) of that RBM, 100 chains;
- ``hmc``:   one HMC transition (``--leapfrog`` leapfrog steps) of a Gaussian belief net 784-64-64 on its
             posterior, 1,000 chains;
- ``ais``:   one AIS step of that RBM (the mean over a short run of ``--ais-steps`` steps), 100 and 1,000 chains.

Each case is warmed up (which also compiles), then timed as the median of ``--repeats`` repeats, each a short
batch of calls; the modes of a case are timed in alternation, so a noisy (shared) machine slows them alike.
The table gives milliseconds per call and each mode's speed-up over ``none``. ``--threads`` defaults to 1
(0: torch's default), which keeps the numbers steadier where other processes share the cores.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import ROOT, markdown_table, sync  # noqa: F401,I001

import torch

from nvil.estimators.ais_rbm import RBMPath, base_rate
from nvil.models.gaussian import GaussianBeliefNet
from nvil.models.inference import LayeredInference
from nvil.models.rbm import BoltzmannMachine
from nvil.models.sbn import SBN
from nvil.backend.accel import MODES
from nvil.learners.nvil import NVIL
from nvil.mcmc import BlockGibbs, TemperedTransitions
from nvil.mcmc.hmc import HMC

LOOPS = ("nvil", "gibbs", "tt", "hmc", "ais")


def binary_data(n: int, dim: int, device, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, dim, generator=g) < 0.13).float().to(device)


def rbm_784_500(device) -> BoltzmannMachine:
    torch.manual_seed(0)
    rbm = BoltzmannMachine(784, 500).to(device)
    with torch.no_grad():
        rbm.W.normal_(0, 0.1)
    return rbm


# ---- the cases: each builds, for one mode, a zero-argument callable that runs the loop once ------------------

def nvil_case(batch: int, args, device):
    x = binary_data(batch, 784, device)

    def build(mode):
        torch.manual_seed(0)
        learner = NVIL(SBN(784, [200]).to(device), LayeredInference(784, [200]).to(device), device=device, seed=0)
        learner.accelerate(mode, device)
        return lambda: learner.step(x)
    return build


def gibbs_case(chains: int, args, device):
    rbm = rbm_784_500(device)
    start = rbm.init_chains(binary_data(chains, 784, device), torch.Generator(device=device).manual_seed(0))

    def build(mode):
        gibbs, g, state = BlockGibbs(rbm, accel=mode), torch.Generator(device=device).manual_seed(1), [start]

        @torch.no_grad()
        def run():
            state[0] = gibbs.step(state[0], 1.0, g)[0]
        return run
    return build


def tt_case(chains: int, args, device):
    rbm = rbm_784_500(device)
    start = rbm.init_chains(binary_data(chains, 784, device), torch.Generator(device=device).manual_seed(0))
    betas = torch.linspace(0.9, 1.0, args.tt_betas, dtype=torch.float64)

    def build(mode):
        tt, g = TemperedTransitions(rbm, betas, accel=mode), torch.Generator(device=device).manual_seed(1)
        return lambda: tt.step(start, generator=g)
    return build


def hmc_case(chains: int, args, device):
    torch.manual_seed(0)
    net = GaussianBeliefNet(784, [64, 64]).to(device)
    x = binary_data(chains, 784, device)
    start = net.sample_prior(chains, torch.Generator(device=device).manual_seed(0))

    def build(mode):
        hmc = HMC(lambda s: net.log_joint(x, s), args.leapfrog, accel=mode)
        g, state = torch.Generator(device=device).manual_seed(1), [None]

        @torch.no_grad()
        def run():
            if state[0] is None:
                state[0] = hmc.init(start)
            state[0] = hmc.step(state[0], generator=g, step_size=0.01)[0]
        return run
    return build


def ais_case(chains: int, args, device):
    rbm = rbm_784_500(device)
    base = base_rate(rbm, binary_data(1000, 784, device))
    betas = torch.linspace(0.5, 0.9, args.ais_steps + 1, dtype=torch.float64).tolist()

    def build(mode):
        path, g = RBMPath(rbm, base, mode), torch.Generator(device=device).manual_seed(1)
        start = path.sample_base(chains, g)

        @torch.no_grad()
        def run():  # ais_steps AIS steps (weight increment, then the move), as nvil.estimators.ais.ais takes them
            state, log_w = start, 0.0
            for k in range(1, len(betas)):
                if path.fused_step is not None:
                    step, state = path.fused_step(state, betas[k - 1], betas[k], g)
                else:
                    step = (path.log_f(state, betas[k]) - path.log_f(state, betas[k - 1])).double()
                    state = path.transition(state, betas[k], g)
                log_w = log_w + step
            return log_w
        return run
    return build


def cases(args, device):
    out = []
    if "nvil" in args.loops:
        out += [(f"NVIL step, SBN-200, batch {b}", nvil_case(b, args, device), 1) for b in (20, 100)]
    if "gibbs" in args.loops:
        out += [(f"Gibbs sweep, RBM 784-500, {c} chains", gibbs_case(c, args, device), 1) for c in (100, 1000)]
    if "tt" in args.loops:
        out += [(f"tempered-transitions run, {args.tt_betas} betas, 100 chains", tt_case(100, args, device), 1)]
    if "hmc" in args.loops:
        out += [(f"HMC transition, L={args.leapfrog}, GBN 784-64-64, 1000 chains", hmc_case(1000, args, device), 1)]
    if "ais" in args.loops:
        out += [(f"AIS step, RBM 784-500, {c} chains", ais_case(c, args, device), args.ais_steps) for c in (100, 1000)]
    return out


def time_calls(fn, calls: int, device) -> float:
    sync(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync(device)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (0: leave torch's default)")
    p.add_argument("--loops", default=",".join(LOOPS))
    p.add_argument("--accel", default="none,compile", help=f"comma list of {list(MODES)}; the first is the baseline")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--min-time", type=float, default=0.2, help="seconds per repeat and mode, at least (default 0.2)")
    p.add_argument("--tt-betas", type=int, default=100)
    p.add_argument("--leapfrog", type=int, default=10)
    p.add_argument("--ais-steps", type=int, default=20)
    p.add_argument("--profile", action="store_true", help="print torch.profiler's top ops of each case and mode")
    args = p.parse_args()
    args.loops = [s.strip() for s in args.loops.split(",") if s.strip()]
    modes = [s.strip() for s in args.accel.split(",") if s.strip()]
    bad = [s for s in args.loops if s not in LOOPS] + [m for m in modes if m not in MODES]
    if bad or not modes:
        p.error(f"unknown loop or mode {bad}; loops: {list(LOOPS)}, modes: {list(MODES)}")
    device = torch.device(args.device)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    rows = []
    for name, build, per_call in cases(args, device):
        fns, compile_s = {}, {}
        for mode in modes:
            t0 = time.perf_counter()
            fn = build(mode)
            for _ in range(3):  # warm-up; compiles
                fn()
            sync(device)
            fns[mode], compile_s[mode] = fn, time.perf_counter() - t0
        calls = max(1, int(args.min_time / max(1e-6, time_calls(fns[modes[0]], 1, device))))
        times = {mode: [] for mode in modes}
        for _ in range(args.repeats):  # the modes alternate within every repeat
            for mode in modes:
                times[mode].append(time_calls(fns[mode], calls, device) / calls / per_call * 1e3)
        med = {mode: statistics.median(v) for mode, v in times.items()}
        rows.append([name] + [f"{med[m]:.3f}" for m in modes] + [f"{med[modes[0]] / med[m]:.2f}x" for m in modes[1:]]
                    + [" / ".join(f"{compile_s[m]:.0f}" for m in modes)])
        print(rows[-1], flush=True)
        if args.profile:
            from torch.profiler import ProfilerActivity, profile
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            for mode in modes:
                with profile(activities=acts) as prof:
                    for _ in range(calls):
                        fns[mode]()
                    sync(device)
                key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
                print(f"\n{name}, accel={mode}, {calls} calls:")
                print(prof.key_averages().table(sort_by=key, row_limit=12))
    print(f"\nms per call (median of {args.repeats}), on {device}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}:")
    head = ["loop"] + [f"{m} ms" for m in modes] + [f"{m} speed-up" for m in modes[1:]] + ["warm-up s (" + " / ".join(modes) + ")"]
    print(markdown_table(head, rows))


if __name__ == "__main__":
    main()
