"""The Gaussian nets' closed-form HMC gradient (``nvil.models.gaussian_grad``) against autograd on the same eager
tempered density: one AIS-HMC run (``estimator=ais_hmc``'s move, fixed step size) on a GBN, the two timed in turn
in one process, so a busy machine slows both alike. Prints the median seconds of each and their ratio.

    python bench/gaussian_grad.py                       # GBN 784-64-64 (the reproductions' mnist2), 100 chains
    python bench/gaussian_grad.py --layers 64,64,64 --chains 1600 --betas 200 --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from nvil.estimators.annealing import ais, schedule
from nvil.estimators.model_paths import ContinuousLatent, fixed_kernel_path
from nvil.models.gaussian import GaussianBeliefNet


def run(net, x, betas, autograd: bool, seed: int) -> float:
    lm = ContinuousLatent(net, "ais_hmc", net.form)
    g = torch.Generator().manual_seed(seed)
    path = fixed_kernel_path(lm, x, betas, adapt=False, num_leapfrog=10, step_size=0.05, generator=g)
    if autograd:
        path._closed = None  # the general path: HMC differentiates the tempered density by autograd
    t0 = time.perf_counter()
    with torch.no_grad():
        log_w, _ = ais(path, path.start(g, 0.05), betas, g)
    assert torch.isfinite(log_w).all()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", default="64,64")
    p.add_argument("--form", default="auxiliary", choices=["auxiliary", "centred"])
    p.add_argument("--chains", type=int, default=100)
    p.add_argument("--betas", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    net = GaussianBeliefNet(784, [int(n) for n in a.layers.split(",")], form=a.form, init_scale=0.3)
    x = (torch.rand(a.chains, 784) < 0.2).float()
    betas = schedule("sigmoid", a.betas)
    times = {"closed_form": [], "autograd": []}
    for r in range(a.repeats + 1):
        for name in times:
            t = run(net, x, betas, name == "autograd", r)
            if r:  # the first round warms up
                times[name].append(t)
    closed, auto = statistics.median(times["closed_form"]), statistics.median(times["autograd"])
    print(f"GBN 784-{a.layers.replace(',', '-')} ({a.form}), {a.chains} chains x {a.betas} betas x 10 leapfrog, "
          f"{a.threads} thread(s): closed form {closed:.3f} s, autograd {auto:.3f} s, gain {auto / closed:.2f}x")


if __name__ == "__main__":
    main()
