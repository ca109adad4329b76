"""SAP (ours) vs scikit-learn's BernoulliRBM on the same 784-500 RBM, same data, same epochs, same rate.

    python bench/peer_sklearn.py                                         # 5 epochs of 50,000 images, all cores
    python bench/peer_sklearn.py --epochs 1 --train-examples 5000        # quick check
    python bench/peer_sklearn.py --ais-betas 14500 --ais-chains 100      # the paper's AIS schedule for both models
    python bench/peer_sklearn.py --device cuda --init sklearn
    python bench/peer_sklearn.py --no-reuse-hidden                       # learner=sap's default sweep order

One process. Both sides train an RBM with 500 binary hidden units on the same fixed-binarised MNIST training images
(``data=mnist``, the first ``--train-examples``; scikit-learn gets them as a float32 numpy array, our side keeps the
float32 tensor), with stochastic maximum likelihood / persistent CD: ``--batch-size`` examples per update (default
100), as many persistent chains, one block-Gibbs step per update, plain SGD at ``--lr`` on both sides.

- ours:  ``learner=sap model=rbm model.n_hidden=500 learner.num_particles=<batch> learner.k=1 learner.lr=<lr>
  learner.reuse_hidden=true`` (nvil/learners/sap.py), ``learner.step(x)`` over the minibatches in the order
  scikit-learn uses (the same ``gen_even_slices`` of the training array, in order, every epoch: BernoulliRBM.fit
  does not shuffle). ``reuse_hidden`` (``--reuse-hidden``, the default here) sweeps x | h then h | x, the order
  of BernoulliRBM's chain, and takes the negatives' p(h | v) from the sweep; ``--no-reuse-hidden`` runs
  learner=sap's default order, h | x then x | h, which computes p(h | v) of the negatives once more;
- scikit-learn: ``BernoulliRBM(n_components=500, learning_rate=<lr>, batch_size=<batch>, n_iter=<epochs>).fit(X)``.

The rates mean the same thing: ``BernoulliRBM._fit`` adds ``learning_rate / batch`` times the summed statistics
(v'p(h|v) of the data minus that of the negative particles, with p(h|v) and not a sample), i.e. ``learning_rate``
times the batch-averaged gradient; our SGD steps along the gradient of mean F(data) - mean F(particles), the same
batch-averaged gradient (F the free energy, whose derivative in W is -v p(h|v)'). Both use the mean hidden
activations for the statistics and one Gibbs step per update on ``batch`` persistent chains.

Reported per side: seconds per epoch of training alone (fit time / epochs for scikit-learn, which includes its
one-off input validation and initialisation; CUDA synchronised), and the test log p(v) of the trained model by
*our* AIS (estimators/ais.py, as ``estimator=ais`` computes it: forward AIS from the base-rate model of the
training marginals, ``--ais-chains`` chains over ``--ais-betas`` temperatures of the ``--ais-schedule`` spacing,
then log p(v) = -F(v) - log Z), after loading scikit-learn's ``components_``, ``intercept_hidden_`` and
``intercept_visible_`` into our ``BoltzmannMachine`` (``nvil.models.importers.rbm_from_sklearn``). Both AIS runs use the
same seed. The standard error of the mean test log p(v) combines the spread over test images and log Z's
standard error in quadrature (as ``evaluate.py`` reports it).

Differences that remain (fairness caveats):

- initialisation: with ``--init ours`` (default) our RBM starts as ``train.py`` starts it (W ~ N(0, 0.01^2), visible
  biases at the logit of the training marginals, hidden biases 0); scikit-learn always starts with W ~ N(0, 0.01^2)
  and zero biases. ``--init sklearn`` starts ours from scikit-learn's exact initial parameters (the same
  RandomState draw) instead;
- chains: ours start at random training images, scikit-learn's from h = 0 (so its first negatives are uniform
  noise); the random-number streams differ (torch vs numpy);
- scikit-learn runs on the CPU whatever ``--device`` says; only our side moves to CUDA;
- our side runs ``--warmup`` untimed updates first (compilation with ``--accel``, CUDA warm-up), whose effects
  are undone before the timed run (``bench/peers.py: warm_up``); scikit-learn's ``fit`` is timed whole.
"""

from __future__ import annotations

import argparse
import time

from common import markdown_table, sync  # noqa: I001  (puts the repository root on sys.path)
from peers import accelerate_ours, compose_train, limit_threads, machine_line, warm_up

import numpy as np
import torch

from nvil.estimators.ais_rbm import base_rate, free_energy_log_p, rbm_log_z

from nvil.estimators.annealing import SCHEDULES, schedule
from nvil.estimators.base import Result
from nvil.estimators.certify import DEFAULTS as CERTIFICATE
from nvil.app.build import build
from nvil.core.config import resolve_device
from nvil.core.ops import mean_and_stderr
from nvil.models.importers import rbm_from_sklearn


def build_ours(args, device: torch.device):
    """Data and our RBM + SAP learner as the training loop builds them (``nvil.app.build``)."""
    overrides = ["model=rbm", f"model.n_hidden={args.hidden}", "learner=sap", f"learner.lr={args.lr}",
                 f"learner.num_particles={args.batch_size}", "learner.k=1", "data=mnist", f"seed={args.seed}",
                 f"trainer.batch_size={args.batch_size}", f"trainer.device={args.device}", "print_config=false",
                 f"++learner.reuse_hidden={str(args.reuse_hidden).lower()}", f"trainer.accel={args.accel}"]
    if args.train_examples is not None:
        overrides.append(f"data.num_train={args.train_examples}")
    cfg = compose_train(overrides)
    ours = build(cfg, device)
    data, model, learner = ours.data, ours.model, ours.learner
    if args.init != "ours":
        # scikit-learn's own initial draw (BernoulliRBM.fit: RandomState(seed).normal(0, 0.01, (H, V))), zero biases
        w = np.random.RandomState(args.seed).normal(0, 0.01, (args.hidden, data.dim))
        with torch.no_grad():
            model.W.copy_(torch.from_numpy(w.T).to(model.W))
            model.b.zero_()
            model.c.zero_()
    return cfg, data, model, learner


def batch_slices(n: int, batch_size: int) -> list[slice]:
    """BernoulliRBM.fit's minibatches: ceil(n / batch) even slices of the rows, in order."""
    from sklearn.utils import gen_even_slices

    n_batches = int(np.ceil(n / batch_size))
    return list(gen_even_slices(n_batches * batch_size, n_batches, n_samples=n))


def train_ours(learner, train: torch.Tensor, args, device) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of the timed epochs."""
    slices = batch_slices(train.shape[0], args.batch_size)
    sync(device)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(args.epochs):
        for s in slices:
            learner.step(train[s])
    sync(device)
    return time.perf_counter() - t0, time.process_time() - c0


def train_sklearn(x: np.ndarray, args):
    from sklearn.neural_network import BernoulliRBM

    sk = BernoulliRBM(n_components=args.hidden, learning_rate=args.lr, batch_size=args.batch_size,
                      n_iter=args.epochs, random_state=args.seed)
    t0, c0 = time.perf_counter(), time.process_time()
    sk.fit(x)
    return sk, time.perf_counter() - t0, time.process_time() - c0


def ais_log_p(model, train: torch.Tensor, test: torch.Tensor, args, device):
    """(LogZ, Result with the per-example test log p(v)), by forward AIS as ``estimator=ais`` runs it."""
    g = torch.Generator(device=device).manual_seed(args.seed + 1)
    with torch.no_grad():
        base = base_rate(model, train)
        est = rbm_log_z(model, base, args.ais_chains, schedule(args.ais_schedule, args.ais_betas), g)
        log_p = free_energy_log_p(model, test, est.log_z, 1000)
    return est, Result("ais", log_p, est.seconds, args.seed, shared_stderr=est.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=5, help="passes over the training images (default 5)")
    p.add_argument("--train-examples", type=int, default=None, help="the first N training images (default: all 50,000)")
    p.add_argument("--batch-size", type=int, default=100, help="examples per update = persistent chains (default 100)")
    p.add_argument("--lr", type=float, default=0.01,
                   help="SGD rate on the batch-averaged gradient, both sides (default 0.01)")
    p.add_argument("--hidden", type=int, default=500, help="hidden units (default 500)")
    p.add_argument("--init", choices=("ours", "sklearn"), default="ours",
                   help="our RBM's start: train.py's (default) or scikit-learn's exact initial parameters")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto", help="our side's device")
    p.add_argument("--accel", choices=("auto", "none", "native", "compile", "cudagraphs"), default="auto",
                   help="our side's nvil.backend.accel mode, as trainer.accel (default auto, train.py's: on a CPU the "
                        "Gibbs draws by nvil.backend.native.bernoulli_; none: eager torch.rand)")
    p.add_argument("--reuse-hidden", action=argparse.BooleanOptionalAction, default=True,
                   help="our chain sweeps x | h then h | x and reuses the negatives' p(h | v), as BernoulliRBM "
                        "does (learner.reuse_hidden; default on)")
    p.add_argument("--warmup", type=int, default=5,
                   help="untimed updates of our side before its timed run, then undone (default 5)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads and BLAS threads (threadpoolctl), the same for both sides (default: all cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ais-chains", type=int, default=100, help="AIS chains for each log Z (default 100)")
    p.add_argument("--ais-betas", type=int, default=1000,
                   help="AIS temperatures (default 1000, quick; 14500 is the paper's schedule)")
    p.add_argument("--ais-schedule", choices=SCHEDULES, default="paper",
                   help="spacing of the temperatures (default paper: 500:4000:10000 over [0,.5], [.5,.9], [.9,1])")
    p.add_argument("--test-examples", type=int, default=None, help="test images to score (default: all 10,000)")
    args = p.parse_args()
    positive = (args.epochs, args.batch_size, args.hidden, args.ais_chains, args.ais_betas)
    if min(positive) < 1 or args.lr <= 0 or args.warmup < 0 or any(v is not None and v < 1 for v in
                                                (args.train_examples, args.test_examples, args.threads)):
        p.error("--epochs, --batch-size, --hidden, --ais-*, --lr, --train-examples, --test-examples and --threads "
                "must be positive (--warmup not negative)")
    limiter = limit_threads(args.threads)  # noqa: F841  (keeps the BLAS limit alive)
    device = resolve_device(args.device)
    import sklearn  # fail before the work, not after our side has run

    cfg, data, model, learner = build_ours(args, device)
    train = data.split("train")
    if args.batch_size > train.shape[0]:
        p.error(f"--batch-size {args.batch_size} exceeds the {train.shape[0]} training images")
    test = data.split("test")[: args.test_examples]
    x_np = train.cpu().numpy().astype(np.float32)

    accelerate_ours(learner, args.accel, device)
    warm_up(learner, [model], [train[s] for s in batch_slices(train.shape[0], args.batch_size)[: args.warmup]], device)
    ours_s, ours_cpu = train_ours(learner, train, args, device)
    print(f"ours: {args.epochs} epochs in {ours_s:.1f} s", flush=True)
    sk, sk_s, sk_cpu = train_sklearn(x_np, args)
    print(f"scikit-learn: {args.epochs} epochs in {sk_s:.1f} s", flush=True)
    print(f"s / epoch: ours {ours_s / args.epochs:.2f}, scikit-learn {sk_s / args.epochs:.2f}; "
          f"scikit-learn / ours = {sk_s / ours_s:.2f}x (process CPU s / epoch: ours {ours_cpu / args.epochs:.2f}, "
          f"scikit-learn {sk_cpu / args.epochs:.2f}, {sk_cpu / ours_cpu:.2f}x: steadier than wall time on a shared "
          f"machine, with one thread)", flush=True)
    sk_model = rbm_from_sklearn(sk, device=device)

    scores = {}
    for name, m in (("ours", model), ("sklearn", sk_model)):
        scores[name] = ais_log_p(m, train, test, args, device)
        print(f"AIS {name}: log Z {scores[name][0].log_z:.2f} in {scores[name][0].seconds:.1f} s", flush=True)

    min_ess = CERTIFICATE["min_ess_fraction"] * args.ais_chains  # the certificate's floor on the forward ESS

    def cells(est, res) -> list[str]:
        flag = " (not certified: ESS)" if est.ess < min_ess else ""
        return [f"{est.log_z:.2f} ± {est.stderr:.2f}", f"{est.ess:.1f}", f"{res.mean:.2f} ± {res.stderr:.2f}{flag}"]

    (oz, op), (sz, sp) = scores["ours"], scores["sklearn"]
    # The same test images on both sides: the paired per-example difference, plus both log Z errors.
    diff, diff_se = mean_and_stderr(op.log_p - sp.log_p)
    rows = [
        ["ours: SAP (learner=sap" + (", reuse_hidden" if args.reuse_hidden else "")
         + ("" if args.accel == "none" else f", accel={args.accel}") + ")", str(args.epochs),
         f"{ours_s / args.epochs:.2f}", *cells(oz, op)],
        [f"scikit-learn {sklearn.__version__}: BernoulliRBM", str(args.epochs), f"{sk_s / args.epochs:.2f}",
         *cells(sz, sp)],
        ["sklearn / ours (time), ours - sklearn (log p)", "", f"{sk_s / ours_s:.2f}x", "", "",
         f"{diff:+.2f} ± {(diff_se ** 2 + oz.stderr ** 2 + sz.stderr ** 2) ** 0.5:.2f}"],
    ]
    print(f"\nRBM {model.n_pixels}-{args.hidden} on {train.shape[0]} fixed-binarised MNIST images, "
          f"batch {args.batch_size}, "
          f"lr {args.lr}, init {args.init}, seed {args.seed}; ours on {machine_line(device)}; scikit-learn on the CPU "
          f"with {args.threads or 'all'} BLAS threads; AIS {args.ais_chains} chains x {args.ais_betas} betas "
          f"({args.ais_schedule}) on {test.shape[0]} test images:")
    print(markdown_table(["side", "epochs", "s / epoch", "log Z ± se", "AIS ESS", "test log p(v) ± se"], rows))
    if min(oz.ess, sz.ess) < min_ess:
        print(f"An AIS ESS below {CERTIFICATE['min_ess_fraction']:.0%} of the {args.ais_chains} chains (the "
              "certificate's floor, estimators/certify.py) leaves that log Z, and the log p difference, uncertified: rerun with more --ais-betas "
              "or --ais-chains (200 x 10000 kept both models above the floor in the runs of docs/benchmarks.md).")


if __name__ == "__main__":
    main()
