"""Two of the papers' figures redrawn from the project's measured tables (the commands below, whose runs write no
record file of their own; their tables are in docs/reproductions.md). No training, a few seconds.

    python bench/figure_estimates.py                      # both figures into docs/figures/
    python bench/figure_estimates.py --out /tmp/figures

- ``dbn_fig2.png``, after Murray & Salakhutdinov (2009), Fig. 2 (left): the mean log p(v) of 50 MNIST test cases
  (5 per class) of the committed 784-500-2000 DBN by the variational bound (Eq. 17), the Chib-style estimator
  against its number of Markov-chain steps S, and per-case AIS against its number of temperatures, all with one
  certified top-RBM log Z, beside the paper's figures. Measured by

      python bench/chib_vs_ais.py --checkpoint bench/checkpoints/dbn_mnist.pt --log-z-betas 100000 \\
          --log-z-chains 1000 --steps 5,10,20,40 --ais-betas 100,1000,10000 --full-test 10000 --full-batch 5000 \\
          --device cuda

- ``kingma_fig3.png``, after Kingma (2013), Fig. 3: MCEM with Hybrid Monte Carlo in the auxiliary and the centred
  form, each form's step size adapted to the same acceptance rate, log p(x) of the first 100 training rows against
  MCEM iterations (both forms make the same gradient evaluations per iteration); the end of each curve checked with
  10x the temperatures and 4x the chains of its evaluator. Measured by

      python bench/auxiliary_vs_centred.py --models mnist2 --settings equal_accept --iterations 10000 \\
          --eval-every 1000 --device cpu                                         # and --models mnist3
      python bench/auxiliary_vs_centred.py --models dynamic --settings equal_accept --iterations 10000 \\
          --eval-every 1000 --eval-betas 1000 --eval-chains 16 --device cpu
"""

from __future__ import annotations

from pathlib import Path

from figure_common import DPI, draw_all, plt

# Murray & Salakhutdinov 2009, Fig. 2: mean log p(v) over the 50 cases (SE over cases ~3.0, shared by every
# estimator: the same cases; Chib's spread over its 10 runs 0.02-0.08 nats).
DBN_OURS = {"bound": -87.84, "chib": {5: -85.91, 10: -85.90, 20: -85.91, 40: -85.90},
            "ais": {100: -85.91, 1000: -85.90, 10000: -85.90}}
DBN_PAPER = {"bound": -87.05, "chib": {40: -85.22}, "ais": {100: -89.59, 1000: -86.05, 10000: -85.20}}

# Kingma 2013, Fig. 3: log p(x) every 1,000 MCEM iterations (0 to 10,000), auxiliary and centred form; ``check``:
# the last model scored again with 10x the temperatures and 4x the chains (mean, SE over the rows).
ITERATIONS = list(range(0, 10_001, 1_000))
KINGMA = {
    "2 latent layers (784-64-64)": {
        "evaluator": "AIS-HMC, 100 temperatures x 4 chains",
        "auxiliary": [-205.33, -109.14, -102.11, -100.96, -100.72, -100.55, -100.57, -100.47, -100.47, -100.40,
                      -100.64],
        "centred": [-205.33, -119.55, -107.78, -104.52, -103.40, -102.78, -102.55, -102.42, -102.26, -102.06,
                    -102.03],
        "check": {"auxiliary": (-97.04, 2.13), "centred": (-98.71, 2.21)}, "ylim": (-125, -92)},
    "3 latent layers (784-64-64-64)": {
        "evaluator": "AIS-HMC, 100 temperatures x 4 chains",
        "auxiliary": [-205.99, -108.78, -101.65, -100.48, -100.25, -100.29, -100.40, -100.23, -100.18, -100.53,
                      -100.16],
        "centred": [-205.99, -119.62, -107.88, -104.62, -103.58, -103.36, -103.27, -102.92, -103.18, -103.19,
                    -103.16],
        "check": {"auxiliary": (-96.22, 2.13), "centred": (-99.93, 2.32)}, "ylim": (-125, -92)},
    "dynamic Bayesian network (length 10)": {
        "evaluator": "AIS-HMC, 1,000 temperatures x 16 chains",
        "auxiliary": [-548.88, -175.27, -162.97, -156.41, -151.76, -148.27, -145.51, -143.68, -141.92, -140.35,
                      -139.36],
        "centred": [-548.88, -172.74, -159.58, -152.44, -148.16, -145.23, -142.91, -140.79, -139.46, -138.36,
                    -137.33],
        "check": {"auxiliary": (-138.29, 1.02), "centred": (-136.48, 0.85)}, "ylim": (-180, -133)},
}
FORMS = {"auxiliary": "C0", "centred": "C3"}


def dbn_figure(path: Path) -> None:
    fig, (ax_s, ax_t) = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    steps = list(DBN_OURS["chib"])
    ax_s.plot(steps, list(DBN_OURS["chib"].values()), "o-", color="C0", label="Chib-style (ours)")
    ax_s.axhline(DBN_OURS["ais"][10000], color="C2", lw=1.2, label="AIS, 10,000 temperatures (ours)")
    ax_s.axhline(DBN_OURS["bound"], color="C3", lw=1.2, label="variational bound (ours)")
    ax_s.plot([40], [DBN_PAPER["chib"][40]], "s", color="C0", mfc="none", ms=7, label="Chib-style, S = 40 (paper)")
    ax_s.axhline(DBN_PAPER["ais"][10000], color="C2", ls="--", lw=1, label="AIS, 10,000 temperatures (paper)")
    ax_s.axhline(DBN_PAPER["bound"], color="C3", ls="--", lw=1, label="variational bound (paper)")
    ax_s.set_xlabel("Markov chain steps S of the Chib-style estimator")
    ax_s.set_ylabel("mean test log p(v), 50 cases, nats")
    ax_s.set_xticks(steps)
    ax_s.legend(fontsize=7, loc="lower right")
    ax_s.set_title("estimate against S", fontsize=10)

    temps = list(DBN_OURS["ais"])
    ax_t.plot(temps, list(DBN_OURS["ais"].values()), "o-", color="C2", label="per-case AIS (ours)")
    ax_t.plot(temps, list(DBN_PAPER["ais"].values()), "s--", color="C2", mfc="none", label="per-case AIS (paper)")
    ax_t.axhline(DBN_OURS["chib"][40], color="C0", lw=1, label="Chib-style, S = 40 (ours)")
    ax_t.set_xscale("log")
    ax_t.set_xlabel("AIS temperatures per case")
    ax_t.legend(fontsize=7, loc="lower right")
    ax_t.set_title("AIS against its temperatures", fontsize=10)
    for ax in (ax_s, ax_t):
        ax.grid(alpha=0.3, lw=0.4)
        ax.set_ylim(-90.2, -84.8)
    fig.suptitle("DBN 784-500-2000 on MNIST (Murray & Salakhutdinov 2009, Fig. 2)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def kingma_figure(path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    for ax, (title, m) in zip(axes, KINGMA.items()):
        for form, colour in FORMS.items():
            ax.plot(ITERATIONS[1:], m[form][1:], "o-", color=colour, ms=3, lw=1, label=f"{form} form")
            mean, se = m["check"][form]
            ax.errorbar([ITERATIONS[-1] + 300], [mean], yerr=[se], fmt="D", color=colour, ms=4, capsize=2)
        ax.errorbar([], [], yerr=[], fmt="kD", ms=4, label="end, checked (10x temperatures)")
        ax.set_ylim(*m["ylim"])
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("MCEM iterations")
        ax.text(0.98, 0.03, f"curves: {m['evaluator']}\nstart: {m['auxiliary'][0]}", transform=ax.transAxes,
                fontsize=7, ha="right", va="bottom")
        ax.grid(alpha=0.3, lw=0.4)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("log p(x) of 100 training rows, nats")
    fig.suptitle("MCEM-HMC, auxiliary against centred form, equal acceptance (Kingma 2013, Fig. 3)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def main() -> None:
    draw_all(__doc__, {"dbn_fig2.png": dbn_figure, "kingma_fig3.png": kingma_figure})


if __name__ == "__main__":
    main()
