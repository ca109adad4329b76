"""Machinery shared by the benchmark scripts (not a script itself).

    python bench/nvil_mnist.py --help     # NVIL Table 1 rows SBN-200, SBN-200-200-200 and the Fig. 1 ablation
    python bench/nvil_tables.py --help    # every row of the NVIL paper's Tables 1 and 2

A row is a list of Hydra overrides on ``configs/train.yaml``. ``run_row`` trains it in its run directory
through ``nvil.app.main.train`` (continuing from ``checkpoints/last.pt`` when one is there, so raising ``--steps``
extends a run), then scores the best checkpoint on the test split with the NVIL paper's measure,
-ELBO averaged over 10 samples from q, and with the importance-sampled bound -L_K. ``val_curve`` and
``plot`` read and draw the validation bound (``val/elbo`` in ``metrics.jsonl``, logged under the same tag
by every learner).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nvil.backend.cpu_kernels import choose_kernels  # noqa: E402

choose_kernels()  # as the entry points do, before torch's first operation (trainer.cpu_kernels=auto)

import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

import nvil.app.main as train  # noqa: E402
from nvil.core.errors import UserError  # noqa: E402,F401  (re-exported for the scripts)
from nvil.app.evaluation import EvalSpec, evaluate_checkpoint  # noqa: E402
from nvil.core.ops import mean_and_stderr  # noqa: E402

CONFIG_DIR = ROOT / "configs"
NOT_RUN = "not run"
MEASURED_HEAD = ["updates", "updates/s", "wall s", "gap to paper"]


# ---- command line ---------------------------------------------------------------------------------

def add_common_args(p: argparse.ArgumentParser, *, default_out: Path, plot_name: str,
                    default_steps: int = 100_000) -> None:
    """The options every benchmark script takes (each adds its own ``--rows``)."""
    p.add_argument("--steps", type=int, default=default_steps,
                   help=f"trainer.max_steps per row (default {default_steps})")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    p.add_argument("--iwae-k", type=int, default=1000, help="K of the importance-sampled test bound (default 1000)")
    p.add_argument("--test-examples", type=int, default=None, help="test images to score (default: all 10000)")
    p.add_argument("--out", default=str(default_out),
                   help=f"directory of the run directories, one per row (default {rel(default_out)})")
    p.add_argument("--plot", default=None, help=f"PNG of the validation curves (default: <out>/{plot_name})")
    p.add_argument("--extra-override", action="append", default=[],
                   help="Hydra override for every row (repeatable)")


def parse_rows(p: argparse.ArgumentParser, args: argparse.Namespace, known) -> None:
    """Turn ``args.rows`` (a comma list) into a list of known row names, or exit with a usage error."""
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in args.rows if r not in known]
    if unknown:
        p.error(f"unknown rows {', '.join(unknown)}; known: {', '.join(known)}")
    if not args.rows:
        p.error("--rows names no row")
    if args.steps < 1 or args.iwae_k < 1 or (args.test_examples is not None and args.test_examples < 1):
        p.error("--steps, --iwae-k and --test-examples must be positive")
    args.out = Path(args.out)


def plot_path(args: argparse.Namespace, plot_name: str) -> Path:
    return Path(args.plot) if args.plot else args.out / plot_name


def rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


# ---- training and scoring -------------------------------------------------------------------------

def compose_row(overrides: list[str], run_dir: Path, args: argparse.Namespace) -> DictConfig:
    """The row's config: its overrides, then the benchmark's (steps, device, no final eval), then
    ``--extra-override``; ``trainer.resume=true`` when ``run_dir`` already holds a run."""
    overrides = [*overrides, f"trainer.max_steps={args.steps}", "trainer.progress=false",
                 "final_eval.enabled=false", f"trainer.device={args.device}", "print_config=false",
                 *args.extra_override]
    if (run_dir / "checkpoints" / "last.pt").exists():
        overrides.append("trainer.resume=true")
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def estimator_cfg(name: str, num_samples: int) -> DictConfig:
    base = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "estimator" / f"{name}.yaml"))
    return OmegaConf.create({**base, "num_samples": num_samples})


def run_row(overrides: list[str], run_dir: Path, args: argparse.Namespace) -> dict:
    """Train (or continue) one row in ``run_dir``, then score its best checkpoint on the test split.

    Returns ``cfg``, ``metrics`` (from ``nvil.app.main.train``), ``seconds`` (training by this invocation only)
    and the ``elbo`` (10 samples) and ``iwae`` (``args.iwae_k`` samples) results."""
    cfg = compose_row(overrides, run_dir, args)
    started = time.perf_counter()
    metrics = train.train(cfg, run_dir)
    seconds = time.perf_counter() - started
    scores = {}
    for name, k in (("elbo", 10), ("iwae", args.iwae_k)):
        scores[name] = evaluate_checkpoint(metrics["checkpoint"], estimator_cfg(name, k), EvalSpec(
            split="test", num_examples=args.test_examples, seed=0, device=args.device, progress=False))
    return {"cfg": cfg, "metrics": metrics, "seconds": seconds, **scores}


def layers_label(cfg: DictConfig) -> str:
    """Latent layer sizes, top layer last: ``200-200-200`` for an SBN, ``200`` for an fDARN."""
    m = cfg.model
    if "layers" in m:
        return "-".join(str(n) for n in m.layers)
    return str(m.n_latent)


def model_label(cfg: DictConfig) -> str:
    """``SBN 200-200-200``, ``fDARN 500``, ``SBN 200, AR q`` (autoregressive inference network)."""
    name = {"sbn": "SBN", "fdarn": "fDARN"}.get(cfg.model.name, cfg.model.name)
    label = f"{name} {layers_label(cfg)}"
    if OmegaConf.select(cfg, "model.inference.autoregressive", default=False):
        label += ", AR q"
    return label


LEARNER_LABELS = {"nvil": "NVIL", "wake_sleep": "wake-sleep"}


def learner_label(cfg: DictConfig) -> str:
    return LEARNER_LABELS.get(cfg.learner.name, cfg.learner.name)


# ---- the table --------------------------------------------------------------------------------------

def fmt_bound(result) -> str:
    """A test log-likelihood bound as positive nats: ``-mean ± stderr``."""
    return f"{-result.mean:.2f} ± {result.stderr:.2f}"


def fmt_paper(paper: float | None) -> str:
    return f"{paper:.1f}" if paper is not None else "—"


def bound_head(iwae_k: int) -> list[str]:
    return ["test -ELBO(10) ± se", f"test -IWAE({iwae_k}) ± se"]


def measured_cells(result: dict | None, paper: float | None, missing: str = NOT_RUN) -> list[str]:
    """The six measured columns (bound_head + MEASURED_HEAD); ``missing`` in each when the row has no
    result, never a number."""
    if result is None:
        return [missing] * 6
    m = result["metrics"]
    rate = f"{m['steps_per_second']:.1f}" if m["steps_per_second"] > 0 else "— (no new updates)"
    gap = f"{-result['elbo'].mean - paper:+.2f}" if paper is not None else "—"
    return [fmt_bound(result["elbo"]), fmt_bound(result["iwae"]), str(m["step"]), rate,
            f"{result['seconds']:.0f}", gap]


def mean_se(values: list[float], own_se: float | None = None) -> tuple[float, float]:
    """The mean of independent repeats (seeds) and its standard error (``nvil.core.ops.mean_and_stderr``); one repeat:
    ``own_se`` (the estimate's own SE), nan when there is none."""
    mean, se = mean_and_stderr(torch.tensor(values, dtype=torch.float64))
    if len(values) > 1:
        return mean, se
    return mean, own_se if own_se is not None else float("nan")


def paired_differences(by_seed: dict[str, dict[int, float]], reference: str) -> dict[str, tuple[float, float, int]]:
    """Each row's difference from the ``reference`` row, paired by seed: mean ± SE over the seeds both ran (d_s =
    x_s - ref_s), and the number of those seeds. Rows sharing no seed with the reference, and the reference, are left
    out. Pairing removes what a seed gives every row alike (the same seed builds the same initial parameters and
    minibatch order), so a difference can be resolved with fewer seeds than the two means' SEs suggest."""
    ref = by_seed[reference]
    out = {}
    for name, values in by_seed.items():
        seeds = sorted(set(values) & set(ref))
        if name != reference and seeds:
            out[name] = (*mean_se([values[s] - ref[s] for s in seeds]), len(seeds))
    return out


def sync(device) -> None:
    """Wait for the device's queued work (CUDA), so that wall-clock timings cover it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def cpu_name() -> str:
    """The processor's model name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


# ---- validation curves --------------------------------------------------------------------------------

def val_curve(run_dir: Path, tag: str = "val/elbo") -> tuple[list[int], list[float]]:
    """(steps, values of ``tag``) from metrics.jsonl; a resumed run may log a step twice, the last entry wins."""
    points: dict[int, float] = {}
    path = Path(run_dir) / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            entry = json.loads(line) if line.strip() else {}
            if tag in entry:
                points[int(entry["step"])] = float(entry[tag])
    steps = sorted(points)
    return steps, [points[s] for s in steps]


def plot(curves: list[tuple[str, list[int], list[float], dict]], path: Path, title: str,
         ylabel: str = "validation bound (ELBO, nats)", vline: tuple[int, str] | None = None) -> None:
    """Draw ``(label, steps, values, matplotlib style)`` curves against updates (empty ones are left out),
    with an optional vertical ``(x, label)`` marker, and save a PNG."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed, skipping the plot: pip install -e '.[bench]'")
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    drawn = 0
    for label, steps, values, style in curves:
        if steps:
            ax.plot(steps, values, **{"marker": "o", "markersize": 3, **style}, label=label)
            drawn += 1
    if vline is not None:
        ax.axvline(vline[0], color="grey", linestyle=":", label=vline[1])
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.set_xlabel("parameter updates")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize="small")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def plot_val_curves(rows: list[tuple[str, Path, dict]], path: Path, title: str) -> None:
    """``plot`` of the ``val/elbo`` curve in each ``(label, run_dir, style)``'s metrics.jsonl."""
    plot([(label, *val_curve(run_dir), style) for label, run_dir, style in rows], path, title)
