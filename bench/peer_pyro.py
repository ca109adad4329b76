"""NVIL (ours) vs a plain eager-PyTorch NVIL script vs Pyro's TraceGraph_ELBO on the same SBN-200, same data,
same start, same updates.

    python bench/peer_pyro.py                                  # 2000 updates, batch 20, all cores, device auto
    python bench/peer_pyro.py --updates 2000 --threads 1 --device cpu --val-examples 1000
    python bench/peer_pyro.py --preset adam --batch-size 100 --device cuda --updates 5000

One process, one SBN with 200 binary latents over the 784 pixels of fixed-binarised MNIST (``model=sbn
model.layers=[200]``, ``data=mnist``), built and initialised the way ``nvil.app.build`` builds it. Every other side
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

``--isolate R`` runs every side in a fresh process of its own (this script with ``--only``), R rounds with the order
rotated each round, and reports the median updates per second of each side and the range of the per-round ratios,
so no side's timing depends on what another side did to the process (on a shared machine the ratio to Pyro can
spread as widely this way as in one process). The bounds come from the first round (every round trains
the same models from the same seeds); a child that does not time our side skips its compilation and warm-up.

Our side runs ``--warmup`` untimed updates first (compilation with ``--accel compile``, CUDA warm-up), whose effects
are undone before the timed run (``bench/peers.py: warm_up``).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import markdown_table, sync  # noqa: I001  (puts the repository root on sys.path)
from peers import (PyroSBN, accelerate_ours, compose_train, limit_threads, machine_line, plain_from_ours,
                   plain_to_ours, pyro_param_groups, warm_up)
from plain_nvil import PlainNVIL

import torch

from nvil.estimators.bounds import elbo, importance_sampled_bound
from nvil.app.build import build
from nvil.core.config import resolve_device
from nvil.data import MinibatchStream, take_rows
from nvil.core.ops import mean_and_stderr

ONLY = {"ours": "ours", "autograd": "ours, autograd path", "plain": "plain", "pyro": "Pyro"}  # --only -> side
PRESETS = {  # learner overrides: the paper's SGD protocol, or configs/learner/nvil.yaml's Adam
    "sgd": ["learner.optimizer=sgd", "learner.lr=0.006", "learner.inference_lr_scale=0.2"],
    "adam": ["learner.optimizer=adam", "learner.lr=0.001", "learner.inference_lr_scale=0.2"],
}


def build_sides(args, device: torch.device):
    """Data, our model / inference network / NVIL learner as ``nvil.app.build`` builds them, and untouched copies
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


def parse_args(argv: list[str] | None = None):
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
                   help="our side's nvil.backend.accel mode, as trainer.accel (default none: eager)")
    p.add_argument("--warmup", type=int, default=5,
                   help="untimed updates of our side before its timed run, then undone (default 5)")
    p.add_argument("--block", type=int, default=50, help="updates per turn of each side (default 50)")
    p.add_argument("--skip-pyro", action="store_true", help="leave Pyro out (no Pyro needed)")
    p.add_argument("--isolate", type=int, default=0, metavar="R",
                   help="run each side in a process of its own, R rounds in rotated order; medians (default 0: "
                        "all sides in this process, taking turns)")
    p.add_argument("--only", choices=tuple(ONLY), default=None, help=argparse.SUPPRESS)  # --isolate's child
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)  # where the child saves its side's result
    args = p.parse_args(argv)
    if min(args.updates, args.batch_size, args.latents, args.val_examples, args.iwae_k, args.block) < 1:
        p.error("--updates, --batch-size, --latents, --val-examples, --iwae-k and --block must be positive")
    if args.isolate < 0:
        p.error("--isolate must not be negative")
    if (args.only is None) != (args.result is None):
        p.error("--only and --result go together")
    if (args.threads is not None and args.threads < 1) or args.warmup < 0:
        p.error("--threads must be positive and --warmup not negative")
    return args


def run_sides(args) -> tuple[dict, dict, dict, dict]:
    """Build every side from the same start, time the chosen ones (all, or ``--only``'s) taking turns, and score
    them: labels, seconds, per-example bounds, and the initial ELBO(10)."""
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
    stream = MinibatchStream(ours.data, args.batch_size, cfg.seed)
    if args.only in (None, "ours"):  # an --isolate child timing another side needs neither
        accelerate_ours(learner, args.accel, device)
        warm_up(learner, [ours.model, ours.inference], [stream.batch(t) for t in range(args.warmup)], device)

    how = "fused" if learner.fused is not None else "autograd"
    accel = "" if args.accel == "none" else f", accel={args.accel}"
    sides = {"ours": (f"ours: NVIL (learner=nvil, {lc.optimizer}, {how} gradients{accel})", learner.step),
             "ours, autograd path": (f"ours: NVIL, autograd path ({lc.optimizer})", autograd.step),
             "plain": (f"plain eager PyTorch NVIL (bench/plain_nvil.py, {args.plain}, {lc.optimizer})", plain.step)}
    if not args.skip_pyro:
        svi_step = pyro_svi(PyroSBN(*pyro_copies, decaying_avg=True, baseline_beta=float(lc.smoothing)), cfg, args.seed)
        sides["Pyro"] = (f"Pyro {pyro.__version__}: TraceGraph_ELBO + nn_baseline ({lc.optimizer})", svi_step)
    trained = dict(zip(sides, [(ours.model, ours.inference), (autograd.model, autograd.inference), plain_scored,
                               pyro_copies[:2]]))
    if args.only is not None:
        sides = {ONLY[args.only]: sides[ONLY[args.only]]}
    seconds = timed_sides({k: update for k, (_, update) in sides.items()}, stream, args.updates, args.block, device)
    plain_to_ours(plain_p, plain_q, *plain_scored)
    scores = {k: score(*trained[k], valid, args, device) for k in sides}
    return {k: label for k, (label, _) in sides.items()}, seconds, scores, initial


def child_argv(args) -> list[str]:
    """The command line of an ``--isolate`` child: every option of ``args`` except ``--isolate`` itself."""
    argv = []
    for name, value in vars(args).items():
        flag = "--" + name.replace("_", "-")
        if name in ("isolate", "only", "result") or value is None or value is False:
            continue
        argv.append(flag if value is True else f"{flag}={value}")
    return argv


def isolated(args) -> tuple[dict, dict, dict, dict, dict]:
    """``--isolate``: each side in a fresh process per round, the order rotated; median seconds per side, the
    per-round ours / side ratios, and the first round's labels, bounds and initial ELBO."""
    keys = [k for k in ONLY if not (args.skip_pyro and k == "pyro")]
    child = child_argv(args)
    runs = {ONLY[k]: [] for k in keys}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.isolate):
            for k in keys[r % len(keys):] + keys[:r % len(keys)]:
                out = Path(tmp) / f"{k}{r}.pt"
                subprocess.run([sys.executable, __file__, *child, "--only", k, "--result", str(out)], check=True)
                runs[ONLY[k]].append(torch.load(out, weights_only=True))
    first = {k: v[0] for k, v in runs.items()}
    seconds = {k: statistics.median(run["seconds"] for run in v) for k, v in runs.items()}
    ratios = {k: [v[i]["seconds"] / runs["ours"][i]["seconds"] for i in range(args.isolate)] for k, v in runs.items()}
    return ({k: f["label"] for k, f in first.items()}, seconds, {k: f["scores"] for k, f in first.items()},
            first["ours"]["initial"], ratios)


def main() -> None:
    args = parse_args()
    if args.only is not None:
        labels, seconds, scores, initial = run_sides(args)
        (k,) = labels
        torch.save({"label": labels[k], "seconds": seconds[k], "scores": scores[k], "initial": initial}, args.result)
        return
    if args.isolate:
        labels, seconds, scores, initial, ratios = isolated(args)
    else:
        (labels, seconds, scores, initial), ratios = run_sides(args), None
    device = resolve_device(args.device)
    valid_n = next(iter(scores.values()))["elbo"].numel()
    rows = [[label, str(args.updates), f"{seconds[k]:.1f}", f"{args.updates / seconds[k]:.1f}",
             fmt(scores[k]["elbo"]), fmt(scores[k]["iwae"])] for k, label in labels.items()]
    for k in list(labels)[1:]:
        spread = "" if ratios is None else f" (rounds {min(ratios[k]):.2f}-{max(ratios[k]):.2f}x)"
        rows.append([f"ours / {k} (rate), ours - {k} (bounds)", "", "", f"{seconds[k] / seconds['ours']:.2f}x{spread}",
                     fmt(scores["ours"]["elbo"] - scores[k]["elbo"]), fmt(scores["ours"]["iwae"] - scores[k]["iwae"])])
    how = "one process, sides taking turns" if ratios is None else f"a process per side, {args.isolate} rounds, medians"
    print(f"\nSBN-{args.latents} on fixed-binarised MNIST, batch {args.batch_size}, --preset {args.preset}, seed "
          f"{args.seed}; {machine_line(device)}; {how}; validation bounds (nats) on {valid_n} images, initial "
          f"ELBO(10) {fmt(initial['elbo'])}:")
    print(markdown_table(["side", "updates", "train s", "updates/s", "val ELBO(10) ± se",
                          f"val IWAE({args.iwae_k}) ± se"], rows))


if __name__ == "__main__":
    main()
