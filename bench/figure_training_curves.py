"""The reproductions' training curves, drawn from the records committed under ``bench/checkpoints/``: no training,
no model loaded, a few seconds.

    python bench/figure_training_curves.py                      # both figures into docs/figures/
    python bench/figure_training_curves.py --out /tmp/figures

- ``nvil_table1_curves.png``, after Mnih & Gregor (2014), Fig. 1: the validation bound -ELBO(10) on the 100 held-out
  images (``val/elbo`` of ``<run>.val.jsonl``) against parameter updates for the committed Table 1 and Table 2 runs,
  the test figure -ELBO(10) on the 10,000 test images at the checkpoints scored (markers; docs/reproductions.md
  lists them with their commands) and the paper's figure (dashed). The paper's Fig. 1 compares the variance-reduction
  techniques switched off one by one; those runs are not committed (``bench/nvil_mnist.py`` trains them).
- ``transsap_semi_rbm.png``, after Salakhutdinov (2009), Fig. 1 (bottom): SAP and Trans-SAP on the semi-RBM with 500
  hidden units and labels. Validation pseudo-log-likelihood against updates (``<run>.val.jsonl``), then per seed the
  certified test log-probability by AIS and the test error by the label units (``<run>.eval.jsonl``; the SAP seeds'
  AIS figures, whose records are not committed, from docs/reproductions.md), with the paper's figures.
"""

from __future__ import annotations

import json
from pathlib import Path

from figure_common import DPI, ROOT, draw_all, plt

RECORDS = ROOT / "bench" / "checkpoints"

# run -> (label, colour, the paper's test -ELBO(10), test -ELBO(10) of checkpoints of the run: {update: nats}),
# each test figure from ``python evaluate.py checkpoint=<checkpoint> estimator=elbo estimator.num_samples=10``
NVIL_RUNS = {
    "nvil_sbn200_sgd": ("SBN-200, NVIL", "C0", 113.1,
                        {4.63e6: 116.07, 5.35e6: 115.69, 6.63e6: 115.19, 11.54e6: 113.99}),
    "ws_sbn200": ("SBN-200, wake-sleep", "C3", 120.8,
                  {1.34e6: 129.80, 2.45e6: 127.28, 3.53e6: 126.09, 4.69e6: 125.23, 4.97e6: 124.95, 5.6e6: 124.54,
                   6.46e6: 124.09, 7.05e6: 123.90}),
    "nvil_sbn200_ar": ("SBN-200, NVIL, autoregressive q", "C2", 103.8,
                       {0.33e6: 116.69, 1.33e6: 110.93, 1.96e6: 110.42, 2.61e6: 110.04, 4.19e6: 109.36,
                        8.24e6: 108.00, 9.13e6: 107.69, 9.66e6: 107.51, 10.18e6: 107.35, 10.54e6: 107.26}),
    "nvil_sbn200x3": ("SBN-200-200-200, NVIL", "C1", 96.7,
                      {0.8e6: 110.54, 4.42e6: 101.32, 5.37e6: 100.48, 11.03e6: 98.04, 15.73e6: 97.15}),
    "nvil_fdarn200": ("fDARN-200, NVIL", "C4", 92.5,
                      {1.61e6: 100.01, 3.0e6: 96.40, 5.46e6: 94.21, 7.43e6: 93.44, 7.5e6: 93.43}),
}
NVIL_PANELS = (("one layer of 200 units", ("nvil_sbn200_sgd", "ws_sbn200", "nvil_sbn200_ar")),
               ("deeper and autoregressive models", ("nvil_sbn200x3", "nvil_fdarn200")))

# The semi-RBM: SAP (200,000 updates) and the Trans-SAP preset (150,000 updates + 50 tempered-transitions runs,
# SAP's Gibbs steps). The SAP seeds' certified AIS (100 chains x 100,000 betas), docs/reproductions.md, row
# "semi-RBM-500, SAP"; their records were not committed. Everything else is read from the records.
SAP_LOG_P = {0: (-87.80, 0.25), 1: (-87.21, 0.27), 2: (-87.08, 0.23)}
SRBM_SAP = "sap_srbm500"
SRBM_TRANSSAP = {0: "transsap_srbm500_eq_s0", 1: "transsap_srbm500_eq_s1", 2: "transsap_srbm500_eq_s2"}
SRBM_PAPER = {"SAP": -87.12, "Trans-SAP": -85.91}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def curve(run: str, key: str) -> tuple[list[int], list[float]]:
    rows = [r for r in read_jsonl(RECORDS / f"{run}.val.jsonl") if key in r]
    return [r["step"] for r in rows], [r[key] for r in rows]


def eval_records(run: str) -> list[dict]:
    """``<run>.pt.eval.jsonl`` (a committed checkpoint) or ``<run>.eval.jsonl`` (records only)."""
    for name in (f"{run}.pt.eval.jsonl", f"{run}.eval.jsonl"):
        if (RECORDS / name).exists():
            return read_jsonl(RECORDS / name)
    return []


def certified_ais(run: str) -> tuple[float, float]:
    """The certified AIS record with the most betas: (test log p, its SE)."""
    best = max((r for r in eval_records(run) if r["estimator"] == "ais" and r.get("certified")),
               key=lambda r: r["log_z_num_betas"])
    return best["mean_log_p"], best["stderr"]


def test_error(run: str) -> tuple[float, float]:
    r = next(r for r in eval_records(run) if r["estimator"] == "classify")
    return 100 * r["error_rate"], 100 * r["stderr"]


def nvil_figure(path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (title, runs) in zip(axes, NVIL_PANELS):
        for run in runs:
            label, colour, paper, tests = NVIL_RUNS[run]
            steps, elbo = curve(run, "val/elbo")
            ax.plot(steps, [-e for e in elbo], color=colour, lw=0.8, alpha=0.8, label=label)
            ax.plot(list(tests), list(tests.values()), "o", color=colour, ms=4)
            ax.axhline(paper, color=colour, ls="--", lw=1)
        ax.plot([], [], "k-", lw=0.8, label="validation, 100 images")
        ax.plot([], [], "ko", ms=4, label="test, 10,000 images")
        ax.plot([], [], "k--", lw=1, label="the paper (test)")
        ax.set_xscale("log")
        ax.set_xlim(1e4, 2e7)
        ax.set_ylim(88, 150)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("parameter updates (minibatches of 20)")
        ax.grid(alpha=0.3, which="both", lw=0.4)
        ax.legend(fontsize=7, loc="lower left")
    axes[0].set_ylabel("-ELBO(10), nats (lower is better)")
    fig.suptitle("NVIL and wake-sleep on binarised MNIST (Mnih & Gregor 2014, Tables 1-2)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def srbm_figure(path: Path) -> None:
    fig, (ax_c, ax_p, ax_e) = plt.subplots(1, 3, figsize=(11, 3.6), gridspec_kw={"width_ratios": [2, 1, 1]})
    for run, label, colour in ((SRBM_SAP, "SAP", "C0"), (SRBM_TRANSSAP[0], "Trans-SAP", "C3")):
        steps, pl = curve(run, "val/pseudo_log_likelihood")
        ax_c.plot([s / 1000 for s in steps], pl, color=colour, lw=1.1, label=f"{label}, seed 0")
    ax_c.axvline(100, color="grey", lw=0.6, ls=":")
    ax_c.annotate("tempered transitions from here ", (100, 0.04), xycoords=("data", "axes fraction"), fontsize=7,
                  ha="right", va="bottom")
    ax_c.set_xlabel("parameter updates (thousands)")
    ax_c.set_ylabel("validation pseudo-log-likelihood, nats")
    ax_c.set_title("training, seed 0 (the records' curves)", fontsize=10)
    ax_c.legend(fontsize=7, loc="lower right")
    ax_c.grid(alpha=0.3, lw=0.4)

    seeds = list(SRBM_TRANSSAP)
    for offset, (name, colour, values) in enumerate(
            (("SAP", "C0", [SAP_LOG_P[s] for s in seeds]),
             ("Trans-SAP", "C3", [certified_ais(SRBM_TRANSSAP[s]) for s in seeds]))):
        xs = [s + (offset - 0.5) * 0.2 for s in seeds]
        ax_p.errorbar(xs, [v for v, _ in values], yerr=[e for _, e in values], fmt="o", color=colour, ms=4,
                      capsize=2, label=name)
        ax_p.axhline(SRBM_PAPER[name], color=colour, ls="--", lw=1)
    ax_p.set_xticks(seeds)
    ax_p.set_xlabel("seed")
    ax_p.set_ylabel("test log p(image, label), nats")
    ax_p.set_title("certified AIS (dashed: paper)", fontsize=10)
    ax_p.legend(fontsize=7, loc="lower right")
    ax_p.grid(alpha=0.3, lw=0.4)

    errors = [("SAP\n0", "C0", test_error(SRBM_SAP))]
    errors += [(f"TS\n{s}", "C3", test_error(run)) for s, run in SRBM_TRANSSAP.items()]
    ax_e.bar(range(len(errors)), [e for _, _, (e, _) in errors], yerr=[s for _, _, (_, s) in errors],
             color=[c for _, c, _ in errors], alpha=0.8, capsize=2)
    ax_e.set_xticks(range(len(errors)), [n for n, _, _ in errors], fontsize=7)
    ax_e.set_ylim(2.0, 3.0)
    ax_e.set_xlabel("seed (TS: Trans-SAP)")
    ax_e.set_ylabel("test error, % (10,000 images)")
    ax_e.set_title("classification by the label units", fontsize=10)
    ax_e.grid(alpha=0.3, lw=0.4, axis="y")
    fig.suptitle("SAP and Trans-SAP, semi-RBM with 500 hidden units (Salakhutdinov 2009, Fig. 1 bottom)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def main() -> None:
    draw_all(__doc__, {"nvil_table1_curves.png": nvil_figure, "transsap_semi_rbm.png": srbm_figure})


if __name__ == "__main__":
    main()
