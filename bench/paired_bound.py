"""Two checkpoints of a directed model scored on the same test images with the same draws from q, and their paired
difference with its standard error: the evidence that a run moved between two checkpoints.

    python bench/paired_bound.py bench/checkpoints/ws_sbn200.pt /work/runs/ws_sbn200/checkpoints/last.pt
    python bench/paired_bound.py A.pt B.pt --estimator iwae --num-samples 1000 --num-examples 1000

Each checkpoint gets the per-image bound (``--estimator elbo``: the mean of log p(x, h) - log q(h | x) over
``--num-samples`` draws h ~ q(. | x), the NVIL paper's Table 1 measure with 10; ``iwae``: log of the mean weight)
on the first ``--num-examples`` images of ``--split``, each batch of images drawing from a generator seeded by
``--seed`` and the batch's first row, as ``evaluate.py`` seeds them: two checkpoints of one architecture take the same
uniforms (common random numbers). The table gives each
checkpoint's mean -bound in nats with its standard error over images, and B - A in nats of log p with the standard error of the per-image differences. Two
checkpoints' means each carry an SE of ~0.3 nats on MNIST's 10,000 test images, but most of it is the images'
spread, shared by both: the paired SE is 5-10x smaller (the wake-sleep row of docs/reproductions.md: +1.14 ± 0.06
nats from update 3.53M to 4.97M, where the unpaired SE was 0.42 and the 100-image validation curve showed no change).

The two checkpoints must hold the same images in that split (the same data config); otherwise there is nothing to
pair and the script says so.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from common import markdown_table  # noqa: I001  (puts the repository root on sys.path)

import torch
from omegaconf import OmegaConf

from nvil.estimators.bounds import elbo, importance_sampled_bound
from nvil.data import build_model_data
from nvil.app.evaluation import load_model

BOUNDS = {"elbo": elbo, "iwae": importance_sampled_bound}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path, help="checkpoint A (the earlier one)")
    p.add_argument("b", type=Path, help="checkpoint B")
    p.add_argument("--estimator", choices=sorted(BOUNDS), default="elbo")
    p.add_argument("--num-samples", type=int, default=10, help="draws from q per image (default 10)")
    p.add_argument("--split", choices=["test", "valid", "train"], default="test")
    p.add_argument("--num-examples", type=int, default=None, help="the first N images of the split (default all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if args.num_samples < 1 or (args.num_examples is not None and args.num_examples < 1) or args.threads < 1:
        p.error("--num-samples, --num-examples and --threads must be positive")
    return args


def images(path: Path, payload: dict, split: str, num_examples: int | None) -> torch.Tensor:
    """The first ``num_examples`` images of ``split`` of the checkpoint's own data config."""
    data = build_model_data(OmegaConf.create(payload["config"]["data"]), torch.device("cpu"),
                            labels=bool(payload["config"]["model"].get("labels", False)))
    x = data.split(split)
    if num_examples is not None and num_examples > x.shape[0]:
        raise SystemExit(f"{path}: its {split} split has {x.shape[0]} images, fewer than --num-examples "
                         f"{num_examples}")
    return x if num_examples is None else x[:num_examples]


def per_image(path: Path, args) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(per-image bound [N], the images, the checkpoint's update) of one checkpoint."""
    model, inference, payload = load_model(path, torch.device("cpu"))
    if inference is None:
        raise SystemExit(f"{path}: a {payload['model_name']} checkpoint has no inference network to draw from "
                         "(the bounds here are for directed models)")
    x = images(path, payload, args.split, args.num_examples)
    bound = BOUNDS[args.estimator](model, inference, x, args.num_samples, generator=torch.Generator(),
                                   seed=args.seed)
    return bound, x, int(payload["step"])


def mean_se(v: torch.Tensor) -> tuple[float, float]:
    """Mean and its standard error over the entries of ``v`` (float64)."""
    v = v.double()
    return v.mean().item(), (v.std() / math.sqrt(v.numel())).item() if v.numel() > 1 else math.nan


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    bound_a, x_a, step_a = per_image(args.a, args)
    bound_b, x_b, step_b = per_image(args.b, args)
    if x_a.shape != x_b.shape or not torch.equal(x_a, x_b):
        raise SystemExit(f"{args.a} and {args.b} do not hold the same {args.split} images (different data "
                         "configs): nothing to pair")
    rows = []
    for path, step, bound in ((args.a, step_a, bound_a), (args.b, step_b, bound_b)):
        m, se = mean_se(bound)
        rows.append([str(path), f"{step:,}", f"{-m:.2f} ± {se:.2f}"])
    d, d_se = mean_se(bound_b - bound_a)
    measure = f"-{args.estimator.upper()}({args.num_samples})"
    print(f"{measure} on {x_a.shape[0]:,} {args.split} images, seed {args.seed}, the same draws for both:\n")
    print(markdown_table(["checkpoint", "update", f"{measure}, nats"], rows))
    print(f"\nB - A in log p: {d:+.3f} ± {d_se:.3f} nats (paired over images; {d / d_se:+.1f} SE)"
          if d_se > 0 else f"\nB - A in log p: {d:+.3f} nats (every image the same)")


if __name__ == "__main__":
    main()
