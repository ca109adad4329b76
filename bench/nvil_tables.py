"""Every row of Tables 1 and 2 of Mnih & Gregor (2014) on binarised MNIST: SBN and fDARN models trained
with NVIL and with wake-sleep (Table 1), and NVIL with autoregressive inference networks (Table 2).
A benchmark, not run by CI.

    pip install -e '.[bench]'
    python bench/nvil_tables.py                         # the default rows (below), 100,000 updates each
    python bench/nvil_tables.py --rows all --steps 3000000 --device cuda          # the full tables
    python bench/nvil_tables.py --rows nvil_sbn200,ws_sbn200 --plot sbn200.png    # NVIL vs wake-sleep
    python bench/nvil_tables.py --rows nvil_sbn200,ws_sbn200,nvil_fdarn200,nvil_sbn200_ar --steps 200 \
        --test-examples 100 --iwae-k 20 --device cpu --out /tmp/bench_smoke       # a smoke test

A row is a preset, ``configs/experiment/<row>.yaml``, and is named after it; ``--rows`` takes a comma
list of them, or ``all``. The default, ``nvil_sbn200,ws_sbn200,nvil_fdarn200,nvil_sbn200_ar``, has one
row of each kind: NVIL and wake-sleep on the same SBN, an fDARN, an autoregressive inference network.
Each row trains in ``<out>/<row>/`` (``--out``, default ``bench/out/tables``) through ``train.train``;
a rerun continues from ``checkpoints/last.pt``, so raising ``--steps`` extends the runs. The best
checkpoint (by validation bound) is scored on the test split with the paper's measure, -ELBO averaged
over 10 samples from q, and with the importance-sampled bound -L_K (``--iwae-k``). Updates/s and wall
seconds cover the training done by this invocation only; rows not trained by it read "not run". The
plot overlays the validation bound against updates: one colour per model, NVIL solid, wake-sleep
dashed, autoregressive q dotted.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

# The paper's tables, as (heading, {preset: test -ELBO in nats}). Each preset's comment line states the
# same figure; main() warns if the two disagree.
GROUPS = [
    ("Table 1, NVIL", {
        "nvil_sbn200": 113.1, "nvil_sbn500": 112.8, "nvil_sbn200x2": 99.8, "nvil_sbn200x3": 96.7,
        "nvil_sbn200_200_500": 97.0, "nvil_fdarn200": 92.5, "nvil_fdarn500": 90.7}),
    ("Table 1, wake-sleep", {
        "ws_sbn200": 120.8, "ws_sbn500": 121.4, "ws_sbn200x2": 107.7, "ws_sbn200x3": 102.2,
        "ws_sbn200_200_500": 102.3, "ws_fdarn200": 95.9, "ws_fdarn500": 97.2}),
    ("Table 2, NVIL with autoregressive inference networks", {
        "nvil_sbn200_ar": 103.8, "nvil_sbn500_ar": 104.4, "nvil_sbn200x3_ar": 94.5,
        "nvil_sbn200_200_500_ar": 96.0}),
]
PAPER = {row: value for _, rows in GROUPS for row, value in rows.items()}
DEFAULT_ROWS = ["nvil_sbn200", "ws_sbn200", "nvil_fdarn200", "nvil_sbn200_ar"]
PAPER_FIGURE = re.compile(r"test -ELBO ([0-9.]+) nats")

PLOT_NAME = "nvil_tables_curves.png"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                   help=f"comma list of rows, or 'all' (default: {','.join(DEFAULT_ROWS)}); "
                        f"known: {', '.join(PAPER)}")
    common.add_common_args(p, default_out=common.ROOT / "bench" / "out" / "tables",
                           plot_name=PLOT_NAME)
    args = p.parse_args(argv)
    if args.rows.strip() == "all":
        args.rows = ",".join(PAPER)
    common.parse_rows(p, args, PAPER)
    args.plot = common.plot_path(args, PLOT_NAME)
    return args


def check_presets() -> None:
    """Warn where a preset is missing or its comment states a figure other than PAPER's."""
    for row, value in PAPER.items():
        path = common.CONFIG_DIR / "experiment" / f"{row}.yaml"
        if not path.exists():
            print(f"warning: no preset {common.rel(path)}", file=sys.stderr)
            continue
        found = PAPER_FIGURE.search(path.read_text())
        if found is None or abs(float(found.group(1)) - value) > 1e-9:
            stated = found.group(1) if found else "no figure"
            print(f"warning: {common.rel(path)} states {stated}, the table here {value}", file=sys.stderr)


def labels(row: str, result: dict | None) -> tuple[str, str]:
    """(model, learner) of a row: from its run's config, else from composing the preset."""
    cfg = result["cfg"] if result is not None else None
    if cfg is None:
        try:
            with common.initialize_config_dir(config_dir=str(common.CONFIG_DIR), version_base="1.3"):
                cfg = common.compose(config_name="train", overrides=[f"experiment={row}"])
        except Exception as e:  # a broken preset must not cost the table
            print(f"warning: cannot compose experiment={row}: {str(e).splitlines()[0]}", file=sys.stderr)
            return "?", "?"
    return common.model_label(cfg), common.learner_label(cfg)


def tables(results: dict, failed: set, args: argparse.Namespace) -> str:
    head = ["row", "model", "learner", "paper -ELBO", *common.bound_head(args.iwae_k), *common.MEASURED_HEAD]
    parts = []
    for heading, rows in GROUPS:
        cells = []
        for row, paper in rows.items():
            r = results.get(row)
            missing = "failed" if row in failed else common.NOT_RUN
            cells.append([row, *labels(row, r), common.fmt_paper(paper), *common.measured_cells(r, paper, missing)])
        parts.append(f"**{heading}**\n\n" + common.markdown_table(head, cells))
    return "\n\n".join(parts)


def curve_style(row: str, colours: dict) -> dict:
    """One colour per model (``nvil_sbn200``, ``ws_sbn200`` and ``nvil_sbn200_ar`` share one); the line
    style tells the learner: NVIL solid, wake-sleep dashed, NVIL with autoregressive q dotted."""
    model = row.split("_", 1)[1].removesuffix("_ar")
    colour = colours.setdefault(model, f"C{len(colours) % 10}")
    dash = "--" if row.startswith("ws_") else ":" if row.endswith("_ar") else "-"
    return {"color": colour, "linestyle": dash}


def main(argv=None) -> None:
    args = parse_args(argv)
    check_presets()
    results, failed = {}, set()
    for row in args.rows:
        print(f"== {row}", flush=True)
        try:
            results[row] = common.run_row([f"experiment={row}"], args.out / row, args)
        except common.UserError as e:
            failed.add(row)
            print(f"error: {row}: {e}", file=sys.stderr, flush=True)
    colours: dict = {}
    common.plot_val_curves([(row, args.out / row, curve_style(row, colours)) for row in args.rows], args.plot,
                "NVIL vs wake-sleep on binarised MNIST (cf. Mnih & Gregor 2014, Tables 1-2)")
    print()
    print(tables(results, failed, args))


if __name__ == "__main__":
    main()
