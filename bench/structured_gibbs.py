"""The structured sequential-Gibbs sweep (``SequentialGibbs`` over an SBN's ``BinaryDensity``) against the general
one (``FlipGibbs``: the conditional of each unit from two values of log P*(v, h), what a user's binary-latent model
gets), the choice ``nvil.mcmc.flip_gibbs.site_gibbs`` makes, on the same chains in one process:

    python bench/structured_gibbs.py --threads 1 --rounds 5

Row: one sweep over the 200 latents of an SBN-200 given 784 binary pixels (weights N(0, 0.1^2), the pixels
Bernoulli(0.5)), ``--chains`` chains; the structured sweep eager (``accel=none``) and as chosen (``accel=auto``).
Rounds alternate the kernels; each gets the median of its rounds, and the ratio is general / structured.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from omegaconf import OmegaConf

from nvil.mcmc.flip_gibbs import FlipGibbs, LogDensity
from nvil.mcmc.sequential_gibbs import SequentialGibbs
from nvil.models import build_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--chains", type=int, default=50)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, _ = build_model(OmegaConf.create({"name": "sbn", "layers": [200], "n_latent": 200}), 784)
    with torch.no_grad():
        for w in model.parameters():
            w.normal_(0.0, 0.1)
        v = torch.bernoulli(torch.full((args.chains, 784), 0.5))
        joint = model.latent_density(v)
        h = torch.bernoulli(torch.full((args.chains, 200), 0.5))
    kernels = {"structured (accel=none)": SequentialGibbs([(1.0, joint)], accel="none"),
               "structured (accel=auto)": SequentialGibbs([(1.0, joint)], accel="auto"),
               "general (FlipGibbs)": FlipGibbs([(1.0, LogDensity(joint.log_prob, joint.n_units))])}
    times = {k: [] for k in kernels}
    for _ in range(args.rounds):
        for name, kernel in kernels.items():
            g = torch.Generator().manual_seed(1)
            kernel.sweep(h, generator=g)  # warm
            t0 = time.perf_counter()
            for _ in range(3):
                kernel.sweep(h, generator=g)
            times[name].append((time.perf_counter() - t0) / 3)
    general = statistics.median(times["general (FlipGibbs)"])
    print(f"one sweep, SBN-200 given 784 pixels, {args.chains} chains, {args.threads} thread(s), median of "
          f"{args.rounds} rounds")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"  {name:26s} {1000 * m:9.2f} ms   general / this = {general / m:6.2f}x")


if __name__ == "__main__":
    main()
