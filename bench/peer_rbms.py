"""log Z of one 784-500 RBM by our certified AIS and by the ``rbms`` package's AIS (0.5.0, ``pip install rbms``), the
same weights, one process.

    python bench/peer_rbms.py                                   # scikit-learn fits the RBM on 5,000 MNIST images
    python bench/peer_rbms.py --betas 10000 --chains 100 --runs 5

The RBM: scikit-learn's ``BernoulliRBM(n_components=500)`` fitted for ``--epochs`` on the first ``--train-examples``
fixed-binarised MNIST training images, imported on both sides (``nvil.models.importers.rbm_from_sklearn``; the
``rbms`` side as ``BBRBM(W, b, c)`` with the same energy). Each side runs ``--runs`` independent AIS estimates with
``--chains`` chains over ``--betas`` temperatures (``rbms``: linear betas from its independent model with the visible
biases; ours: ``estimator=ais``'s adaptive ladder from the training marginals' base-rate model, and its certificate;
``ours_plain``: the like-for-like run, linear betas from the base-rate model and no certificate, for the time ratio).
Printed: each side's mean log Z over runs with the standard error of that mean, ours with its hard lower bound and
reverse-AIS band, the difference, and the cost per chain-temperature. The ``rbms`` side reports one float per run and
nothing else; the spread over runs is the only error bar it has."""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import torch

from nvil.data import mnist_data
from nvil.estimators.ais import AIS
from nvil.models.importers import rbm_from_sklearn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train-examples", type=int, default=5000)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--betas", type=int, default=3000)
    p.add_argument("--chains", type=int, default=100)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    from rbms.bernoulli_bernoulli.classes import BBRBM
    from rbms.partition_function.ais import compute_partition_function_ais
    from sklearn.neural_network import BernoulliRBM

    data = mnist_data()
    train = data.split("train")[: a.train_examples]
    sk = BernoulliRBM(n_components=500, learning_rate=0.05, n_iter=a.epochs, random_state=0, batch_size=20)
    sk.fit(train.numpy().astype(np.float32))
    ours = rbm_from_sklearn(sk)
    theirs = BBRBM(ours.W.detach().clone(), ours.b.detach().clone(), ours.c.detach().clone())

    rows = {"ours": [], "ours_plain": [], "rbms": []}
    seconds = {"ours": 0.0, "ours_plain": 0.0, "rbms": 0.0}
    plain = AIS(num_chains=a.chains, num_betas=a.betas, schedule="linear", certify=False)
    certificates = []
    for r in range(a.runs):
        torch.manual_seed(r)
        t0 = time.perf_counter()
        c = AIS(num_chains=a.chains, num_betas=a.betas).certified_log_z(ours, train, train[:1000],
                                                                        torch.Generator().manual_seed(r), False)
        seconds["ours"] += time.perf_counter() - t0
        rows["ours"].append(c.log_z)
        certificates.append(c)
        t0 = time.perf_counter()
        rows["ours_plain"].append(plain.certified_log_z(ours, train, train[:1000], torch.Generator().manual_seed(r),
                                                        False).log_z)
        seconds["ours_plain"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        rows["rbms"].append(compute_partition_function_ais(a.chains, a.betas, theirs))
        seconds["rbms"] += time.perf_counter() - t0
    out = {"threads": torch.get_num_threads(), "chains": a.chains, "betas": a.betas, "runs": a.runs}
    for side, values in rows.items():
        v = np.array(values)
        out[side] = {"log_z_runs": [round(x, 3) for x in values], "mean": round(v.mean(), 3),
                     "stderr": round(v.std(ddof=1) / math.sqrt(len(v)), 3) if len(v) > 1 else None,
                     "us_per_chain_temperature": round(1e6 * seconds[side] / (a.runs * a.chains * a.betas), 2)}
    out["ours"]["certified"] = [c.certified for c in certificates]
    out["ours"]["log_z_band"] = [list(map(lambda x: None if x is None else round(x, 3), c.band())) for c in certificates]
    out["difference_ours_minus_rbms"] = round(out["ours"]["mean"] - out["rbms"]["mean"], 3)
    out["time_rbms_over_ours_plain"] = round(seconds["rbms"] / seconds["ours_plain"], 2)
    out["time_rbms_over_ours_certified"] = round(seconds["rbms"] / seconds["ours"], 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
