"""The paper's comparison on the toy RBM, over seeds: how closely SAP and Trans-SAP track exact maximum likelihood at
equal Gibbs steps (Salakhutdinov 2009, Fig. 1 top). Reads the run directories ``bench/transsap_toy.py`` wrote.

    for seed in 0 1 2; do
      python bench/transsap_toy.py --device cpu --threads 1 --out runs/tt_toy/seed$seed --extra-override seed=$seed
    done
    python bench/transsap_toy_compare.py runs/tt_toy/seed0 runs/tt_toy/seed1 runs/tt_toy/seed2

The paper's x-axis counts Gibbs steps: SAP makes one per update, Trans-SAP one per update plus those of its tempered
transitions runs (``mcmc/gibbs_sweeps`` in its log), exact ML none (its x is its update count, the same schedule).
Each row's exact training log p (``train/log_p_exact``, logged at every validation) is interpolated linearly in
Gibbs steps onto a common grid (every ``--every`` steps of the window, default the tempered-transitions phase, the
last 50,000 of 100,000), and averaged over the window. Printed per seed and as mean ± SE over seeds: each row's
window mean, its gap to exact ML (row - exact ML, paired within the seed) and Trans-SAP - SAP. The paper's claim
is that Trans-SAP's gap is the smaller one: with both rows below exact ML, that Trans-SAP - SAP > 0, which needs no
exact ML run (a seed without a complete ``exact_ml/`` run gives only that column; ``--rows sap,trans_sap`` makes one).
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (puts the repository root on sys.path)
import torch  # noqa: E402

from nvil.core.ops import mean_and_stderr  # noqa: E402

TAG = "train/log_p_exact"


def curve_in_gibbs_steps(run_dir: Path) -> list[tuple[float, float]]:
    """[(Gibbs steps, train log p)] of one row: updates plus the extra sweeps (``mcmc/gibbs_sweeps`` - update, at
    the last log at or before each validation) that tempered transitions made; updates alone for SAP and exact ML."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise SystemExit(f"error: {path} not found (run bench/transsap_toy.py first)")
    sweeps_at, points = {}, {}
    for line in path.read_text().splitlines():
        if line.strip():
            e = json.loads(line)
            if "mcmc/gibbs_sweeps" in e:
                sweeps_at[int(e["step"])] = int(e["mcmc/gibbs_sweeps"])
            if TAG in e:
                points[int(e["step"])] = float(e[TAG])  # a resumed run may log a step twice: the last wins
    logged = sorted(sweeps_at)
    out = []
    for step in sorted(points):
        i = bisect.bisect_right(logged, step)  # the last log at or before this validation
        # the TT sweeps made so far; exact ML logs 0 sweeps, and its x is its update count
        extra = max(0, sweeps_at[logged[i - 1]] - logged[i - 1]) if i else 0
        out.append((float(step + extra), points[step]))
    return out


def interpolate(curve: list[tuple[float, float]], x: float) -> float | None:
    """The curve's value at x by linear interpolation; None outside its range."""
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None


def window_means(seed_dir: Path, grid: list[float]) -> dict[str, float]:
    """Each row's mean train log p over the grid points SAP and Trans-SAP both cover; exact ML's only where it
    was run and covers all of them (a run stopped early is left out)."""
    values = {r: [interpolate(curve_in_gibbs_steps(seed_dir / r), x) for x in grid] for r in ("sap", "trans_sap")}
    keep = [i for i in range(len(grid)) if all(v[i] is not None for v in values.values())]
    if not keep:
        raise SystemExit(f"error: {seed_dir}: the SAP and Trans-SAP curves share no point of the window")
    if (seed_dir / "exact_ml").exists():
        ml = [interpolate(curve_in_gibbs_steps(seed_dir / "exact_ml"), grid[i]) for i in keep]
        if all(v is not None for v in ml):
            values["exact_ml"] = {i: v for i, v in zip(keep, ml)}
    return {r: sum(v[i] for i in keep) / len(keep) for r, v in values.items()} | {"points": len(keep)}


def mean_se(xs: list[float]) -> str:
    if not xs:
        return "—"
    m, se = mean_and_stderr(torch.tensor(xs))
    return f"{m:.3f} ± {se:.3f}" if len(xs) > 1 else f"{m:.3f}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("seed_dirs", nargs="+", type=Path, help="one --out directory of bench/transsap_toy.py per seed")
    p.add_argument("--start", type=int, default=50_000, help="first Gibbs step of the window (default 50,000)")
    p.add_argument("--end", type=int, default=100_000, help="last Gibbs step of the window (default 100,000)")
    p.add_argument("--every", type=int, default=1_000, help="grid spacing in Gibbs steps (default 1,000)")
    args = p.parse_args(argv)
    if not 0 <= args.start < args.end or args.every < 1:
        p.error("need 0 <= --start < --end and --every >= 1")
    grid = [float(x) for x in range(args.start, args.end + 1, args.every)]
    rows, gaps = [], {"sap": [], "trans_sap": [], "diff": []}
    for d in args.seed_dirs:
        m = window_means(d, grid)
        diff = m["trans_sap"] - m["sap"]
        gaps["diff"].append(diff)
        ml_cells = ["not complete", "—", "—"]
        if "exact_ml" in m:
            g_sap, g_tt = m["sap"] - m["exact_ml"], m["trans_sap"] - m["exact_ml"]
            gaps["sap"].append(g_sap), gaps["trans_sap"].append(g_tt)
            ml_cells = [f"{m['exact_ml']:.3f}", f"{g_sap:.3f}", f"{g_tt:.3f}"]
        rows.append([common.rel(d), ml_cells[0], f"{m['sap']:.3f}", f"{m['trans_sap']:.3f}", *ml_cells[1:],
                     f"{diff:+.3f}", str(m["points"])])
    rows.append([f"mean ± SE ({len(gaps['sap'])} seeds with exact ML; {len(gaps['diff'])} in all)", "", "", "",
                 mean_se(gaps["sap"]), mean_se(gaps["trans_sap"]), mean_se(gaps["diff"]), ""])
    print(f"Exact training log p averaged over Gibbs steps {args.start:,}-{args.end:,} (nats; gaps paired per seed):")
    print(common.markdown_table(["seed dir", "exact ML", "SAP", "Trans-SAP", "SAP - ML", "Trans-SAP - ML",
                                 "Trans-SAP - SAP", "grid points"], rows))


if __name__ == "__main__":
    main()
