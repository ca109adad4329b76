"""NVIL on binarised MNIST: Table 1 rows SBN-200 and SBN-200-200-200 of Mnih & Gregor (2014), and the
Fig. 1 ablation (variance-reduction techniques switched off). A benchmark, not run by CI.

    pip install -e '.[bench]'
    python bench/nvil_mnist.py                                    # all rows, 100,000 updates each
    python bench/nvil_mnist.py --rows sbn200,sbn200x3 --steps 3000000 --device cuda
    python bench/nvil_mnist.py --rows sbn200,sbn200_no_vr --steps 300 --test-examples 200 \
        --iwae-k 50 --device cpu                                  # a smoke test of a minute or two

Each row trains in ``bench/out/<row>/`` through ``train.train``; a rerun continues from
``checkpoints/last.pt`` (``trainer.resume=true``), so raising ``--steps`` extends the runs. The best
checkpoint (by validation bound) is then scored on the test split with the paper's measure, -ELBO averaged
over 10 samples from q, and with the importance-sampled bound -L_K. Updates/s and wall seconds cover the
training done by this invocation only. The validation curves are plotted against updates, as in Fig. 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hydra import compose, initialize_config_dir  # noqa: E402

import train  # noqa: E402
from nvil.errors import UserError  # noqa: E402
from nvil.evaluation import evaluate_checkpoint  # noqa: E402

CONFIG_DIR = ROOT / "configs"
OUT_DIR = ROOT / "bench" / "out"
# row -> (overrides, layers label, the paper's test -ELBO for NVIL in nats or None)
ROWS = {
    "sbn200": (["experiment=nvil_sbn200"], "200", 113.1),
    "sbn200x3": (["experiment=nvil_sbn200x3"], "200-200-200", 96.7),
    "sbn200_no_input_baseline": (["experiment=nvil_sbn200", "learner.input_baseline=false"], "200", None),
    "sbn200_no_vr": (["experiment=nvil_sbn200", "learner.input_baseline=false", "learner.constant_baseline=false",
                      "learner.variance_normalisation=false"], "200", None),
    "sbn200x3_no_layerwise": (["experiment=nvil_sbn200x3", "learner.layerwise=false"], "200-200-200", None),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma list of rows (default: all): {', '.join(ROWS)}")
    p.add_argument("--steps", type=int, default=100_000, help="trainer.max_steps per row (default 100000)")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    p.add_argument("--iwae-k", type=int, default=1000, help="K of the importance-sampled test bound")
    p.add_argument("--test-examples", type=int, default=None, help="test images to score (default: all 10000)")
    p.add_argument("--plot", default=str(OUT_DIR / "nvil_curves.png"), help="PNG of the validation curves")
    p.add_argument("--extra-override", action="append", default=[], help="Hydra override for every row (repeatable)")
    args = p.parse_args(argv)
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown:
        p.error(f"unknown rows {', '.join(unknown)}; known: {', '.join(ROWS)}")
    return args


def compose_row(row: str, run_dir: Path, args: argparse.Namespace):
    overrides = [*ROWS[row][0], f"trainer.max_steps={args.steps}", "trainer.progress=false",
                 "final_eval.enabled=false", f"trainer.device={args.device}", "print_config=false",
                 *args.extra_override]
    if (run_dir / "checkpoints" / "last.pt").exists():
        overrides.append("trainer.resume=true")
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def estimator_cfg(name: str, num_samples: int):
    base = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "estimator" / f"{name}.yaml"))
    return OmegaConf.create({**base, "num_samples": num_samples})


def run_row(row: str, args: argparse.Namespace) -> dict:
    """Train (or continue) one row, then score its best checkpoint on the test split."""
    run_dir = OUT_DIR / row
    cfg = compose_row(row, run_dir, args)
    started = time.perf_counter()
    metrics = train.train(cfg, run_dir)
    seconds = time.perf_counter() - started
    scores = {}
    for name, k in (("elbo", 10), ("iwae", args.iwae_k)):
        scores[name] = evaluate_checkpoint(metrics["checkpoint"], estimator_cfg(name, k), split="test",
                                           num_examples=args.test_examples, seed=0, device=args.device,
                                           progress=False)
    layers = "-".join(str(n) for n in cfg.model.layers)
    return {"layers": layers, "metrics": metrics, "seconds": seconds, **scores}


def fmt_bound(result) -> str:
    return f"{-result.mean:.2f} ± {result.stderr:.2f}"


def table(results: dict, args: argparse.Namespace) -> str:
    head = ["row", "layers", "paper NVIL -ELBO", "test -ELBO(10)", f"test -IWAE({args.iwae_k})",
            "updates", "updates/s", "wall s", "gap to paper"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row, (_, layers, paper) in ROWS.items():
        paper_s = f"{paper:.1f}" if paper is not None else "—"
        r = results.get(row)
        if r is None:
            cells = [row, layers, paper_s] + ["not run"] * 6
        else:
            m = r["metrics"]
            rate = f"{m['steps_per_second']:.1f}" if m["steps_per_second"] > 0 else "— (no new updates)"
            gap = f"{-r['elbo'].mean - paper:+.2f}" if paper is not None else "—"
            cells = [row, r["layers"], paper_s, fmt_bound(r["elbo"]), fmt_bound(r["iwae"]),
                     str(m["step"]), rate, f"{r['seconds']:.0f}", gap]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def val_curve(run_dir: Path) -> tuple[list[int], list[float]]:
    """(steps, val/elbo) from metrics.jsonl; a resumed run may log a step twice, the last entry wins."""
    points: dict[int, float] = {}
    path = run_dir / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            entry = json.loads(line) if line.strip() else {}
            if "val/elbo" in entry:
                points[int(entry["step"])] = float(entry["val/elbo"])
    steps = sorted(points)
    return steps, [points[s] for s in steps]


def plot(rows: list[str], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed, skipping the plot: pip install -e '.[bench]'")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in rows:
        steps, values = val_curve(OUT_DIR / row)
        if steps:
            ax.plot(steps, values, marker="o", markersize=3, label=row)
    ax.set_xlabel("parameter updates")
    ax.set_ylabel("validation bound (ELBO, nats)")
    ax.set_title("NVIL on binarised MNIST (cf. Mnih & Gregor 2014, Fig. 1)")
    ax.grid(alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv=None) -> None:
    args = parse_args(argv)
    results = {}
    for row in args.rows:
        print(f"== {row}", flush=True)
        try:
            results[row] = run_row(row, args)
        except UserError as e:
            print(f"error: {row}: {e}", file=sys.stderr, flush=True)
    plot(args.rows, Path(args.plot))
    print()
    print(table(results, args))


if __name__ == "__main__":
    main()
