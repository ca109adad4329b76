"""The measured cost of the long estimators, per test example, at their default settings (configs/estimator/).

    python bench/eval_cost.py                                  # trains the small checkpoints it lacks, in --out
    python bench/eval_cost.py --dbn /work/runs/dbn_b.pt --sbn SBN.pt --gbn GBN.pt --threads 2
    python bench/eval_cost.py --rows elbo:sbn,chib_mh:gbn --sbn-steps 20 --gbn-steps 5 --examples-scale 0.1  # smoke

Checkpoints: a DBN (``--dbn``, e.g. 784-500-2000; without one the DBN rows are skipped), an SBN-200 (``--sbn``,
else ``python train.py trainer.max_steps=2000`` in-process), a Gaussian belief net (``--gbn``, else model=gbn
model.layers=[64,64] learner=mcem_hmc on 2,000 images for 200 steps) and an RBM (``--rbm``, else the DBN's bottom
RBM). Costs hardly depend on how well a model is trained. Each row times one ``estimate`` on the first
``examples`` test images (in batches of the estimator's ``batch_size``, so a row's batch is min(examples,
batch_size)). The per-example seconds count only the per-example work: a phase before it (the DBN's or RBM's log Z)
is timed apart, read off the progress-bar protocol (the estimator resets the bar when the examples start). The DBN's
top-RBM log Z is computed once, in a copy of the checkpoint's directory, and shared by the DBN rows, as in
``evaluate.py``; it is a row of its own. A second run reuses the trained checkpoints and that cached log Z in
``--out``, so only the rows cost time. Sequential Gibbs loops over the latent units in Python, so a batch costs far
less than in proportion to its examples: 10 examples (the default rows) are a fifth of chib's default batch of 50,
and ``--examples-scale 5`` times full batches, the cost per example of a long evaluation.

Beside the wall-clock seconds the table gives the process's CPU seconds (both threads) and the load average
while the row ran: on a shared machine the wall clock counts other people's work too. ``--max-load`` waits
(up to ``--max-wait`` seconds) before each row for the 1-minute load average to fall below it.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import time
from pathlib import Path

from common import ROOT, markdown_table, rel  # noqa: I001

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import nvil.app.main as train
from nvil.estimators import build_estimator
from nvil.estimators.reverse_starts import stored_particles
from nvil.estimators.log_z import top_log_z
from nvil.models.rbm import BoltzmannMachine
from nvil.core.config import estimator_config
from nvil.data import build_model_data, take_rows
from nvil.app.evaluation import load_model

# (estimator, model, overrides, examples): the long estimators at their defaults, then the cheap ones for scale.
ROWS = [
    ("chib", "dbn", {}, 10),
    ("ais_posterior", "dbn", {}, 10),
    ("chib", "sbn", {}, 10),
    ("ais_posterior", "sbn", {}, 10),
    ("harmonic", "sbn", {}, 10),
    ("iwae", "sbn", {"num_samples": 100}, 50),
    ("iwae", "sbn", {"num_samples": 1000}, 50),
    ("elbo", "sbn", {}, 100),
    ("ais", "rbm", {}, 1000),
    ("ais_hmc", "gbn", {}, 20),
    ("chib_mh", "gbn", {}, 20),
]
SETTINGS = {  # the settings that set the cost, as a reader would pass them on the command line
    "chib": ("num_steps", "num_runs", "batch_size"),
    "ais_posterior": ("num_betas", "schedule", "num_runs", "batch_size"),
    "harmonic": ("num_samples", "burn_in", "num_runs", "batch_size"), "iwae": ("num_samples", "batch_size"),
    "elbo": ("num_samples", "batch_size"), "ais": ("num_betas", "num_chains", "schedule"),
    "ais_hmc": ("num_betas", "num_runs", "num_leapfrog", "batch_size"),
    "chib_mh": ("num_steps", "num_runs", "adapt_steps", "hill_climb_steps", "batch_size"),
}


class StopwatchBar:
    """The progress-bar protocol of ``evaluate_checkpoint`` (``update``, ``n``, ``reset``, ``set_description``)
    as a stopwatch: when the estimate started, when the examples started (the last ``reset``: after a log Z phase),
    and the phases it named."""

    disable = False

    def __init__(self, total: int) -> None:
        self.n, self.total, self.phases = 0, total, []
        self.started = self.examples_started = time.perf_counter()
        self.cpu_started = self.cpu_examples_started = time.process_time()

    def update(self, n: float = 1) -> None:
        self.n += n

    def reset(self, total=None) -> None:
        self.n, self.examples_started, self.cpu_examples_started = 0, time.perf_counter(), time.process_time()

    def set_description(self, desc=None, refresh=True) -> None:
        if desc and desc not in self.phases:
            self.phases.append(desc)


def train_checkpoint(out: Path, overrides: list[str]) -> Path:
    """``python train.py OVERRIDES`` in ``out`` (kept: a second run reuses it); its last checkpoint."""
    path = out / "checkpoints" / "last.pt"
    if not path.exists():
        with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
            cfg = compose("train", overrides=overrides + ["final_eval.enabled=false", "trainer.device=cpu",
                                                          "print_config=false", "trainer.tensorboard=false"])
        t0 = time.perf_counter()
        train.train(cfg, out)
        print(f"trained {rel(out)} in {time.perf_counter() - t0:.0f} s", flush=True)
    return path


class Checkpoint:
    """A model with its inference network, data and payload, loaded once for every row that uses it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.model, self.inference, self.payload = load_model(path, torch.device("cpu"))
        self.data = build_model_data(OmegaConf.create(self.payload["config"]["data"]), torch.device("cpu"),
                                     labels=bool(self.payload["config"]["model"].get("labels", False)))


def time_row(name: str, ckpt: Checkpoint, model, overrides: dict, examples: int, seed: int) -> dict:
    """One estimate on the first ``examples`` test rows, with what ``evaluate_checkpoint`` would pass it."""
    cfg = OmegaConf.merge(estimator_config(name), {"name": name, **overrides})
    est = build_estimator(cfg)
    x = take_rows(ckpt.data.split("test"), 0, examples)
    inputs = est.dataset_inputs(model, ckpt.data, "test", (0, examples), checkpoint=ckpt.path, payload=ckpt.payload)
    if model is not ckpt.model:  # the DBN's bottom RBM: no checkpoint of its own, no stored particles
        inputs.pop("particles", None)
    bar = StopwatchBar(examples)
    load = os.getloadavg()[0]
    result = est.estimate(model, x, inference=ckpt.inference if model is ckpt.model else None, seed=seed,
                          generator=torch.Generator().manual_seed(seed), progress=bar, **inputs)
    end, cpu_end = time.perf_counter(), time.process_time()
    assert bar.n == examples, f"{name}: the bar ended at {bar.n}, not {examples}"
    return {"per_example": (end - bar.examples_started) / examples, "before": bar.examples_started - bar.started,
            "cpu_per_example": (cpu_end - bar.cpu_examples_started) / examples,
            "cpu_before": bar.cpu_examples_started - bar.cpu_started, "load": (load, os.getloadavg()[0]),
            "mean_log_p": result.mean, "settings": {k: cfg.get(k) for k in SETTINGS[name] if cfg.get(k) is not None},
            "phases": bar.phases}


def wait_for_quiet(max_load: float | None, max_wait: float) -> None:
    """Until the 1-minute load average is below ``max_load`` (or ``max_wait`` seconds have passed)."""
    t0 = time.perf_counter()
    while max_load is not None and os.getloadavg()[0] > max_load and time.perf_counter() - t0 < max_wait:
        time.sleep(10)


def describe(kind: str, model) -> str:
    if kind == "dbn":
        return f"DBN {model.n_visible}-" + "-".join(str(rbm.n_hidden) for rbm in model.rbms)
    if kind == "rbm":
        return f"RBM {model.n_visible}x{model.n_hidden}"
    if kind == "gbn":
        return "GBN " + "-".join(str(n) for n in model.latent_sizes)
    return f"SBN-{'-'.join(str(n) for n in model.layers)}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dbn", default=None, help="a DBN checkpoint (its top-RBM log Z is computed in a copy, in --out)")
    p.add_argument("--sbn", default=None, help="an SBN-200 checkpoint (default: train one in --out)")
    p.add_argument("--gbn", default=None, help="a Gaussian belief net checkpoint (default: train one in --out)")
    p.add_argument("--rbm", default=None, help="an RBM checkpoint (default: the DBN's bottom RBM)")
    p.add_argument("--rows", default=None, help="comma list of estimator:model rows (default: all)")
    p.add_argument("--sbn-steps", type=int, default=2000, help="training steps of the SBN-200 it trains (default 2000)")
    p.add_argument("--gbn-steps", type=int, default=200, help="training steps of the GBN it trains (default 200)")
    p.add_argument("--examples-scale", type=float, default=1.0, help="multiply every row's examples by this")
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "eval_cost"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-load", type=float, default=None, help="wait before each row for a load average below this")
    p.add_argument("--max-wait", type=float, default=300, help="seconds to wait for --max-load at most (default 300)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = None if args.rows is None else {r.strip() for r in args.rows.split(",")}
    rows = [r for r in ROWS if wanted is None or f"{r[0]}:{r[1]}" in wanted]

    ckpts: dict[str, Checkpoint] = {}
    kinds = {kind for _, kind, _, _ in rows}
    if "sbn" in kinds:
        ckpts["sbn"] = Checkpoint(Path(args.sbn) if args.sbn else train_checkpoint(
            out / "sbn200", [f"trainer.max_steps={args.sbn_steps}"]))
    if "gbn" in kinds:
        ckpts["gbn"] = Checkpoint(Path(args.gbn) if args.gbn else train_checkpoint(
            out / "gbn", ["model=gbn", "model.layers=[64,64]", "learner=mcem_hmc", "data.num_train=2000",
                          f"trainer.max_steps={args.gbn_steps}", "trainer.val_num_examples=20",
                          "trainer.val_ais_betas=10"]))
    table, log_z_row = [], None
    if args.dbn and kinds & {"dbn", "rbm"}:
        copy = out / "dbn" / Path(args.dbn).name  # the log Z cache is written beside the copy, not the original
        if not copy.exists():
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(args.dbn, copy)
        ckpts["dbn"] = dbn = Checkpoint(copy)
        if "dbn" in kinds:
            log_z_cfg = estimator_config("chib").log_z
            wait_for_quiet(args.max_load, args.max_wait)
            t0, cpu0, load = time.perf_counter(), time.process_time(), os.getloadavg()[0]
            c, cached = top_log_z(dbn.model, dbn.data.split("train"), log_z_cfg, copy, progress=True,
                                  particles=stored_particles(dbn.payload, dbn.model.top.n_visible))
            seconds = sum(c.seconds.values()) if cached else time.perf_counter() - t0
            top = dbn.model.top
            log_z_row = ["log Z of the top RBM (AIS + certificate)", describe("dbn", dbn.model),
                         f"num_betas={log_z_cfg.num_betas} num_chains={log_z_cfg.num_chains} "
                         f"schedule={log_z_cfg.schedule} ({top.n_visible}x{top.n_hidden}); once per checkpoint",
                         f"{seconds:.0f}" + (" (cached earlier)" if cached else ""),
                         "-" if cached else f"{time.process_time() - cpu0:.0f}", "-",
                         "-" if cached else f"{load:.1f}-{os.getloadavg()[0]:.1f}"]
            print(log_z_row, flush=True)
    if "rbm" in kinds and "rbm" not in ckpts:
        if args.rbm:
            ckpts["rbm"] = Checkpoint(Path(args.rbm))
        elif "dbn" in ckpts:
            ckpts["rbm"] = ckpts["dbn"]

    for name, kind, overrides, examples in rows:
        if kind not in ckpts:
            print(f"skipping {name} on {kind}: no checkpoint (pass --{kind})", flush=True)
            continue
        ckpt = ckpts[kind]
        model = ckpt.model
        if kind == "rbm" and not isinstance(model, BoltzmannMachine):
            model = model.rbms[0]  # the DBN's bottom RBM, trained on the images
        n = max(1, round(examples * args.examples_scale))
        wait_for_quiet(args.max_load, args.max_wait)
        r = time_row(name, ckpt, model, overrides, n, args.seed)
        label = describe(kind, model)
        settings = " ".join(f"{k}={v}" for k, v in r["settings"].items())
        per, cpu = f"{r['per_example']:.3g}", f"{r['cpu_per_example']:.3g}"
        if kind == "rbm":
            settings += f" (log Z {r['before']:.0f} s, {r['cpu_before']:.0f} CPU s, per model)"
            per, cpu = f"{r['per_example']:.2g} + log Z", f"{r['cpu_per_example']:.2g} + log Z"
        elif r["before"] > 1:
            settings += f" (+{r['before']:.0f} s reading the cached log Z)"
        table.append([name, label, settings, per, cpu, str(n), "{:.1f}-{:.1f}".format(*r["load"])])
        print(f"{name} on {label}: {per} s per example over {n} examples (mean log p {r['mean_log_p']:.2f}); "
              f"before the examples: {r['before']:.1f} s {r['phases']}", flush=True)
    if log_z_row is not None:
        table.insert(0, log_z_row)
    machine = platform.processor() or platform.machine()
    print(f"\n{machine}, {torch.get_num_threads()} threads, torch {torch.__version__}\n")
    print(markdown_table(["estimator", "model", "settings", "seconds per example", "CPU s per example",
                          "examples timed", "load average"], table))


if __name__ == "__main__":
    main()
