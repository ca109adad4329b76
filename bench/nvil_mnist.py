"""NVIL on binarised MNIST: Table 1 rows SBN-200 and SBN-200-200-200 of Mnih & Gregor (2014), and the
Fig. 1 ablation (variance-reduction techniques switched off). A benchmark, not run by CI.

    pip install -e '.[bench]'
    python bench/nvil_mnist.py                                    # all rows, 100,000 updates each
    python bench/nvil_mnist.py --rows sbn200,sbn200x3 --steps 3000000 --device cuda
    python bench/nvil_mnist.py --rows sbn200,sbn200_no_vr --steps 300 --test-examples 200 \
        --iwae-k 50 --device cpu --out /tmp/bench_smoke          # a smoke test of a minute or two

Each row trains in ``<out>/<row>/`` (``--out``, default ``bench/out``) through ``train.train``; a rerun
continues from ``checkpoints/last.pt`` (``trainer.resume=true``), so raising ``--steps`` extends the runs.
The best checkpoint (by validation bound) is then scored on the test split with the paper's measure,
-ELBO averaged over 10 samples from q, and with the importance-sampled bound -L_K. Updates/s and wall
seconds cover the training done by this invocation only. The validation curves are plotted against
updates, as in Fig. 1. Every row of Tables 1 and 2 (wake-sleep, fDARN, autoregressive q): nvil_tables.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

# row -> (overrides, layers label, the paper's test -ELBO for NVIL in nats or None)
ROWS = {
    "sbn200": (["experiment=nvil_sbn200"], "200", 113.1),
    "sbn200x3": (["experiment=nvil_sbn200x3"], "200-200-200", 96.7),
    "sbn200_no_input_baseline": (["experiment=nvil_sbn200", "learner.input_baseline=false"], "200", None),
    "sbn200_no_vr": (["experiment=nvil_sbn200", "learner.input_baseline=false", "learner.constant_baseline=false",
                      "learner.variance_normalisation=false"], "200", None),
    "sbn200x3_no_layerwise": (["experiment=nvil_sbn200x3", "learner.layerwise=false"], "200-200-200", None),
}

PLOT_NAME = "nvil_curves.png"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma list of rows (default: all): {', '.join(ROWS)}")
    common.add_common_args(p, default_out=common.ROOT / "bench" / "out", plot_name=PLOT_NAME)
    args = p.parse_args(argv)
    common.parse_rows(p, args, ROWS)
    args.plot = common.plot_path(args, PLOT_NAME)
    return args


def table(results: dict, args: argparse.Namespace) -> str:
    head = ["row", "layers", "paper NVIL -ELBO", *common.bound_head(args.iwae_k), *common.MEASURED_HEAD]
    rows = []
    for row, (_, layers, paper) in ROWS.items():
        r = results.get(row)
        if r is not None:
            layers = common.layers_label(r["cfg"])
        rows.append([row, layers, common.fmt_paper(paper), *common.measured_cells(r, paper)])
    return common.markdown_table(head, rows)


def main(argv=None) -> None:
    args = parse_args(argv)
    results = {}
    for row in args.rows:
        print(f"== {row}", flush=True)
        try:
            results[row] = common.run_row(ROWS[row][0], args.out / row, args)
        except common.UserError as e:
            print(f"error: {row}: {e}", file=sys.stderr, flush=True)
    common.plot_val_curves([(row, args.out / row, {}) for row in args.rows], args.plot,
                "NVIL on binarised MNIST (cf. Mnih & Gregor 2014, Fig. 1)")
    print()
    print(table(results, args))


if __name__ == "__main__":
    main()
