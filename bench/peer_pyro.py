"""NVIL (ours) vs a plain eager-PyTorch NVIL script vs Pyro's TraceGraph_ELBO on the same SBN-200, same data,
same start, same updates.

    python bench/peer_pyro.py                                  # 2000 updates, batch 20, all cores, device auto
    python bench/peer_pyro.py --updates 2000 --threads 1 --device cpu --val-examples 1000
    python bench/peer_pyro.py --preset adam --batch-size 100 --device cuda --updates 5000

One process, one SBN with 200 binary latents over the 784 pixels of fixed-binarised MNIST (``model=sbn
model.layers=[200]``, ``data=mnist``), built and initialised the way ``nvil.build`` builds it. Every other side
starts from deep copies of our freshly built generative model, inference network and input-dependent baseline, so
all start from identical parameters, and our estimators score every result.

- ours: ``learner=nvil`` with the input-dependent baseline (100 tanh units), constant baseline and variance
  normalisation (smoothing 0.8), ``learner.step(x)`` in a loop. On this model it takes the hand-derived gradients
  of ``nvil/learners/fused.py``; the row "ours, autograd path" is the same learner with them switched off, whose
  bounds must equal the fused row's (same random numbers, same updates to float rounding);
- plain: ``bench/plain_nvil.py``, the ~100-line NVIL a researcher would write (autograd through the surrogate,
  ``torch.distributions.Bernoulli`` log-probabilities, or ``--plain bce`` for ``binary_cross_entropy_with_logits``,
  one ``torch.optim`` optimiser), with the same signals and rates; its ``torch.bernoulli`` draws the same h from
  the same seed, so its bounds equal ours too (an independent check of our arithmetic);
- Pyro: ``SVI(model, guide, optim, TraceGraph_ELBO())`` over our module copies (``bench/peers.py: PyroSBN``), with
  ``infer={"baseline": {"nn_baseline": <the same 100-tanh MLP>, "nn_baseline_input": centred x,
  "use_decaying_avg_baseline": True, "baseline_beta": 0.8}}`` on the latent site.

``--preset sgd`` (default): the paper's protocol (configs/experiment/nvil_mnist_paper.yaml): plain SGD, model rate
0.006 on the minibatch mean, inference network x0.2, baseline x1, for every side; Pyro sums its loss over the
minibatch, so it gets these rates divided by the batch size (the same step; it trains with them: ELBO(10) -203 to
-163 nats in 2000 updates). ``--preset adam``: Adam, model rate 1e-3, inference x0.2, baseline x1
(configs/learner/nvil.yaml) for every side (Adam is almost invariant to Pyro's sum).

Both see the same minibatch sequence (``nvil.data.MinibatchStream``, seeded by ``--seed``). Reported per side:
updates per second of the updates alone (the minibatch fetch, the same for every side, is left out; the sides take
turns in blocks of ``--block`` updates, so a change in the machine's load falls on all of them alike; CUDA
synchronised), and the validation bounds of the trained models computed by our estimators
(``estimators/bounds.py``) on the same validation images with the same random numbers: the ELBO averaged over 10
samples from q (NVIL's Table 1 measure) and the importance-sampled bound L_K. The last rows give ours / peer in
updates per second and ours - peer in each bound (with the standard error of the paired per-example difference).

What Pyro cannot express exactly (so its gradient estimator is close to ours but not identical): variance
normalisation (TraceGraph_ELBO has no hook that rescales the score-function term, so Pyro runs without it); the
constant baseline (``use_decaying_avg_baseline`` keeps a running average of the cost itself, separately for every
position of the minibatch); the baseline loss (Pyro sums (l - baseline)^2 over the minibatch). Layer-wise signals
do not matter with one latent layer. Pyro runs with its validation off (``pyro.enable_validation(False)``). Its
compiled variant, ``JitTraceGraph_ELBO``, stops with "Cannot insert a Tensor that requires grad as a constant"
(Pyro 1.9.2) with this model and guide.

Our side runs ``--warmup`` untimed updates first (compilation with ``--accel compile``, CUDA warm-up), whose effects
are undone before the timed run (``bench/peers.py: warm_up``).
"""

from __future__ import annotations

import argparse
import copy
import time

from common import markdown_table, sync  # noqa: I001  (puts the repository root on sys.path)
from peers import (PyroSBN, accelerate_ours, compose_train, limit_threads, machine_line, plain_from_ours,
                   plain_to_ours, pyro_param_groups, warm_up)
from plain_nvil import PlainNVIL

import torch

from estimators.bounds import elbo, importance_sampled_bound
from nvil.build import build
from nvil.config import resolve_device
from nvil.data import MinibatchStream, take_rows
from nvil.ops import mean_and_stderr

PRESETS = {  # learner overrides: the paper's SGD protocol, or configs/learner/nvil.yaml's Adam
    "sgd": ["learner.optimizer=sgd", "learner.lr=0.006", "learner.inference_lr_scale=0.2"],
    "adam": ["learner.optimizer=adam", "learner.lr=0.001", "learner.inference_lr_scale=0.2"],
}


def build_sides(args, device: torch.device):
    """Data, our model / inference network / NVIL learner as ``nvil.build`` builds them, and untouched copies
    of the model, inference network and first baseline for the other sides, taken before any update."""
    cfg = compose_train([
        "model=sbn", f"model.layers=[{args.latents}]", "learner=nvil", "data=mnist", f"seed={args.seed}",
        f"trainer.batch_size={args.batch_size}", f"trainer.device={args.device}", "print_config=false",
        *PRESETS[args.preset],
    ])
    ours = build(cfg, device)

    def copies():
        return copy.deepcopy(ours.model), copy.deepcopy(ours.inference), copy.deepcopy(ours.learner.baselines)

    return cfg, ours, copies


def timed_sides(sides: dict, stream: MinibatchStream, updates: int, block: int, device) -> dict[str, float]:
    """Seconds of ``update(x)`` of every side on the stream's first ``updates`` minibatches, the sides taking turns
    ``block`` updates at a time (the device's work included; fetching the minibatches left out)."""
    seconds = dict.fromkeys(sides, 0.0)
    for start in range(0, updates, block):
        batches = [stream.batch(t) for t in range(start, min(start + block, updates))]
        for name, update in sides.items():
            sync(device)
            t0 = time.perf_counter()
            for x in batches:
                update(x)
            sync(device)
            seconds[name] += time.perf_counter() - t0
    return seconds


def pyro_svi(pyro_sbn: PyroSBN, cfg, seed: int = 0):
    """Pyro's ``svi.step`` with the preset's optimiser: Adam at our rates, or SGD at our rates divided by the batch
    size (Pyro sums its loss over the minibatch where ours averages: the same step)."""
    import pyro
    from pyro.infer import SVI, TraceGraph_ELBO

    pyro.clear_param_store()
    pyro.enable_validation(False)
    pyro.set_rng_seed(seed)
    lc = cfg.learner
    lr = float(lc.lr) if lc.optimizer == "adam" else float(lc.lr) / int(cfg.trainer.batch_size)
    optim = pyro_param_groups(lr, float(lc.inference_lr_scale), float(lc.baseline_lr_scale), lc.optimizer)
    return SVI(pyro_sbn.model, pyro_sbn.guide, optim, loss=TraceGraph_ELBO()).step


def score(model, inference, valid: torch.Tensor, args, device, iwae: bool = True) -> dict[str, torch.Tensor]:
    """Per-example ELBO(10) and (with ``iwae``) L_K on ``valid``, with random numbers that depend on the seed only."""
    out = {}
    bounds = (("elbo", elbo, 10), ("iwae", importance_sampled_bound, args.iwae_k))
    for name, fn, k in bounds if iwae else bounds[:1]:
        g = torch.Generator(device=device).manual_seed(args.seed + 1)
        out[name] = fn(model, inference, valid, k, generator=g).double().cpu()
    return out


def fmt(x: torch.Tensor) -> str:
    mean, se = mean_and_stderr(x)
    return f"{mean:.2f} ± {se:.2f}"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--updates", type=int, default=2000, help="parameter updates per side (default 2000)")
    p.add_argument("--batch-size", type=int, default=20, help="minibatch size (default 20; the paper's; also 100)")
    p.add_argument("--latents", type=int, default=200, help="latent units of the one-layer SBN (default 200)")
    p.add_argument("--preset", choices=tuple(PRESETS), default="sgd",
                   help="sgd: the paper's SGD protocol (default); adam: configs/learner/nvil.yaml's Adam")
    p.add_argument("--plain", choices=("distributions", "bce"), default="distributions",
                   help="the plain script's log-probabilities: torch.distributions (default) or BCE with logits")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads, the same for every side (default: all cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--val-examples", type=int, default=10000, help="validation images to score (default: all 10000)")
    p.add_argument("--iwae-k", type=int, default=100, help="K of the importance-sampled bound (default 100)")
    p.add_argument("--accel", choices=("none", "compile", "cudagraphs"), default="none",
                   help="our side's nvil.accel mode, as trainer.accel (default none: eager)")
    p.add_argument("--warmup", type=int, default=5,
                   help="untimed updates of our side before its timed run, then undone (default 5)")
    p.add_argument("--block", type=int, default=50, help="updates per turn of each side (default 50)")
    p.add_argument("--skip-pyro", action="store_true", help="leave Pyro out (no Pyro needed)")
    args = p.parse_args()
    if min(args.updates, args.batch_size, args.latents, args.val_examples, args.iwae_k, args.block) < 1:
        p.error("--updates, --batch-size, --latents, --val-examples, --iwae-k and --block must be positive")
    if (args.threads is not None and args.threads < 1) or args.warmup < 0:
        p.error("--threads must be positive and --warmup not negative")
    return args


def main() -> None:
    args = parse_args()
    limiter = limit_threads(args.threads)  # noqa: F841  (keeps the BLAS limit alive)
    device = resolve_device(args.device)
    if not args.skip_pyro:
        import pyro  # fail before the work, not after our side has run
    cfg, ours, copies = build_sides(args, device)
    learner, lc = ours.learner, cfg.learner
    valid = take_rows(ours.data.split("valid"), 0, args.val_examples)
    initial = score(ours.model, ours.inference, valid, args, device, iwae=False)  # also warms up the kernels
    autograd = copy.deepcopy(learner)  # the same start, optimiser and generator state; then the autograd path
    autograd.generator.set_state(learner.generator.get_state())
    autograd.fused = None
    plain_p, plain_q, plain_b = plain_from_ours(ours.model, ours.inference, learner.baselines[0], args.plain)
    plain = PlainNVIL(plain_p, plain_q, plain_b, float(lc.lr), float(lc.inference_lr_scale),
                      float(lc.baseline_lr_scale), lc.optimizer, float(lc.smoothing), args.seed)
    plain_scored = copies()[:2]
    pyro_copies = copies()
    accelerate_ours(learner, args.accel, device)
    stream = MinibatchStream(ours.data, args.batch_size, cfg.seed)
    warm_up(learner, [ours.model, ours.inference], [stream.batch(t) for t in range(args.warmup)], device)

    how = "fused" if learner.fused is not None else "autograd"
    accel = "" if args.accel == "none" else f", accel={args.accel}"
    sides = {"ours": (f"ours: NVIL (learner=nvil, {lc.optimizer}, {how} gradients{accel})", learner.step),
             "ours, autograd path": (f"ours: NVIL, autograd path ({lc.optimizer})", autograd.step),
             "plain": (f"plain eager PyTorch NVIL (bench/plain_nvil.py, {args.plain}, {lc.optimizer})", plain.step)}
    if not args.skip_pyro:
        svi_step = pyro_svi(PyroSBN(*pyro_copies, decaying_avg=True, baseline_beta=float(lc.smoothing)), cfg, args.seed)
        sides["Pyro"] = (f"Pyro {pyro.__version__}: TraceGraph_ELBO + nn_baseline ({lc.optimizer})", svi_step)
    seconds = timed_sides({k: update for k, (_, update) in sides.items()}, stream, args.updates, args.block, device)
    plain_to_ours(plain_p, plain_q, *plain_scored)
    trained = [(ours.model, ours.inference), (autograd.model, autograd.inference), plain_scored, pyro_copies[:2]]
    scores = {k: score(m, q, valid, args, device) for k, (m, q) in zip(sides, trained)}
    rows = [[label, str(args.updates), f"{seconds[k]:.1f}", f"{args.updates / seconds[k]:.1f}",
             fmt(scores[k]["elbo"]), fmt(scores[k]["iwae"])] for k, (label, _) in sides.items()]
    for k in list(sides)[1:]:
        rows.append([f"ours / {k} (rate), ours - {k} (bounds)", "", "", f"{seconds[k] / seconds['ours']:.2f}x",
                     fmt(scores["ours"]["elbo"] - scores[k]["elbo"]), fmt(scores["ours"]["iwae"] - scores[k]["iwae"])])
    print(f"\nSBN-{args.latents} on fixed-binarised MNIST, batch {args.batch_size}, --preset {args.preset}, seed "
          f"{args.seed}; {machine_line(device)}; validation bounds (nats) on {valid.shape[0]} images, initial "
          f"ELBO(10) {fmt(initial['elbo'])}:")
    print(markdown_table(["side", "updates", "train s", "updates/s", "val ELBO(10) ± se",
                          f"val IWAE({args.iwae_k}) ± se"], rows))


if __name__ == "__main__":
    main()
