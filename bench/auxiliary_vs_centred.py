"""Kingma 2013, Fig. 3: MCEM-HMC in auxiliary form against the centred form, same initial parameters, data and
budget. For each model, log-likelihood against wall time and against gradient evaluations, as a table and PNGs.

    python bench/auxiliary_vs_centred.py                                  # mnist2, mnist3, dynamic on the CPU
    python bench/auxiliary_vs_centred.py --models mnist2 --iterations 3000 --device cuda
    python bench/auxiliary_vs_centred.py --models mnist2,mnist3 --settings paper,equal_accept,sigma1   # three comparisons

Models (presets): ``mnist2`` = experiment=mcem_gbn_mnist (784-64-64, 10,000 training digits), ``mnist3`` the
same with three latent layers, ``dynamic`` = experiment=mcem_dbn_dynamic (length 10, 10-dim latents, 100
sequences). Both forms start from the same parameters and the same prior draw of the chains (eps, and z = z(eps)
in centred form). Every ``--eval-every`` iterations the clock stops and log p(x) of the first ``--eval-examples``
training rows is estimated by AIS-HMC (the same estimator and random numbers for both forms). The speed-up is the
ratio of the times (and of the gradient evaluations) each form needs to first reach a target log-likelihood:
50%, 75%, 90% and 100% of the way from the common start to where the slower form ends. Paper: about 10x in favour of the auxiliary form, for 2 and 3 layers and the DBN.

The curves' evaluator is checked on each trained model: AIS-HMC with ``--check-betas`` (default 10x) and
``--check-chains`` (default 4x) against the curve's last value on the same rows. AIS is a stochastic lower bound that
loosens as the posterior sharpens, so a check far above the end (flagged LOOSE, with a warning) means the curve
understates that run: with the default 100 betas x 4 chains the dynamic net's curves fell after ~3,000 iterations
while log p by 1,000 betas x 16 chains kept rising (docs/reproductions.md, Kingma 2013).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import CONFIG_DIR, ROOT, markdown_table, rel  # noqa: I001

import torch
from hydra import compose, initialize_config_dir

from nvil.app.build import build
from nvil.core.config import resolve_device
from nvil.data import MinibatchStream, take_rows
from nvil.estimators.validation import continuous_log_likelihood

MODELS = {"mnist2": ["experiment=mcem_gbn_mnist"],
          "mnist3": ["experiment=mcem_gbn_mnist", "model.layers=[64,64,64]"],
          "dynamic": ["experiment=mcem_dbn_dynamic"]}
FORMS = ("auxiliary", "centred")
# How the two forms are compared: the paper's one fixed step for both; each form's step adapted to the
# same acceptance rate (dual averaging per chain, towards learner.target_accept); and sigma = 1, where the auxiliary
# form's unit-scale eps and the centred z have the same conditional scale.
SETTINGS = {"paper": [], "equal_accept": ["learner.adapt=dual_averaging"], "sigma1": ["model.sigma=1.0"]}


def run(overrides: list[str], args) -> dict:
    """Train one form for ``args.iterations`` MCEM iterations; returns its curve."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, f"seed={args.seed}", *args.extra_override])
    device = resolve_device(args.device)
    built = build(cfg, device)
    data, model, learner = built.data, built.model, built.learner
    stream = MinibatchStream(data, int(args.batch_size or cfg.trainer.batch_size), cfg.seed)
    x_eval = take_rows(data.split("train"), 0, args.eval_examples)
    curve = {"iteration": [], "seconds": [], "grad_evals": [], "log_p": []}
    seconds = 0.0
    last = {}  # the latest evaluation, per example (the check below pairs with it)

    def evaluate(it: int) -> None:
        g = torch.Generator(device=device).manual_seed(args.seed + 1)
        last["log_p"] = continuous_log_likelihood(model, x_eval, args.eval_chains, args.eval_betas, g)
        log_p = last["log_p"].mean().item()
        for key, value in (("iteration", it), ("seconds", seconds), ("grad_evals", learner.grad_evals), ("log_p", log_p)):
            curve[key].append(value)
        print(f"  {cfg.model.form:9s} it {it:6d}  {seconds:8.1f} s  {learner.grad_evals:9d} grads  log p {log_p:10.3f}", flush=True)

    evaluate(0)
    for it in range(1, args.iterations + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        learner.step(stream.batch(it - 1), indices=stream.indices(it - 1))
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - t0
        if it % args.eval_every == 0 or it == args.iterations:
            evaluate(it)
    curve.update(check_evaluator(model, x_eval, last["log_p"], args, device))
    return curve


def check_evaluator(model, x_eval: torch.Tensor, end: torch.Tensor, args, device) -> dict:
    """The curve's evaluator checked on the trained model: log p by AIS-HMC with ``--check-betas`` and
    ``--check-chains`` against ``end``, the curve's last evaluation per example (paired, the same rows). AIS is a
    stochastic lower bound, so a check well above the curve's end says the curve's evaluator is loose there."""
    g = torch.Generator(device=device).manual_seed(args.seed + 1)
    check = continuous_log_likelihood(model, x_eval, args.check_chains, args.check_betas, g)
    diff = check - end
    n = x_eval.shape[0]
    return {"log_p_end_se": (end.std() / n ** 0.5).item(), "log_p_check": check.mean().item(),
            "log_p_check_se": (check.std() / n ** 0.5).item(), "check_minus_end": diff.mean().item(),
            "check_minus_end_se": (diff.std() / n ** 0.5).item(),
            "check_betas": args.check_betas, "check_chains": args.check_chains}


def loose(c: dict) -> bool:
    """The check lies more than 3 paired standard errors (and 0.1 nats) above the curve's end."""
    gap, se = c["check_minus_end"], c["check_minus_end_se"]
    return gap > max(3 * se, 0.1)


def first_reach(curve: dict, key: str, target: float) -> float | None:
    """The first ``key`` value (seconds or gradient evaluations) at which log p reached ``target``, linearly
    interpolated between evaluations; None if it never did."""
    xs, ys = curve[key], curve["log_p"]
    for i, y in enumerate(ys):
        if y >= target:
            if i == 0:
                return xs[0]
            frac = (target - ys[i - 1]) / (y - ys[i - 1])
            return xs[i - 1] + frac * (xs[i] - xs[i - 1])
    return None


FRACTIONS = (0.5, 0.75, 0.9, 1.0)  # targets: this far from the common start to where the slower form ends


def speedups(curves: dict) -> list[dict]:
    """For each target log p, the seconds and gradient evaluations each form needs to first reach it, and
    their ratios (centred / auxiliary: above 1 means the auxiliary form is faster)."""
    start = curves["auxiliary"]["log_p"][0]
    final = min(c["log_p"][-1] for c in curves.values())
    out = []
    for frac in FRACTIONS:
        target = start + frac * (final - start)
        reach = {form: {k: first_reach(c, k, target) for k in ("seconds", "grad_evals")} for form, c in curves.items()}
        ratio = {k: reach["centred"][k] / reach["auxiliary"][k] if reach["auxiliary"][k] else None
                 for k in ("seconds", "grad_evals")}
        out.append({"fraction": frac, "target_log_p": target, "reach": reach, "speedup": ratio})
    return out


def report(results: dict, args, out: Path) -> None:
    """The table (final log p of both forms; speed-ups at each target) and one PNG per model."""
    rows, speed_rows = [], []
    for name, curves in results.items():
        for form, c in curves.items():
            check = "-"
            if "log_p_check" in c:
                check = (f"{c['log_p_check']:.2f} ± {c['log_p_check_se']:.2f} ({c['check_betas']} betas x "
                         f"{c['check_chains']}): {c['check_minus_end']:+.2f} ± {c['check_minus_end_se']:.2f}"
                         + (" LOOSE" if loose(c) else ""))
            end_se = f" ± {c['log_p_end_se']:.2f}" if "log_p_end_se" in c else ""
            rows.append([name, form, f"{c['log_p'][0]:.2f}", f"{c['log_p'][-1]:.2f}{end_se}", check,
                         str(c["iteration"][-1]), f"{c['seconds'][-1]:.1f}", str(c["grad_evals"][-1])])
        for sp in speedups(curves):
            fmt = lambda v, d=1: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
            r = sp["reach"]
            speed_rows.append([name, f"{sp['fraction']:.0%} ({sp['target_log_p']:.2f})",
                               f"{fmt(r['auxiliary']['seconds'])} / {fmt(r['centred']['seconds'])}",
                               f"{fmt(r['auxiliary']['grad_evals'], 0)} / {fmt(r['centred']['grad_evals'], 0)}",
                               f"{fmt(sp['speedup']['seconds'], 2)}x", f"{fmt(sp['speedup']['grad_evals'], 2)}x"])
    print(markdown_table(["model", "form", "log p start", "log p end (SE over rows)",
                          "check at the end: log p, and check - end (paired SE)", "iterations", "train s",
                          "grad evals"], rows))
    flagged = [f"{name} {form}" for name, curves in results.items() for form, c in curves.items()
               if "log_p_check" in c and loose(c)]
    if flagged:
        print(f"warning: the curves' evaluator ({args['eval_betas']} betas x {args['eval_chains']} chains) is loose "
              f"at the end of {', '.join(flagged)}: the check with more betas lies above it by more than 3 SE, so the "
              f"curves and speed-ups below understate those runs; rerun with a larger --eval-betas / --eval-chains")
    else:
        print("the curves' evaluator agrees with the check at the end of every run (within 3 SE or 0.1 nats)")
    print()
    print(markdown_table(["model", "target: share of the way to the slower form's end (log p)", "s aux / centred",
                          "grads aux / centred", "speed-up in time", "speed-up in grads"], speed_rows))

    try:
        import matplotlib
    except ImportError:
        print("figures skipped: matplotlib is not installed (pip install -e '.[bench]')")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, curves in results.items():
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for form, c in curves.items():
            axes[0].plot(c["seconds"], c["log_p"], marker=".", label=form)
            axes[1].plot(c["grad_evals"], c["log_p"], marker=".", label=form)
        axes[0].set_xlabel("training wall time (s)")
        axes[1].set_xlabel("gradient evaluations")
        for ax in axes:
            ax.set_ylabel(f"log p(x), first {args['eval_examples']} training rows (AIS-HMC)")
            ax.legend()
        fig.suptitle(f"{name}: MCEM-HMC, auxiliary vs centred form (Kingma 2013, Fig. 3)")
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=110)
        print(f"figure: {rel(out / f'{name}.png')}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="mnist2,mnist3,dynamic")
    p.add_argument("--settings", default="paper",
                   help=f"comma list of comparisons: {', '.join(SETTINGS)} (default paper: the preset's fixed step)")
    p.add_argument("--iterations", type=int, default=2000)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-examples", type=int, default=100)
    p.add_argument("--eval-chains", type=int, default=4)
    p.add_argument("--eval-betas", type=int, default=100)
    p.add_argument("--check-betas", type=int, default=None,
                   help="AIS temperatures of the check of the evaluator on each trained model (default 10x --eval-betas)")
    p.add_argument("--check-chains", type=int, default=None, help="its chains per example (default 4x --eval-chains)")
    p.add_argument("--batch-size", type=int, default=None, help="default: the preset's trainer.batch_size")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--extra-override", action="append", default=[])
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "auxiliary_vs_centred"))
    p.add_argument("--from-json", nargs="+", default=None, help="redo the table and figures from saved results.json files")
    args = p.parse_args()
    args.check_betas = args.check_betas or 10 * args.eval_betas
    args.check_chains = args.check_chains or 4 * args.eval_chains
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.from_json:
        results, saved_args = {}, None
        for path in args.from_json:
            saved = json.loads(Path(path).read_text())
            results.update({k: v for k, v in saved["results"].items() if not k.endswith("_speedup")})
            saved_args = saved["args"]
        return report(results, saved_args, out)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        p.error(f"unknown models {unknown}; known: {list(MODELS)}")
    settings = [s for s in args.settings.split(",") if s]
    if any(s not in SETTINGS for s in settings):
        p.error(f"unknown settings {[s for s in settings if s not in SETTINGS]}; known: {list(SETTINGS)}")
    results = {}
    for name in models:
        for setting in settings:
            key = name if setting == "paper" else f"{name}, {setting}"
            print(f"== {key}", flush=True)
            results[key] = {form: run(MODELS[name] + SETTINGS[setting] + [f"model.form={form}"], args) for form in FORMS}
    (out / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    report(results, vars(args), out)


if __name__ == "__main__":
    main()
