"""The rows of ``bench/discrete_estimators.py`` kept as records, one JSON line per scored run, so that a table can be
printed again from runs trained at other times or on other machines, without their run directories.

A record holds the run's figures (each score's mean, standard error and certificate; steps, rate, gradient
diagnostics) and the settings that make two rows comparable (``settings``: budget, steps, batch, protocol, the scores'
sizes, extra overrides). ``--rows FILE`` reads records instead of training and keeps those whose settings equal the
command's, so a table is printed from the same command that trained it with ``--rows`` added; a later record of the
same model, estimator and seed replaces an earlier one."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

SCORES = ("elbo", "iwae", "ais", "train_elbo")
FIGURES = ("seed", "steps", "evals", "rate", "seconds", "snr", "variance", "cpu", "threads")


def settings(args: argparse.Namespace) -> dict:
    """What two rows must share to stand in one table: everything on the command line that changes a row's figures
    (not where it ran, nor how many threads)."""
    return {"budget": args.budget, "steps": args.steps, "batch_size": args.batch_size, "protocol": args.protocol,
            "iwae_k": args.iwae_k, "ais_examples": args.ais_examples, "ais_betas": args.ais_betas,
            "train_examples": args.train_examples, "test_examples": args.test_examples,
            "extra_override": list(args.extra_override)}


def record(model: str, estimator: str, run: dict, args: argparse.Namespace) -> dict:
    """One run's row (``discrete_estimators.run_one``'s result, with the processor and threads its rate and seconds
    were measured on) as a JSON-able record."""
    return {"model": model, "estimator": estimator, **{k: run[k] for k in FIGURES}, "run_dir": str(run["run_dir"]),
            **{k: {"mean": run[k].mean, "stderr": run[k].stderr, "certified": run[k].certified} for k in SCORES},
            "settings": settings(args)}


def append(path: Path, rec: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def load(paths: list[Path], args: argparse.Namespace) -> tuple[dict[tuple[str, str], list[dict]], list[str]]:
    """The runs of ``args``' models, estimators and seeds recorded in ``paths`` under ``args``' settings, as
    ``{(model, estimator): [run, ...]}`` in the command's order (``run_one``'s form), and one line per row the
    command names that no record supplies, or that a record gives under other settings only."""
    wanted, latest, other = settings(args), {}, set()
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"--rows: {path} does not exist")
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                key = (rec["model"], rec["estimator"], int(rec["seed"]))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"--rows: {path} line {n} is not a record of this bench ({e})") from None
            if rec.get("settings") == wanted:
                latest[key] = rec
            else:
                other.add(key)
    results, missing = {}, []
    for model in args.models:
        for estimator in args.estimators:
            for seed in args.seeds:
                rec = latest.get((model, estimator, seed))
                if rec is None:
                    why = "recorded under other settings only" if (model, estimator, seed) in other else "no record"
                    missing.append(f"{model} {estimator} seed {seed}: {why}")
                    continue
                run = {k: rec[k] for k in FIGURES} | {"run_dir": Path(rec["run_dir"])}
                run |= {k: SimpleNamespace(**rec[k]) for k in SCORES}
                results.setdefault((model, estimator), []).append(run)
    return results, missing
