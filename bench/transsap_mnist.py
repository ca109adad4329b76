"""SAP against Trans-SAP on a 500-hidden-unit (semi-)RBM of MNIST images and labels: the bottom panel of
Fig. 1 and the test log-probabilities of Salakhutdinov (2009), Sec. 4.1. A benchmark, not run by CI.

    pip install -e '.[bench]'
    python bench/transsap_mnist.py                          # semi-RBM 500, both rows, 200,000 Gibbs steps each
    python bench/transsap_mnist.py --model rbm --device cuda
    python bench/transsap_mnist.py --model srbm --hidden 20 --steps 200 --threads 1 --device cpu \
        --tt-betas 10 --out /tmp/bench_smoke_tt                 # a smoke test

The rows are the presets sap_srbm500 and transsap_srbm500 (``--model rbm`` swaps in an RBM, ``--hidden``
the number of hidden units; labels are always modelled): minibatches of 100, 100 particles, 200,000
Gibbs steps, rate 0.05 for 50,000 updates then 100 / (2000 + t); SAP makes 200,000 updates, Trans-SAP
150,000 and one run of 500 betas (0.9 to 1, ~1,000 sweeps) after every 1,000 from update 100,000 (paper:
acceptance about 0.7; the paper compares at equal Gibbs steps, its footnote 4). ``--steps`` scales
the schedule as in transsap_toy.py. log Z cannot be enumerated, so training is followed by the
stochastic pseudo-likelihood on the validation set (plotted), and the final parameters
(``checkpoints/last.pt``) are scored on the test set by

- classification error, with ``estimator=classify`` when the estimator registry has it;
- test log-probability: log Z by certified AIS (``estimator=ais``: adaptive ladder, reverse AIS, hard lower bound;
  ``--ais-betas``), the table says whether the certificate held. Paper (AIS): SAP -87.12, Trans-SAP -85.91 nats.

A row trains in ``<out>/<model><hidden>_<row>/`` and a rerun continues from ``checkpoints/last.pt``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (puts the repository root on sys.path)
import transsap_toy as tt  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from nvil import estimators  # noqa: E402
from nvil.app.evaluation import EvalSpec, evaluate_checkpoint  # noqa: E402

# row -> (preset, label, paper test log-probability by AIS, paper TT acceptance, matplotlib style)
ROWS = {
    "sap": ("sap_srbm500", "SAP", -87.12, None, {"color": "tab:blue"}),
    "trans_sap": ("transsap_srbm500", "Trans-SAP", -85.91, 0.7, {"color": "tab:red"}),
}
# The paper's Fig. 1 (bottom) gives classification only as a curve; the text says "about 98%" for Trans-SAP.
PAPER_ERROR = {"sap": "— (Fig. 1 curve only)", "trans_sap": "about 2 (Fig. 1)"}
VAL_HEADS = {"val/pseudo_log_likelihood": "final val PLL (stochastic)", "val/log_p_exact": "final val log p (exact)"}
NO_CLASSIFY = "not run (classify estimator unavailable)"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    tt.add_args(p, default_steps=200_000, default_out=common.ROOT / "bench" / "out" / "transsap_mnist", rows=ROWS)
    p.add_argument("--model", choices=("srbm", "rbm"), default="srbm", help="semi-RBM (the paper's) or RBM")
    p.add_argument("--hidden", type=int, default=500, help="hidden units (default 500, the paper's)")
    p.add_argument("--test-examples", type=int, default=None, help="test images to classify and score (default: all 10000)")
    p.add_argument("--ais-betas", type=int, default=None, help="AIS temperatures for log Z (default: estimator=ais's)")
    args = p.parse_args(argv)
    tt.check_args(p, args, ROWS, f"transsap_mnist_{args.model}{args.hidden}.png")
    if args.hidden < 1 or (args.test_examples is not None and args.test_examples < 1):
        p.error("--hidden and --test-examples must be positive")
    return args


# ---- classification ---------------------------------------------------------------------------------

def classify_cfg():
    path = common.CONFIG_DIR / "estimator" / "classify.yaml"
    return OmegaConf.load(path) if path.is_file() else OmegaConf.create({"name": "classify"})


def error_percent(summary: dict) -> str:
    """``error % ± se`` from a classify result's summary (``error_rate`` and its binomial ``stderr``)."""
    rate, se = summary.get("error_rate"), summary.get("stderr")
    if not isinstance(rate, (int, float)):
        return "see the JSON line above"
    return f"{100 * rate:.2f} ± {100 * se:.2f}" if isinstance(se, (int, float)) else f"{100 * rate:.2f}"


def classify(run_dir: Path, args: argparse.Namespace) -> str:
    if "classify" not in estimators.ESTIMATORS:
        return NO_CLASSIFY
    result = evaluate_checkpoint(run_dir / "checkpoints" / "last.pt", classify_cfg(), EvalSpec(
        split="test", num_examples=args.test_examples, seed=0, device=args.device, progress=False))
    return error_percent(result.summary())


def test_log_p(run_dir: Path, args: argparse.Namespace) -> str:
    """``log p ± se (certified | not certified)`` on the test set, by estimator=ais (its certificate included)."""
    cfg = OmegaConf.load(common.CONFIG_DIR / "estimator" / "ais.yaml")
    if args.ais_betas is not None:
        cfg.num_betas = args.ais_betas
    result = evaluate_checkpoint(run_dir / "checkpoints" / "last.pt", cfg, EvalSpec(
        split="test", num_examples=args.test_examples, seed=0, device=args.device, progress=False))
    s = result.summary()
    certified = {True: "certified", False: "not certified", None: "no certificate"}[s.get("certified")]
    return f"{s['mean_log_p']:.2f} ± {s['stderr']:.2f} ({certified})"


# ---- the table ----------------------------------------------------------------------------------------

def table(results: dict, args: argparse.Namespace) -> str:
    paper_model = args.model == "srbm" and args.hidden == 500
    tags = {r["metrics"]["val/tag"] for r in results.values()}
    val_head = VAL_HEADS.get(tags.pop(), "final validation score") if len(tags) == 1 else "final validation score"
    head = ["row", "model", "test log p (paper, AIS)", "test log p", "test error % (paper)", "test error % ± se",
            val_head, "TT accept (paper)", "TT runs", "updates", "Gibbs sweeps", "updates/s", "wall s"]
    body = []
    for row in args.rows:
        _, label, paper_lp, paper_acc, _ = ROWS[row]
        paper = [f"{paper_lp:.2f}" if paper_model else "— (paper: semi-RBM 500)",
                 PAPER_ERROR[row] if paper_model else "—"]
        r = results.get(row)
        if r is None:
            body.append([label, f"{args.model} {args.hidden}", paper[0], tt.NOT_RUN, paper[1],
                         *[tt.NOT_RUN] * (len(head) - 5)])
            continue
        m, log = r["metrics"], r["log"]
        has_tt = "tt" in r["cfg"].learner
        accept = tt.fmt(tt.mean_accept(log["tt_accept"]), "— (no run logged)", 3) if has_tt else "—"
        if has_tt and paper_acc is not None:
            accept += f" ({paper_acc})"
        rate = f"{m['steps_per_second']:.1f}" if m["steps_per_second"] > 0 else "— (no new updates)"
        body.append([label, f"{args.model} {args.hidden}", paper[0], r["log_p"], paper[1], r["error"],
                     tt.fmt(tt.value_at(log["curve"], m["step"], m["val/tag"])), accept,
                     str(len(log["tt_accept"])) if has_tt else "—", str(m["step"]),
                     "—" if log["gibbs_sweeps"] is None else f"{log['gibbs_sweeps']:,}", rate, f"{r['seconds']:.0f}"])
    return common.markdown_table(head, body)


def main(argv=None) -> None:
    args = parse_args(argv)
    base_model = [f"model={args.model}", f"model.n_hidden={args.hidden}", "model.labels=true"]
    results, tt_start, tag = {}, None, None
    for row in args.rows:
        preset, label, *_ = ROWS[row]
        run_dir = args.out / f"{args.model}{args.hidden}_{row}"
        print(f"== {row} ({preset}, {args.model} {args.hidden})", flush=True)
        try:
            cfg = tt.row_cfg([f"experiment={preset}", *base_model], run_dir, args)
            r = tt.train_row(cfg, run_dir)
            r["error"] = classify(run_dir, args)
            r["log_p"] = test_log_p(run_dir, args)
        except common.UserError as e:
            print(f"error: {row}: {e}", file=sys.stderr, flush=True)
            continue
        tag = r["metrics"]["val/tag"]
        r["log"] = tt.read_log(run_dir, cfg, tag)
        results[row] = r
        if "tt" in cfg.learner:
            tt_start = int(cfg.learner.tt.start_step)
    if tag is not None:
        ylabel = {"val/pseudo_log_likelihood": "validation pseudo-log-likelihood (nats, stochastic)",
                  "val/log_p_exact": "exact validation log-probability (nats)"}.get(tag, tag)
        tt.plot([(ROWS[r][1], results[r]["log"], ROWS[r][4]) for r in args.rows if r in results], tt_start,
                args.plot, f"{args.model} {args.hidden} + labels, binarised MNIST (cf. Salakhutdinov 2009, Fig. 1)",
                tag, ylabel)
    print()
    print(table(results, args))
    print()
    print("Test log-probability: log Z by certified AIS (estimator=ais), on the last checkpoint of each row. Paper "
          "(AIS, semi-RBM 500): SAP -87.12, Trans-SAP -85.91 nats.")


if __name__ == "__main__":
    main()
