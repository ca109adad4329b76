"""A run's validation curve, a fitted power law and the budget it extrapolates to: the "fitted extrapolation" of a
reproduction row that has not reached the paper in the budget spent (docs/reproductions.md).

    python bench/extrapolate.py /work/runs/nvil_fdarn200 --target 92.5
    python bench/extrapolate.py /work/runs/ws_sbn200 --target 120.8 --window 100000 --from 200000

Reads the run's ``metrics.jsonl`` (``--tag``, default ``val/elbo``, negated: nats), averages it over windows of
``--window`` updates from update ``--from`` on, and fits loss(t) = a + b t^-c by least squares (c on a grid, a and b
in closed form at each c). Prints the window means, the fit with its residual, the fitted loss at the budgets of
``--at`` and the number of updates at which the fit reaches ``--target`` (never, when the fitted floor a lies above
it). A power law fitted to part of a curve is a guide to the budget, not a result: the table says so.

    python bench/extrapolate.py --points 1340000:129.80,2450000:127.28,3530000:126.09,4690000:125.23 --target 120.8

``--points`` fits the same law to given (update, nats) pairs instead of a run's curve: the test-set figures of a run's
checkpoints (``evaluate.py ... estimator=elbo estimator.num_samples=10`` on the 10,000 test images, the row's own
measure). The NVIL presets validate on 100 held-out images (the paper's protocol), a curve too noisy to tell a
plateau from progress of a few tenths of a nat per million updates: row 4's validation windows stayed at 127.7 from
3.4M to 4.7M updates while its test figure improved from 126.09 to 125.23 (docs/reproductions.md, note 1.2).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def read_curve(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(update, -value) of every ``tag`` row of the run's metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"error: no metrics.jsonl in {run_dir}")
    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    curve = sorted({r["step"]: -float(r[tag]) for r in rows if tag in r}.items())
    if not curve:
        raise SystemExit(f"error: {path} has no {tag!r} rows")
    return curve


def window_means(curve: list[tuple[int, float]], window: int, start: int) -> list[tuple[float, float]]:
    """(mean update, mean loss) of the rows in each window [start + k window, start + (k + 1) window)."""
    bins: dict[int, list[tuple[int, float]]] = {}
    for t, v in curve:
        if t >= start:
            bins.setdefault((t - start) // window, []).append((t, v))
    return [(sum(t for t, _ in b) / len(b), sum(v for _, v in b) / len(b)) for _, b in sorted(bins.items())]


def fit_power_law(points: list[tuple[float, float]]) -> tuple[float, float, float, float]:
    """(a, b, c, residual sum of squares) of loss = a + b t^-c, c on a grid of 0.01 .. 2."""
    best = None
    for k in range(1, 201):
        c = k / 100
        xs = [t ** -c for t, _ in points]
        ys = [v for _, v in points]
        n, sx, sy = len(xs), sum(xs), sum(ys)
        sxx, sxy = sum(x * x for x in xs), sum(x * y for x, y in zip(xs, ys))
        det = n * sxx - sx * sx
        if det <= 0:
            continue
        b = (n * sxy - sx * sy) / det
        a = (sy - b * sx) / n
        rss = sum((a + b * x - y) ** 2 for x, y in zip(xs, ys))
        if best is None or rss < best[3]:
            best = (a, b, c, rss)
    if best is None:
        raise SystemExit("error: too few windows to fit (lower --window or --from)")
    return best


def updates_to_reach(a: float, b: float, c: float, target: float) -> float:
    """t at which a + b t^-c = target (inf when the floor a is at or above the target)."""
    if b <= 0 or target <= a:
        return math.inf
    return ((target - a) / b) ** (-1 / c)


def parse_points(text: str) -> list[tuple[float, float]]:
    """``update:nats,update:nats,...`` as [(update, nats)] in update order (SystemExit on a malformed pair)."""
    points = []
    for pair in (s for s in text.split(",") if s.strip()):
        try:
            t, v = pair.split(":")
            points.append((float(t), float(v)))
        except ValueError:
            raise SystemExit(f"error: --points takes update:nats pairs separated by commas, got {pair!r}") from None
        if points[-1][0] <= 0:
            raise SystemExit(f"error: --points needs positive updates, got {pair!r}")
    return sorted(points)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path, nargs="?", help="a run directory (its metrics.jsonl); or give --points")
    p.add_argument("--points", default=None, help="update:nats pairs to fit instead of a run's curve (test-set "
                   "figures of checkpoints)")
    p.add_argument("--tag", default="val/elbo", help="the metric to fit (negated), default val/elbo")
    p.add_argument("--window", type=int, default=100_000, help="updates per averaged window (default 100,000)")
    p.add_argument("--from", dest="start", type=int, default=100_000, help="first update fitted (default 100,000)")
    p.add_argument("--target", type=float, default=None, help="the paper's figure, in the same nats")
    p.add_argument("--at", default="3000000,5000000,10000000,30000000", help="budgets to print the fit at")
    args = p.parse_args(argv)
    if args.window < 1 or args.start < 0:
        p.error("--window must be positive and --from not negative")
    if (args.run_dir is None) == (args.points is None):
        p.error("give a run directory or --points, not both")
    if args.points is not None:
        points = parse_points(args.points)
        if len(points) < 3:
            raise SystemExit(f"error: {len(points)} points given; the fit needs at least 3")
        print(f"{len(points)} given points (update, nats)\n")
        label = "updates"
    else:
        curve = read_curve(args.run_dir, args.tag)
        points = window_means(curve, args.window, args.start)
        if len(points) < 3:
            raise SystemExit(f"error: {len(points)} windows from update {args.start:,}; the fit needs at least 3")
        print(f"{args.run_dir}: {args.tag} (negated) over {len(curve)} rows, last at update {curve[-1][0]:,}: "
              f"{curve[-1][1]:.2f}\n")
        label = "updates (window mean)"
    a, b, c, rss = fit_power_law(points)
    print(f"| {label} | " + " | ".join(f"{t / 1e6:.2f}M" for t, _ in points) + " |")
    print("|---|" + "---|" * len(points))
    print("| loss | " + " | ".join(f"{v:.2f}" for _, v in points) + " |\n")
    print(f"fit: loss(t) = {a:.2f} + {b:.4g} t^-{c:.2f}, residual sum of squares {rss:.3f} nat^2 over "
          f"{len(points)} points (a power law fitted to part of a curve: a guide to the budget, not a result)")
    for t in (int(s) for s in args.at.split(",") if s.strip()):
        print(f"  at {t:>12,} updates: {a + b * t ** -c:.2f}")
    if args.target is not None:
        need = updates_to_reach(a, b, c, args.target)
        reach = "never (the fitted floor is above it)" if math.isinf(need) else f"{need:,.0f} updates"
        print(f"  reaches {args.target}: {reach}")


if __name__ == "__main__":
    main()
