"""The two sequential Gibbs sweeps, timed on the CPU, here and in a copy of the code from before:

    git worktree add /tmp/before_seq HEAD        # the code to compare with
    python bench/sequential_sweeps.py --before /tmp/before_seq --threads 1,2
    python bench/sequential_sweeps.py --rows pixel_100 --accel compile   # the compiled in-block updates
    python bench/sequential_sweeps.py --before /tmp/before_seq --accel native   # the C sweeps (nvil.backend.native)

Rows (fixed seeds, random parameters of realistic scale):

- ``pixel_100``: one sequential sweep over the 784 pixels of a semi-RBM given h (``LateralBernoulli``), 100 chains,
  fields N(0, 1) (half the pixels on); ``pixel_100_sparse``: the same with fields N(-2, 1), about 15% of the pixels on
  as in MNIST (the C sweep's cost grows with the number of pixels that are on; the eager sweep's does not);
- ``sap_srbm500``: one SAP update of the ``sap_srbm500`` preset (semi-RBM 784-500 with 10 labels, 100 persistent
  particles, minibatch 100, k = 1: the sweep, the hidden units, the labels, the gradient);
- ``sbn200_50``, ``sbn200_500``: one ``SequentialGibbs`` sweep over the 200 latents of an SBN-200 given 784
  binary pixels (one softplus factor of K = 784), 50 and 500 chains (Chib, per-example AIS);
- ``dbn_500``: one sweep over h1 of a DBN 784-500-2000 (factors of K = 784 and 2,000), 500 chains;
  ``dbn_500_ais``: one temperature of per-example AIS over the same h1 (``nvil.estimators.ais.PosteriorPath``: the sweep
  at f_beta = Q^(1 - beta) P*^beta, a factorial Q, then log Q and log P* of the new states).

``--device cuda`` runs every row on the GPU (synchronised around each call); there ``--accel auto`` is the
Triton whole-sweep kernel (``nvil.backend.native.triton_sweep``) and ``--baseline-accel none`` times the eager sweep of the
same tree as the "before" column:

    python bench/sequential_sweeps.py --device cuda --rows pixel_100,sbn200_500,dbn_500,dbn_500_ais --accel auto \
        --baseline-accel none --threads 4

Each measurement is a fresh process (``--worker``) pinned to ``--threads`` threads; the two code trees are timed in
alternation, ``--rounds`` times, and each gets the median of its rounds, so a shared machine slows them alike.
The table gives wall-clock and process CPU ms per call (on a loaded machine the CPU time at 1 thread is the
steadier figure), calls per second and the speed-ups of this tree over ``--before``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWS = ("pixel_100", "pixel_100_sparse", "sap_srbm500", "sbn200_50", "sbn200_500", "dbn_500", "dbn_500_ais")


# ---- one measurement, in a worker process that imports the tree under test -----------------------------
def density(torch, builder, chains: int, sizes: list[int], gen, device="cpu"):
    """log P(v, h1) of an SBN (``sizes`` = [784, H]) or of a DBN 784-H-top with the top RBM summed out."""
    on = lambda t: t.to(device)  # noqa: E731 - drawn on the CPU generator, the same numbers on every device
    x = on((torch.rand(chains, 784, generator=gen) < 0.13).float())
    hidden = sizes[1]
    d = builder(hidden, chains, x)
    d.bernoulli(x, on(torch.randn(784, generator=gen)),
                [(slice(0, hidden), on(0.1 * torch.randn(784, hidden, generator=gen)))])
    if len(sizes) == 2:
        d.bernoulli(slice(0, hidden), on(torch.randn(hidden, generator=gen)))
    else:
        d.linear(slice(0, hidden), on(0.1 * torch.randn(hidden, generator=gen)))
        d.softplus_factor(slice(0, hidden), on(0.1 * torch.randn(hidden, sizes[2], generator=gen)),
                          on(0.1 * torch.randn(sizes[2], generator=gen)), 1.0)
    return d.build()


def make_call(row: str, accel: str, device: str = "cpu"):
    """A zero-argument callable that runs the row once (on ``device``: the SBN and DBN rows)."""
    import torch

    from nvil.models.binary_density import DensityBuilder
    from nvil.models.rbm import BoltzmannMachine
    from nvil.learners.sap import SAP
    from nvil.mcmc.sequential_gibbs import SequentialGibbs

    gen = torch.Generator().manual_seed(0)
    if row in ("pixel_100", "pixel_100_sparse", "sap_srbm500"):
        torch.manual_seed(0)
        model = BoltzmannMachine(784, 500, lateral=True, n_labels=10 if row == "sap_srbm500" else 0)
        with torch.no_grad():
            model.W.normal_(0, 0.05)
            model.L.normal_(0, 0.02)
        if accel != "none":
            model.visible_layer.accelerate(accel)
        if row.startswith("pixel_100"):
            layer, lateral = model.visible_layer, model.lateral().detach().to(device)
            field = (torch.randn(100, 784, generator=gen) - (2.0 if row.endswith("sparse") else 0.0)).to(device)
            v = (torch.rand(100, 784, generator=gen) < 0.2).float().to(device)
            beta = torch.tensor(1.0, device=device)
            g = torch.Generator(device).manual_seed(1)
            sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)

            def pixel_sweep():
                layer.sample_field(field, g, beta=beta, lateral=lateral, start=v)
                sync()

            return pixel_sweep
        sap = SAP(model.to(device), None, device=torch.device(device), seed=0, lr=0.05, num_particles=100, k=1,
                  schedule={"t0": 50000, "a": 100.0, "b": 2000.0})
        pixels = (torch.rand(100, 784, generator=gen) < 0.13).float()
        labels = torch.nn.functional.one_hot(torch.randint(0, 10, (100,), generator=gen), 10).float()
        x = torch.cat([pixels, labels], -1).to(device)
        sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)

        def sap_update():
            sap.step(x)
            sync()

        return sap_update
    chains = int(row.split("_")[1])
    sizes = [784, 200] if row.startswith("sbn") else [784, 500, 2000]
    kw = {} if accel == "none" else {"accel": accel}
    joint = density(torch, DensityBuilder, chains, sizes, gen, device)
    h = (torch.rand(chains, sizes[1], generator=gen) < 0.3).float().to(device)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    gen = torch.Generator(device).manual_seed(1)
    if row.endswith("_ais"):
        from nvil.estimators.ais_posterior import PosteriorPath

        q = DensityBuilder(sizes[1], chains, joint.u[:, :0])
        q.bernoulli(slice(0, sizes[1]), torch.randn(sizes[1]).to(device))
        path = PosteriorPath(joint, q.build(), **kw)
        state = {"s": path.state(h)}

        def temperature():
            state["s"] = path.transition(state["s"], 0.5, generator=gen)
            sync()

        return temperature
    gibbs = SequentialGibbs([(1.0, joint)], **kw)
    state = {"h": h}

    def sweep():
        state["h"] = gibbs.sweep(state["h"], generator=gen)[0]
        sync()

    return sweep


def worker(args) -> None:
    tree = Path(args.worker).resolve()
    sys.path.insert(0, str(tree))
    import torch

    import nvil

    assert Path(nvil.__file__).resolve().is_relative_to(tree), f"nvil imported from {nvil.__file__}, not {tree}"

    torch.set_num_threads(int(args.threads))
    call = make_call(args.row, args.accel, args.device)
    call()  # warm-up (and compilation)
    wall, cpu, start = [], [], time.perf_counter()
    while len(wall) < args.calls and (len(wall) < 2 or time.perf_counter() - start < args.budget):
        t0, c0 = time.perf_counter(), time.process_time()
        call()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    print(json.dumps({"ms": 1e3 * statistics.median(wall), "cpu_ms": 1e3 * statistics.median(cpu)}))


# ---- the driver ------------------------------------------------------------------------------------------
def measure(tree: Path, row: str, threads: int, args, accel: str) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(tree), "--row", row, "--threads",
           str(threads), "--calls", str(args.calls), "--budget", str(args.budget), "--accel", accel,
           "--device", args.device]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=str(tree), timeout=3600)
    if out.returncode:
        raise RuntimeError(f"{row} in {tree} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--threads", default="1", help="comma-separated thread counts (torch.set_num_threads)")
    p.add_argument("--before", default=None, help="a checkout of the code to compare with (git worktree add ...)")
    p.add_argument("--rounds", type=int, default=3, help="alternating measurements per tree")
    p.add_argument("--calls", type=int, default=5, help="timed calls per measurement (after one warm-up)")
    p.add_argument("--budget", type=float, default=20.0, help="seconds per measurement before it stops early")
    p.add_argument("--accel", default="none",
                   help="none | compile | native: the sweeps of this tree (the --before tree runs its eager default)")
    p.add_argument("--baseline-accel", default=None,
                   help="without --before: time this tree at this accel as the before column (e.g. none)")
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--row", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.device != "cpu":
        import torch

        if not torch.cuda.is_available():
            p.error(f"--device {args.device} needs a CUDA device and this machine has none; use --device cpu")
    if args.worker:
        return worker(args)
    print("| row | threads | before ms | after ms | speed-up | before CPU ms | after CPU ms | CPU speed-up | after calls/s |\n"
          "|---|---|---|---|---|---|---|---|---|", flush=True)
    for row in args.rows.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            after, before = [], []
            for _ in range(args.rounds):
                if args.before or args.baseline_accel:
                    before.append(measure(Path(args.before or ROOT), row, threads, args, args.baseline_accel or "none"))
                after.append(measure(ROOT, row, threads, args, args.accel))
            a, b = ({key: statistics.median(m[key] for m in runs) if runs else float("nan") for key in ("ms", "cpu_ms")}
                    for runs in (after, before))
            print(f"| {row} | {threads} | {b['ms']:.1f} | {a['ms']:.1f} | {b['ms'] / a['ms']:.1f}x | {b['cpu_ms']:.1f} | "
                  f"{a['cpu_ms']:.1f} | {b['cpu_ms'] / a['cpu_ms']:.1f}x | {1e3 / a['ms']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
