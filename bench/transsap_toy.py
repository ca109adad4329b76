"""Trans-SAP on the toy RBM: the top panel of Fig. 1 of Salakhutdinov (2009). A benchmark, not run by CI.

    pip install -e '.[bench]'
    python bench/transsap_toy.py                                   # all three rows, 100,000 updates each
    python bench/transsap_toy.py --rows sap,trans_sap --device cuda
    python bench/transsap_toy.py --steps 200 --device cpu --threads 1 --out /tmp/bench_smoke_tt   # smoke test

An RBM with 10 hidden units on binarised MNIST, trained by exact maximum likelihood, SAP and Trans-SAP
on the same schedule (presets exactml_rbm10_toy, sap_rbm10_toy, transsap_rbm10_toy): minibatches of
100, 100 particles, 100,000 updates, rate 0.01 for 10,000 updates then 10 / (1000 + t), tempered
transitions (50 betas from 0.9 to 1, every 200 updates) in the last 50,000 updates. With 2^10 hidden
states log Z is exact, so the loop logs the exact training log-likelihood (``train/log_p_exact`` on
10,000 training images, at every validation); this script prints it at every tenth of the run, the
exact test log p of the best checkpoint (by ``val/log_p_exact``) and the mean acceptance rate of the
tempered-transitions runs (paper: about 0.8), and draws the curves (x-axis: parameter updates; the
paper's counts Gibbs steps, see the presets).

``--steps N`` scales the schedule by f = N / 100,000, keeping its shape: the constant-rate phase
(t0) and the start of tempered transitions scale with N, the decay a / (b + t) becomes
a f / (b f + t) (the rate at every fraction of the run is the paper's), validation, logging and
checkpoints scale too, and the runs stay 200 updates apart unless that would leave fewer than ten of
them (then window / 10). A row trains in ``<out>/<row>/`` and a rerun continues from
``checkpoints/last.pt``; the resumed config must match, so a different ``--steps`` needs another
``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (puts the repository root on sys.path)
from hydra import compose, initialize_config_dir  # noqa: E402
import torch  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

import nvil.app.main as train  # noqa: E402

# row -> (preset, label, matplotlib style)
ROWS = {
    "exact_ml": ("exactml_rbm10_toy", "exact ML", {"color": "black"}),
    "sap": ("sap_rbm10_toy", "SAP", {"color": "tab:blue"}),
    "trans_sap": ("transsap_rbm10_toy", "Trans-SAP", {"color": "tab:red"}),
}
PAPER_TT_ACCEPT = 0.8
PLOT_NAME = "transsap_toy_curves.png"
NOT_RUN = common.NOT_RUN
TRAIN_TAG, VAL_TAG = "train/log_p_exact", "val/log_p_exact"


# ---- configs --------------------------------------------------------------------------------------

def compose_cfg(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(common.CONFIG_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


def scaled_overrides(preset: DictConfig, steps: int, reference: int) -> list[str]:
    """Overrides that run ``preset``'s schedule scaled by f = steps / reference (``reference``: the paper's length
    of the SAP rows), keeping its shape (see the module docstring): the preset's max_steps becomes f times its own
    (a Trans-SAP row at equal Gibbs steps stays shorter than SAP's). Empty when f = 1."""
    if steps == reference:
        return []
    f = steps / reference
    t, sch = preset.trainer, preset.learner.schedule

    def scale(n: int) -> int:
        return max(1, round(n * f))

    out = [f"trainer.max_steps={scale(int(t.max_steps))}", f"trainer.val_every={scale(t.val_every)}",
           f"trainer.ckpt_every={scale(t.ckpt_every)}", f"trainer.sample_every={scale(t.sample_every)}",
           f"trainer.log_every={max(1, min(t.log_every, scale(t.log_every)))}"]
    if sch.get("t0") is not None:
        out += [f"learner.schedule.t0={scale(sch.t0)}", f"learner.schedule.a={float(sch.a) * f!r}",
                f"learner.schedule.b={float(sch.b) * f!r}"]
    tt = preset.learner.get("tt")
    if tt is not None:
        length = scale(int(t.max_steps))
        start = min(length - 1, round(int(tt.start_step) * f))
        every = max(1, min(int(tt.every), (length - start) // 10))
        out += [f"learner.tt.start_step={start}", f"learner.tt.every={every}"]
    return out


def row_cfg(base: list[str], run_dir: Path, args: argparse.Namespace) -> DictConfig:
    """The preset (``base``: ``experiment=...`` and any model overrides), scaled to ``args.steps``, on
    ``args.device``, quiet, with ``--tt-betas`` on Trans-SAP rows, resuming when ``run_dir`` holds a run;
    ``--extra-override`` last."""
    preset = compose_cfg(base)
    overrides = [*base, *scaled_overrides(preset, args.steps, args.reference_steps), f"trainer.device={args.device}",
                 "trainer.progress=false", "print_config=false"]
    if args.tt_betas is not None and "tt" in preset.learner:
        overrides.append(f"learner.tt.num_betas={args.tt_betas}")
    overrides += args.extra_override
    if (run_dir / "checkpoints" / "last.pt").exists():
        overrides.append("trainer.resume=true")
    return compose_cfg(overrides)


def train_row(cfg: DictConfig, run_dir: Path) -> dict:
    """``nvil.app.main.train`` in ``run_dir``: {cfg, metrics (with final_eval when enabled), seconds}."""
    started = time.perf_counter()
    metrics = train.train(cfg, run_dir)
    return {"cfg": cfg, "metrics": metrics, "seconds": time.perf_counter() - started}


# ---- metrics.jsonl --------------------------------------------------------------------------------

def read_log(run_dir: Path, cfg: DictConfig, score_tag: str) -> dict:
    """From ``metrics.jsonl``: ``curve`` {step: {tag: value}} of the validation entries (those holding
    ``score_tag``; a resumed run may log a step twice, the last wins), ``tt_accept`` the acceptance rate of
    each logged tempered-transitions run (each run counted once, however many log steps report it), and
    ``gibbs_sweeps`` (the last logged count, or None)."""
    curve: dict[int, dict] = {}
    runs: dict[int, float] = {}
    sweeps = None
    tt = cfg.learner.get("tt")
    path = Path(run_dir) / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        if not line.strip():
            continue
        entry = json.loads(line)
        step = int(entry["step"])
        if score_tag in entry:
            curve[step] = entry
        if "mcmc/gibbs_sweeps" in entry:
            sweeps = int(entry["mcmc/gibbs_sweeps"])
        if tt is not None and "mcmc/tt_accept_rate" in entry:
            # the last run before this step happened at update u (the learner's clock: step - 1 at most)
            u = (step - 1) // int(tt.every) * int(tt.every)
            if u >= int(tt.start_step):
                runs.setdefault(u, float(entry["mcmc/tt_accept_rate"]))
    return {"curve": curve, "tt_accept": list(runs.values()), "gibbs_sweeps": sweeps}


def value_at(curve: dict[int, dict], step: int, tag: str) -> float | None:
    """``tag`` at the last validation at or before ``step``."""
    steps = [s for s in curve if s <= step and tag in curve[s]]
    return curve[max(steps)][tag] if steps else None


def marks(steps: int, n: int = 10) -> list[int]:
    return [round(steps * i / n) for i in range(1, n + 1)]


def fmt(value: float | None, missing: str = NOT_RUN, digits: int = 2) -> str:
    return missing if value is None else f"{value:.{digits}f}"


def mean_accept(rates: list[float]) -> float | None:
    return sum(rates) / len(rates) if rates else None


# ---- tables -----------------------------------------------------------------------------------------

def curve_table(logs: dict, rows: list[str], steps: int) -> str:
    head = ["updates", *(f"{ROWS[r][1]} train log p" for r in rows)]
    body = [[f"{m:,}", *(fmt(value_at(logs[r]["curve"], m, TRAIN_TAG)) if r in logs else NOT_RUN for r in rows)]
            for m in marks(steps)]
    return common.markdown_table(head, body)


def summary_table(results: dict, logs: dict, rows: list[str]) -> str:
    head = ["row", "final train log p", "best val log p", "test log p (exact) ± se", "TT accept (paper ~0.8)",
            "TT runs", "updates", "Gibbs sweeps", "updates/s", "wall s"]
    body = []
    for r in rows:
        res, log = results.get(r), logs.get(r)
        if res is None or log is None:
            body.append([ROWS[r][1], *[NOT_RUN] * (len(head) - 1)])
            continue
        m = res["metrics"]
        fe = m.get("final_eval")
        test = f"{fe['mean_log_p']:.2f} ± {fe['stderr']:.2f}" if fe else NOT_RUN
        final = value_at(log["curve"], m["step"], TRAIN_TAG)
        tt = "tt" in res["cfg"].learner
        accept = fmt(mean_accept(log["tt_accept"]), "— (no run logged)", 3) if tt else "—"
        rate = f"{m['steps_per_second']:.1f}" if m["steps_per_second"] > 0 else "— (no new updates)"
        body.append([ROWS[r][1], fmt(final), fmt(m["val/best"] if m["best_step"] >= 0 else None), test, accept,
                     str(len(log["tt_accept"])) if tt else "—", str(m["step"]),
                     "—" if log["gibbs_sweeps"] is None else f"{log['gibbs_sweeps']:,}", rate, f"{res['seconds']:.0f}"])
    return common.markdown_table(head, body)


# ---- the plot ---------------------------------------------------------------------------------------

def plot(curves: list[tuple[str, dict, dict]], tt_start: int | None, path: Path, title: str, tag: str,
         ylabel: str) -> None:
    """Draw ``tag`` against updates for ``(label, log, style)``; a dotted line where tempered transitions start."""
    points = []
    for label, log, style in curves:
        steps = sorted(s for s in log["curve"] if tag in log["curve"][s])
        points.append((label, steps, [log["curve"][s][tag] for s in steps], {"markersize": 2, **style}))
    vline = (tt_start, "tempered transitions from here") if tt_start is not None else None
    common.plot(points, Path(path), title, ylabel=ylabel, vline=vline)


# ---- command line -----------------------------------------------------------------------------------

def add_args(p: argparse.ArgumentParser, *, default_steps: int, default_out: Path, rows) -> None:
    p.add_argument("--rows", default=",".join(rows), help=f"comma list of rows (default: all): {', '.join(rows)}")
    p.add_argument("--steps", type=int, default=default_steps,
                   help=f"parameter updates of the SAP rows; the schedule scales with it (default {default_steps:,}, the "
                        "paper's; a Trans-SAP row at equal Gibbs steps makes proportionally fewer)")
    p.set_defaults(reference_steps=default_steps)
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    p.add_argument("--out", default=str(default_out),
                   help=f"directory of the run directories, one per row (default {common.rel(default_out)})")
    p.add_argument("--plot", default=None, help="PNG of the curves (default: <out>/<name>.png)")
    p.add_argument("--tt-betas", type=int, default=None,
                   help="betas per tempered-transitions run on Trans-SAP rows (default: the preset's); for smoke tests")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's); 1 is much faster on a busy machine with few cores")
    p.add_argument("--extra-override", action="append", default=[], help="Hydra override for every row (repeatable)")


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace, rows, plot_name: str) -> None:
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in args.rows if r not in rows]
    if unknown:
        p.error(f"unknown rows {', '.join(unknown)}; known: {', '.join(rows)}")
    if not args.rows:
        p.error("--rows names no row")
    if args.steps < 10:
        p.error("--steps must be at least 10")
    if args.tt_betas is not None and args.tt_betas < 2:
        p.error("--tt-betas must be at least 2")
    if args.threads is not None:
        if args.threads < 1:
            p.error("--threads must be positive")
        torch.set_num_threads(args.threads)
    args.out = Path(args.out)
    args.plot = Path(args.plot) if args.plot else args.out / plot_name


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    add_args(p, default_steps=100_000, default_out=common.ROOT / "bench" / "out" / "transsap_toy", rows=ROWS)
    args = p.parse_args(argv)
    check_args(p, args, ROWS, PLOT_NAME)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    results, logs, tt_start = {}, {}, None
    for row in args.rows:
        preset, label, _ = ROWS[row]
        run_dir = args.out / row
        print(f"== {row} ({preset})", flush=True)
        try:
            cfg = row_cfg([f"experiment={preset}"], run_dir, args)
            results[row] = train_row(cfg, run_dir)
        except common.UserError as e:
            print(f"error: {row}: {e}", file=sys.stderr, flush=True)
            continue
        logs[row] = read_log(run_dir, cfg, VAL_TAG)
        if "tt" in cfg.learner:
            tt_start = int(cfg.learner.tt.start_step)
    plot([(ROWS[r][1], logs[r], ROWS[r][2]) for r in args.rows if r in logs], tt_start, args.plot,
         "Toy RBM, 10 hidden units, binarised MNIST (cf. Salakhutdinov 2009, Fig. 1 top)", TRAIN_TAG,
         "exact training log-probability (nats)")
    print()
    print(f"Exact training log p (mean over 10,000 training images) at each tenth of {args.steps:,} updates:")
    print(curve_table(logs, args.rows, args.steps))
    print()
    print(summary_table(results, logs, args.rows))


if __name__ == "__main__":
    main()
