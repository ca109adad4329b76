"""Gradient estimators for discrete latents compared in one loop, at matched budgets, scored by log-likelihood.
A benchmark, not run by CI.

    pip install -e '.[bench]'
    python bench/discrete_estimators.py                                   # SBN-200, every estimator, 3 seeds
    python bench/discrete_estimators.py --models sbn200,sbn200x3 --budget evaluations --steps 1000000
    python bench/discrete_estimators.py --protocol relax        # RELAX Table 1's: NVIL, REBAR, RELAX, 2M updates
    python bench/discrete_estimators.py --estimators nvil,disarm,vimco --seeds 0 --steps 300 \
        --test-examples 100 --iwae-k 50 --ais-examples 10 --device cpu --out /tmp/discrete_smoke   # a smoke test
    python bench/discrete_estimators.py --protocol disarm --seeds 0,1,2,3,4 \
        --rows machine_a/rows.jsonl,machine_b/rows.jsonl      # the tables from records of those runs, training nothing

Each row trains ``learner=<estimator>`` on a model (``--models``: sbn200 = one layer of 200 units, sbn200x3 = three)
on binarised MNIST (fixed binarisation; ``--protocol disarm`` binarises dynamically), at
minibatch ``--batch-size`` with each learner's configured optimiser (``configs/learner/NAME.yaml``), once per seed.
Budgets (``--budget``): ``updates`` gives every estimator ``--steps`` updates; ``evaluations`` gives every estimator
the model evaluations NVIL makes in ``--steps`` updates (an estimator that evaluates f e times per example, e.g.
VIMCO with K = 5, gets --steps / e updates). Runs live in ``<out>/<model>/<budget>/<estimator>_s<seed>`` and a rerun
continues them (``trainer.resume=true``), so raising ``--steps`` extends them; a run already at its steps (stopped
while it was being scored) is scored without training, and a score the run's ``scores.jsonl`` already holds (the same
estimator, settings, examples and step) is read back, not computed again (``--rescore`` computes it), so adding a seed
to a table costs that seed's runs only. Every scored run is also recorded in ``<out>/rows.jsonl``
(``discrete_records.py``); ``--rows FILE,...`` prints the tables from such records instead of training, so runs
trained at other times or on other machines (each appending its records) make one table.

Each final checkpoint is scored on the test split, so the table ranks estimators by log-likelihood, not by their
own objective: -ELBO (10 samples, Mnih & Gregor's Table 1 measure), -IWAE(``--iwae-k``) (an upper bound on -log p),
and the per-example AIS of ``estimator=ais_posterior`` on the first ``--ais-examples`` test cases with its
certificate (ESS over runs, run spread). Also the training ELBO on ``--train-examples`` training images (RELAX's
Table 1 measure) and the last ``grad/snr`` and ``grad/inference_variance`` the run logged. Every figure is a mean
over seeds ± its standard error over seeds (one seed: the estimator's own SE); a second table gives each estimator's
training -ELBO and test -IWAE minus the best estimator's, paired by seed. The published anchors follow, each with its
protocol; a number here is comparable to one there only under that protocol and budget (``--protocol`` sets one up).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import discrete_records as records  # noqa: E402
from discrete_protocols import ANCHORS, PROTOCOLS  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from nvil.models import build_model  # noqa: E402
from nvil.data import build_model_data  # noqa: E402
from nvil.app.evaluation import EvalSpec, evaluate_checkpoint  # noqa: E402
from nvil.learners import build_learner  # noqa: E402

ESTIMATORS = ["nvil", "vimco", "rloo", "arm", "disarm", "rebar", "relax", "gumbel_st"]
MODELS = {"sbn200": [200], "sbn200x3": [200, 200, 200]}



def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--estimators", default=",".join(ESTIMATORS), help=f"comma list (default: all of {ESTIMATORS})")
    p.add_argument("--models", default="sbn200", help=f"comma list of {list(MODELS)} (default sbn200)")
    p.add_argument("--seeds", default="0,1,2", help="comma list of seeds (default 0,1,2)")
    p.add_argument("--budget", choices=("updates", "evaluations"), default="updates",
                   help="match the number of updates, or of model evaluations (default updates)")
    p.add_argument("--batch-size", type=int, default=24, help="minibatch (default 24, RELAX's protocol)")
    p.add_argument("--train-examples", type=int, default=10000, help="training images for the training ELBO")
    p.add_argument("--ais-examples", type=int, default=100, help="test cases scored by per-example AIS (default 100)")
    p.add_argument("--ais-betas", type=int, default=300, help="temperatures of the per-example AIS (default 300)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--rescore", action="store_true",
                   help="score every checkpoint again (default: reuse a run's scores.jsonl record of the same score)")
    p.add_argument("--protocol", choices=sorted(PROTOCOLS), default=None,
                   help="a published protocol's estimators, model, budget and batch (see ANCHORS)")
    p.add_argument("--rows", default=None,
                   help="comma list of record files (<out>/rows.jsonl): print the tables from their records of the\n"
                        "named runs under these settings, training nothing (discrete_records.py)")
    common.add_common_args(p, default_out=common.ROOT / "bench" / "out" / "discrete", plot_name="discrete_curves.png",
                           default_steps=20_000)
    p.set_defaults(iwae_k=5000)
    protocol = p.parse_known_args(argv)[0].protocol
    if protocol:
        p.set_defaults(**PROTOCOLS[protocol]["defaults"])
    args = p.parse_args(argv)
    args.learner_overrides = PROTOCOLS[protocol]["overrides"] if protocol else {}
    args.estimators = [e.strip() for e in args.estimators.split(",") if e.strip()]
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [e for e in args.estimators if e not in ESTIMATORS] + [m for m in args.models if m not in MODELS]
    if unknown or not args.estimators or not args.models:
        p.error(f"unknown or missing estimators / models: {unknown}; known: {ESTIMATORS}, {list(MODELS)}")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds must be a comma list of integers, got {args.seeds!r}")
    if not args.seeds or min(args.steps, args.batch_size, args.train_examples, args.ais_examples, args.ais_betas,
                             args.iwae_k) < 1:
        p.error("--seeds must name a seed; --steps, --batch-size, --train-examples, --ais-examples, --ais-betas and "
                "--iwae-k must be positive")
    args.out = Path(args.out)
    args.rows = [Path(r.strip()) for r in args.rows.split(",") if r.strip()] if args.rows else None
    return args


def overrides(estimator: str, layers: list[int], seed: int, args: argparse.Namespace) -> list[str]:
    return ["model=sbn", f"model.layers=[{','.join(map(str, layers))}]", f"learner={estimator}", "data=mnist",
            f"trainer.batch_size={args.batch_size}", f"seed={seed}",
            f"trainer.grad_diag_every={max(1, min(10_000, args.steps // 5))}",
            *args.learner_overrides.get("*", []), *args.learner_overrides.get(estimator, [])]


def evaluations_per_example(estimator: str, layers: list[int], extra: list[str]) -> int:
    """Evaluations of log p(x, h) per example and update, read off the learner built on a stand-in model with the
    same number of layers (``evaluations_per_example``; NVIL: 1)."""
    with common.initialize_config_dir(config_dir=str(common.CONFIG_DIR), version_base="1.3"):
        cfg = common.compose(config_name="train", overrides=[f"learner={estimator}", "model=sbn",
                                                             f"model.layers=[{','.join('1' * len(layers))}]",
                                                             *[e for e in extra if e.startswith("learner.")]])
    model, inference = build_model(cfg.model, 4)
    learner = build_learner(cfg.learner, model, inference, torch.device("cpu"), 0)
    return int(getattr(learner, "evaluations_per_example", 1))


def trained_to(ckpt: Path) -> int | None:
    """The step of a run's last checkpoint, None where it has none."""
    if not ckpt.exists():
        return None
    return int(torch.load(ckpt, map_location="cpu", weights_only=True)["step"])


def last_logged(run_dir: Path, tag: str) -> float | None:
    steps, values = common.val_curve(run_dir, tag)
    return values[-1] if values else None


def scored_before(ckpt: Path, step: int, name: str, settings: dict, spec: EvalSpec) -> SimpleNamespace | None:
    """The evaluator's own record of this score, where a run scored before wrote one to ``spec.output``: the same
    estimator, ``spec``'s split, number of examples (None: the whole split) and seed, the checkpoint's step, and the
    same value of every setting (``settings``: the estimator's config, scalars) that the record states.
    Scoring the IWAE(5000) of a model on the whole test set is the costly part of a row; a rerun that adds a seed
    to a table reuses the seeds already scored (``--rescore`` scores again)."""
    scores = Path(spec.output)
    if not scores.exists():
        return None
    scored = [json.loads(line) for line in scores.read_text().splitlines() if line.strip()]
    found = [r for r in scored if r.get("estimator") == name and r.get("split") == spec.split
             and r.get("step") == step and r.get("seed") == spec.seed
             and all(r[k] == v for k, v in settings.items() if k in r)]
    n = spec.num_examples
    if found and n is None:
        n = split_size(ckpt, spec.split)
    found = [r for r in found if r.get("num_examples") == n]
    if not found:
        return None
    r = found[-1]
    return SimpleNamespace(mean=r["mean_log_p"], stderr=r["stderr"], certified=r["certified"])


def split_size(ckpt: Path, split: str) -> int:
    """The number of examples in the checkpoint's data split ``split``."""
    payload = torch.load(ckpt, map_location="cpu", weights_only=True)
    data = build_model_data(OmegaConf.create(payload["config"]["data"]), "cpu",
                            labels=bool(payload["config"]["model"].get("labels", False)))
    return data.splits[split].shape[0]


def run_one(estimator: str, model: str, seed: int, args: argparse.Namespace) -> dict:
    layers = MODELS[model]
    evals = evaluations_per_example(estimator, layers, [*args.extra_override,
                                                        *args.learner_overrides.get(estimator, [])])
    steps = args.steps if args.budget == "updates" else max(1, args.steps // evals)
    run_dir = args.out / model / args.budget / f"{estimator}_s{seed}"
    row_args = argparse.Namespace(**{**vars(args), "steps": steps})
    ckpt = run_dir / "checkpoints" / "last.pt"
    started = time.perf_counter()
    if trained_to(ckpt) == steps:  # trained, then stopped while it was being scored: score it
        metrics = {"step": steps, "steps_per_second": last_logged(run_dir, "train/steps_per_second") or float("nan")}
    else:
        metrics = common.train.train(common.compose_row(overrides(estimator, layers, seed, args), run_dir, row_args),
                                     run_dir)
    seconds = time.perf_counter() - started

    def score(name: str, split: str, n: int | None, **settings):
        est = OmegaConf.merge(OmegaConf.load(common.CONFIG_DIR / "estimator" / f"{name}.yaml"), settings)
        spec = EvalSpec(split=split, num_examples=n, seed=0, device=args.device, progress=False,
                        output=str(run_dir / "scores.jsonl"))
        stated = {k: v for k, v in OmegaConf.to_container(est).items() if isinstance(v, (int, float, str, bool))}
        earlier = None if args.rescore else scored_before(ckpt, metrics["step"], name, stated, spec)
        return earlier or evaluate_checkpoint(ckpt, est, spec)

    return {
        "seed": seed, "run_dir": run_dir, "steps": metrics["step"], "evals": evals, "rate": metrics["steps_per_second"],
        "seconds": seconds, "cpu": common.cpu_name(), "threads": torch.get_num_threads(),
        "elbo": score("elbo", "test", args.test_examples, num_samples=10),
        "iwae": score("iwae", "test", args.test_examples, num_samples=args.iwae_k),
        "ais": score("ais_posterior", "test", args.ais_examples, num_betas=args.ais_betas),
        "train_elbo": score("elbo", "train", args.train_examples, num_samples=1),
        "snr": last_logged(run_dir, "grad/snr"), "variance": last_logged(run_dir, "grad/inference_variance"),
    }


def paired_rows(results: dict[tuple[str, str], list[dict]]) -> list[list[str]]:
    """Per model, each estimator's training -ELBO and test -IWAE minus those of the estimator with the best (lowest)
    mean training -ELBO, paired by seed (``common.paired_differences``); none where no two estimators share a seed."""
    rows = []
    for model in dict.fromkeys(m for m, _ in results):
        runs = {e: rs for (m, e), rs in results.items() if m == model}
        best = min(runs, key=lambda e: common.mean_se([-r["train_elbo"].mean for r in runs[e]])[0])
        diffs = {key: common.paired_differences({e: {r["seed"]: -r[key].mean for r in rs} for e, rs in runs.items()},
                                                best) for key in ("train_elbo", "iwae")}
        rows += [[model, f"{e} - {best}", str(diffs["train_elbo"][e][2]),
                  *("{:+.2f} ± {:.2f}".format(*diffs[key][e][:2]) for key in ("train_elbo", "iwae"))]
                 for e in diffs["train_elbo"] if diffs["train_elbo"][e][2] > 1]
    return rows


def row_cells(runs: list[dict]) -> list[str]:
    def bound(key):
        return "{:.2f} ± {:.2f}".format(*common.mean_se([-r[key].mean for r in runs], runs[0][key].stderr))

    certified = [r["ais"].certified for r in runs]
    snr = [r["snr"] for r in runs if r["snr"] is not None]
    var = [r["variance"] for r in runs if r["variance"] is not None]
    return [f"{runs[0]['steps']:,}", str(runs[0]["evals"]), str(len(runs)), bound("elbo"), bound("iwae"),
            bound("ais") + f" ({sum(map(bool, certified))}/{len(runs)} certified)",
            bound("train_elbo"),
            f"{sum(snr) / len(snr):.3f}" if snr else "—", f"{sum(var) / len(var):.3g}" if var else "—",
            f"{sum(r['rate'] for r in runs) / len(runs):.0f}", f"{sum(r['seconds'] for r in runs):.0f}"]


def trained(args: argparse.Namespace) -> dict[tuple[str, str], list[dict]]:
    """Every named run trained (or continued) and scored, each also recorded in ``<out>/rows.jsonl``."""
    results: dict[tuple[str, str], list[dict]] = {}
    for model in args.models:
        for estimator in args.estimators:
            for seed in args.seeds:
                print(f"== {model} {estimator} seed {seed} ({args.budget} budget)", flush=True)
                try:
                    run = run_one(estimator, model, seed, args)
                except common.UserError as e:
                    print(f"error: {model} {estimator} seed {seed}: {e}", file=sys.stderr, flush=True)
                else:
                    results.setdefault((model, estimator), []).append(run)
                    records.append(args.out / "rows.jsonl", records.record(model, estimator, run, args))
    return results


def recorded(args: argparse.Namespace) -> dict[tuple[str, str], list[dict]]:
    """The named runs read from ``--rows`` record files (no training); a named run without a record is said."""
    try:
        results, missing = records.load(args.rows, args)
    except (OSError, ValueError) as e:
        sys.exit(f"error: {e}")
    for line in missing:
        print(f"not in --rows: {line}", file=sys.stderr, flush=True)
    if not results:
        sys.exit("error: --rows holds no record of the named runs under these settings")
    return results


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results = recorded(args) if args.rows else trained(args)
    head = ["model", "estimator", "updates", "evals/example", "seeds", "test -ELBO(10)",
            f"test -IWAE({args.iwae_k})", f"test -log p, AIS ({args.ais_examples} cases)",
            f"train -ELBO ({args.train_examples})", "grad SNR", "inference grad variance", "updates/s",
            "training s (recorded)" if args.rows else "training s (this call)"]
    rows = [[model, est, *row_cells(runs)] for (model, est), runs in results.items()]
    where = ", ".join(sorted({f"{r['cpu']}, {r['threads']} threads" for runs in results.values() for r in runs}))
    print(f"\n**Matched {args.budget}** (batch {args.batch_size}, {where}; test figures on "
          f"{args.test_examples or 'all'} test images)\n")
    print(common.markdown_table(head, rows))
    if paired := paired_rows(results):
        head = ["model", "estimators", "seeds", "train -ELBO", f"test -IWAE({args.iwae_k})"]
        print("\n**Paired by seed** (minus the best training ELBO's estimator; mean ± SE over shared seeds)\n\n"
              + common.markdown_table(head, paired))
    print("\n**Published anchors** (each under its own protocol)\n")
    print(common.markdown_table(["estimator", "model", "figure", "measure", "protocol"],
                                [[e, m, f"{v:.1f}" if v is not None else "—", what, proto]
                                 for e, m, v, what, proto in ANCHORS]))
    common.plot([(f"{m} {e} s{r['seed']}", *common.val_curve(r["run_dir"]), {"color": f"C{ESTIMATORS.index(e)}"})
                 for (m, e), runs in results.items() for r in runs],
                common.plot_path(args, "discrete_curves.png"), "Discrete gradient estimators: validation ELBO")
    (args.out / "results.json").parent.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(
        {f"{m}/{e}": [records.record(m, e, r, args) for r in runs] for (m, e), runs in results.items()}, indent=1))


if __name__ == "__main__":
    main()
