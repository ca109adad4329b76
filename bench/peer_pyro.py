"""NVIL (ours) vs Pyro's TraceGraph_ELBO on the same SBN-200, same data, same start, same updates.

    python bench/peer_pyro.py                                  # 2000 updates, batch 20, all cores, device auto
    python bench/peer_pyro.py --updates 200 --threads 1        # quick check
    python bench/peer_pyro.py --batch-size 100 --device cuda --updates 5000

One process, one SBN with 200 binary latents over the 784 pixels of fixed-binarised MNIST (``model=sbn
model.layers=[200]``, ``data=mnist``), built and initialised the way ``nvil.build`` builds it. Pyro's model and
guide are written over deep copies of our freshly built generative model, inference network and input-dependent
baseline (``bench/peers.py: PyroSBN``, parameters registered with ``pyro.module``), so both sides start from
identical parameters, and Pyro trains our own ``nn.Module`` classes, which our estimators then score.

- ours:  ``learner=nvil`` (configs/learner/nvil.yaml: Adam, model lr 1e-3, inference x0.2, baseline x1, an input-
  dependent baseline MLP with 100 tanh units, constant baseline and variance normalisation with smoothing 0.8),
  ``learner.step(x)`` in a loop;
- Pyro:  ``SVI(model, guide, pyro.optim.Adam, TraceGraph_ELBO())``, ``svi.step(x)`` in a loop, with
  ``infer={"baseline": {"nn_baseline": <the same 100-tanh MLP>, "nn_baseline_input": centred x,
  "use_decaying_avg_baseline": True, "baseline_beta": 0.8}}`` on the latent site and the same rates per parameter
  group (model 1e-3, guide 2e-4, baseline 1e-3).

Both see the same minibatch sequence (``nvil.data.MinibatchStream``, seeded by ``--seed``). Reported per side:
updates per second of the training loop alone (no setup or evaluation; CUDA synchronised), and the validation
bounds of the trained models computed by our estimators (``estimators/bounds.py``) on the same validation images
with the same random numbers: the ELBO averaged over 10 samples from q (NVIL's Table 1 measure) and the
importance-sampled bound L_K. The last row gives ours / Pyro in updates per second and ours - Pyro in each bound
(with the standard error of the paired per-example difference).

What Pyro cannot express exactly (so the two gradient estimators are close but not identical):

- variance normalisation: NVIL divides the centred learning signal by max(1, sqrt(v)), a running estimate of its
  variance (Mnih & Gregor 2014, Sec. 2.3.2). TraceGraph_ELBO has no hook that rescales the score-function term,
  so Pyro runs without it (nothing is faked in its place);
- the constant baseline: ours is c = a running mean (over minibatches) of the batch mean of l - b(x); Pyro's
  ``use_decaying_avg_baseline`` keeps a running average of the cost l itself, separately for every position of
  the minibatch (a [batch]-shaped parameter), and adds it to the network's output. Without it Pyro's baseline
  would have to learn an offset of ~ -500 nats through the network's output bias, which takes far too long;
- the baseline loss: Pyro sums (l - baseline)^2 over the minibatch; ours averages 0.5 (l - c - b)^2 / max(1,
  sqrt(v)) (Algorithm 1's update). Pyro sums every loss over the minibatch where ours averages: Adam is almost
  invariant to that constant factor, so the rates are kept equal;
- layer-wise learning signals do not matter here: with one latent layer the layer signal is the full signal,
  which is also Pyro's downstream cost for the site.

Our side runs ``--warmup`` untimed updates first (compilation with ``--accel compile``, CUDA warm-up), whose effects
on the parameters, optimiser, baselines and generator are undone before the timed run (``bench/peers.py: warm_up``).
Pyro runs with its validation off (``pyro.enable_validation(False)``, faster than its default), and with its
usual per-parameter ``pyro.optim.Adam`` (element-wise the same update as one torch Adam with parameter groups).
Its compiled variant, ``JitTraceGraph_ELBO``, is not used: with this model and guide it stops with "Cannot insert
a Tensor that requires grad as a constant" (Pyro 1.9.2).
"""

from __future__ import annotations

import argparse
import copy
import time

from common import markdown_table, sync  # noqa: I001  (puts the repository root on sys.path)
from peers import (PyroSBN, accelerate_ours, compose_train, limit_threads, machine_line, pyro_param_groups,
                   warm_up)

import torch

from estimators.bounds import elbo, importance_sampled_bound
from nvil.build import build
from nvil.config import resolve_device
from nvil.data import MinibatchStream, take_rows
from nvil.ops import mean_and_stderr


def build_sides(args, device: torch.device):
    """Data, our model / inference network / NVIL learner as ``nvil.build`` builds them, and untouched copies
    of the model, inference network and baselines for Pyro, taken before any update."""
    cfg = compose_train([
        "model=sbn", f"model.layers=[{args.latents}]", "learner=nvil", "data=mnist", f"seed={args.seed}",
        f"trainer.batch_size={args.batch_size}", f"trainer.device={args.device}", "print_config=false",
    ])
    ours = build(cfg, device)
    data, model, inference, learner = ours.data, ours.model, ours.inference, ours.learner
    pyro_side = (copy.deepcopy(model), copy.deepcopy(inference), copy.deepcopy(learner.baselines))
    return cfg, data, model, inference, learner, pyro_side


def timed_updates(update, stream: MinibatchStream, updates: int, device) -> float:
    """Seconds for ``update(x)`` on the stream's first ``updates`` minibatches (the device's work included)."""
    sync(device)
    t0 = time.perf_counter()
    for t in range(updates):
        update(stream.batch(t))
    sync(device)
    return time.perf_counter() - t0


def train_pyro(pyro_sbn: PyroSBN, cfg, stream: MinibatchStream, updates: int, seed: int, device) -> float:
    import pyro
    from pyro.infer import SVI, TraceGraph_ELBO

    pyro.clear_param_store()
    pyro.enable_validation(False)
    pyro.set_rng_seed(seed)
    lc = cfg.learner
    optim = pyro_param_groups(float(lc.lr), float(lc.inference_lr_scale), float(lc.baseline_lr_scale))
    svi = SVI(pyro_sbn.model, pyro_sbn.guide, optim, loss=TraceGraph_ELBO())
    return timed_updates(svi.step, stream, updates, device)


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--updates", type=int, default=2000, help="parameter updates per side (default 2000)")
    p.add_argument("--batch-size", type=int, default=20, help="minibatch size (default 20; the paper's; also 100)")
    p.add_argument("--latents", type=int, default=200, help="latent units of the one-layer SBN (default 200)")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads, the same for both sides (default: all cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--val-examples", type=int, default=10000, help="validation images to score (default: all 10000)")
    p.add_argument("--iwae-k", type=int, default=100, help="K of the importance-sampled bound (default 100)")
    p.add_argument("--accel", choices=("none", "compile", "cudagraphs"), default="none",
                   help="our side's nvil.accel mode, as trainer.accel (default none: eager)")
    p.add_argument("--warmup", type=int, default=5,
                   help="untimed updates of our side before its timed run, then undone (default 5)")
    p.add_argument("--skip-pyro", action="store_true", help="time our side only (no Pyro needed)")
    args = p.parse_args()
    if min(args.updates, args.batch_size, args.latents, args.val_examples, args.iwae_k) < 1:
        p.error("--updates, --batch-size, --latents, --val-examples and --iwae-k must be positive")
    if (args.threads is not None and args.threads < 1) or args.warmup < 0:
        p.error("--threads must be positive and --warmup not negative")
    limiter = limit_threads(args.threads)  # noqa: F841  (keeps the BLAS limit alive)
    device = resolve_device(args.device)
    if not args.skip_pyro:
        import pyro  # fail before the work, not after our side has run
    else:
        pyro = None

    cfg, data, model, inference, learner, (pm, pi, pb) = build_sides(args, device)
    valid = take_rows(data.split("valid"), 0, args.val_examples)
    initial = score(model, inference, valid, args, device, iwae=False)  # also warms up the kernels both sides use
    accelerate_ours(learner, args.accel, device)
    stream = MinibatchStream(data, args.batch_size, cfg.seed)
    warm_up(learner, [model, inference], [stream.batch(t) for t in range(args.warmup)], device)

    ours_s = timed_updates(learner.step, stream, args.updates, device)
    ours = score(model, inference, valid, args, device)
    print(f"ours: {args.updates} updates in {ours_s:.1f} s", flush=True)
    label = "ours: NVIL (learner=nvil" + ("" if args.accel == "none" else f", accel={args.accel}") + ")"
    rows = [[label, str(args.updates), f"{ours_s:.1f}", f"{args.updates / ours_s:.1f}", fmt(ours["elbo"]),
             fmt(ours["iwae"])]]
    if pyro is not None:
        pyro_sbn = PyroSBN(pm, pi, pb, decaying_avg=True, baseline_beta=float(cfg.learner.smoothing))
        pyro_s = train_pyro(pyro_sbn, cfg, MinibatchStream(data, args.batch_size, cfg.seed), args.updates,
                            args.seed, device)
        theirs = score(pm, pi, valid, args, device)
        print(f"Pyro: {args.updates} updates in {pyro_s:.1f} s", flush=True)
        rows.append([f"Pyro {pyro.__version__}: TraceGraph_ELBO + nn_baseline", str(args.updates), f"{pyro_s:.1f}",
                     f"{args.updates / pyro_s:.1f}", fmt(theirs["elbo"]), fmt(theirs["iwae"])])
        rows.append(["ours / Pyro (rate), ours - Pyro (bounds)", "", "", f"{pyro_s / ours_s:.1f}x",
                     fmt(ours["elbo"] - theirs["elbo"]), fmt(ours["iwae"] - theirs["iwae"])])
    print(f"\nSBN-{args.latents} on fixed-binarised MNIST, batch {args.batch_size}, seed {args.seed}; "
          f"{machine_line(device)}; validation bounds (nats) on {valid.shape[0]} images, initial ELBO(10) "
          f"{fmt(initial['elbo'])}:")
    print(markdown_table(["side", "updates", "train s", "updates/s", "val ELBO(10) ± se",
                          f"val IWAE({args.iwae_k}) ± se"], rows))


if __name__ == "__main__":
    main()
