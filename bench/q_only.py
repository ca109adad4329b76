"""Is the inference network what holds a directed model's bound back? Train q alone from a checkpoint and watch.

    python bench/q_only.py bench/checkpoints/nvil_sbn200_ar.pt --q-lr 0.0003,0.0012,0.006,0.024 --updates 100000

Loads a training checkpoint (model, inference network, learner and optimiser state, as ``trainer.resume`` would),
sets the model's rate to 0 (its parameters are checked unchanged at the end) and q's to each ``--q-lr`` in turn, and
runs the checkpoint's own learner for ``--updates`` more updates on fresh minibatches, printing -ELBO(10) on the
first ``--examples`` test images every ``--every`` updates. If q were short of budget or at a poor rate, some rate
would lower -ELBO towards the model's -IWAE (``evaluate.py ... estimator=iwae``); if none does, q sits at the floor
its estimator's noise sets for this model, and the gap ELBO - IWAE (q's KL to the posterior) is not q's schedule.
One thread; a diagnostic for the reproductions (docs/reproductions.md, note 1.2), not a test.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import common  # puts the repository on sys.path; markdown_table
import torch
from omegaconf import OmegaConf

from nvil.core import distributed
from nvil.app.build import build
from nvil.data import MinibatchStream, take_rows
from nvil.backend.denormals import flushed_denormals
from nvil.app.divergence import DivergenceMonitor
from nvil.app.resume import restore
from nvil.estimators.validation import validate


def q_only(checkpoint: Path, q_lr: float, updates: int, every: int, examples: int,
           batch_size: int | None = None) -> list[tuple[int, float]]:
    """[(update, -ELBO(10) on the test images)] while q alone trains at ``q_lr`` from ``checkpoint``, on minibatches
    of ``batch_size`` (None: the run's)."""
    saved = torch.load(checkpoint, weights_only=True, map_location="cpu")
    cfg = OmegaConf.create(saved["config"])
    device = torch.device("cpu")
    run = build(cfg, device)
    restore(checkpoint, OmegaConf.to_container(cfg, resolve=True), run, DivergenceMonitor(20.0), device,
            distributed.setup())
    groups = {g.get("name"): g for g in run.learner.optimizer.param_groups}
    if "model" not in groups or "inference" not in groups:
        raise SystemExit(f"error: {checkpoint}'s learner has no 'model' and 'inference' parameter groups")
    groups["model"]["lr"], groups["inference"]["lr"] = 0.0, q_lr
    frozen = [p.detach().clone() for p in run.model.parameters()]
    test = take_rows(run.data.split("test"), 0, examples)
    batch_size = batch_size or cfg.trainer.batch_size
    stream = MinibatchStream(run.data, batch_size, cfg.seed + 17)  # minibatches the run did not see
    curve = []
    for i in range(updates + 1):
        if i % every == 0:
            curve.append((i, -float(validate(run.model, run.inference, test, test, 10, 0)["val/elbo"])))
        if i < updates:
            run.learner.step(stream.batch(i), diagnostics=False)
    if not all(torch.equal(a, b) for a, b in zip(frozen, run.model.parameters())):
        raise SystemExit("error: the model's parameters moved: its rate did not reach the learner's update")
    return curve


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--q-lr", default="0.0012", help="comma list of q's rates to try in turn")
    p.add_argument("--updates", type=int, default=100_000)
    p.add_argument("--every", type=int, default=20_000)
    p.add_argument("--examples", type=int, default=1000, help="test images scored (default 1,000)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="q's minibatch (default: the run's); at q's rate a larger one divides the gradient's noise")
    args = p.parse_args(argv)
    if not args.checkpoint.is_file():
        raise SystemExit(f"error: no checkpoint at {args.checkpoint}")
    torch.set_num_threads(1)
    rates = [float(r) for r in args.q_lr.split(",")]
    with flushed_denormals(True, "q_only"):
        rows = {}
        for rate in rates:
            started = time.perf_counter()
            rows[rate] = q_only(args.checkpoint, rate, args.updates, args.every, args.examples, args.batch_size)
            print(f"q lr {rate:g}: {time.perf_counter() - started:.0f} s", flush=True)
    steps = [u for u, _ in rows[rates[0]]]
    print("\n" + common.markdown_table(["q lr", *(f"{u:,}" for u in steps)],
                                       [[f"{rate:g}", *(f"{v:.2f}" for _, v in curve)] for rate, curve in rows.items()]))
    print(f"\n-ELBO(10) on the first {args.examples} test images, model frozen, by q's updates (columns), "
          f"minibatches of {args.batch_size or 'the run'}")


if __name__ == "__main__":
    main()
