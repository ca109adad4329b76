"""Batched HMC on a Gaussian belief net's posterior p(z | x), one chain per datapoint: ours (nvil/mcmc/hmc.py,
torch) against BlackJAX (``blackjax.hmc``, jax.vmap over chains, jax.lax.scan over iterations, jax.jit, CPU).

    python bench/peer_blackjax.py                                  # 1000 MNIST digits, 784-64-64, centred, CPU
    python bench/peer_blackjax.py --chains 1000 --iterations 400 --repeat 3 --threads 2
    python bench/peer_blackjax.py --form auxiliary --checkpoint outputs/run/checkpoints/last.pt --device cuda

The target: the MNIST preset's net (experiment=mcem_gbn_mnist: latent layers 64-64, Bernoulli visibles, 784
pixels) with fixed random parameters (the model's own N(0, 0.1^2) draw under ``--seed``, the visible bias set
from the training mean as training does), or a checkpoint's; the data: the first ``--chains`` training digits,
binarised by our data pipeline (``nvil.data.build_model_data``, fixed binarisation). Chain c targets
p(z | x_c) in ``--form`` (centred: the state is z; auxiliary: eps).

Both samplers run the same kernel: an identity mass matrix, ``--leapfrog`` leapfrog steps of a fixed
``--step-size`` (the preset's 5 and Kingma 2013's 0.01), a Metropolis accept per chain, ``--iterations``
transitions, from the same starting points (a prior draw under ``--seed``, the same for both), each transition
costing L gradients (both cache the density and gradient at the current point). Ours: ``HMC.step`` with a
per-chain step-size tensor, all chains in one batched call per transition (no loop over chains), on the model's
closed-form gradient (``model.posterior``, as MCEM and ais_hmc run it; ``--gradient autograd``: autograd through
``model.log_joint``, the general path), which computes the log density at the end point only. BlackJAX:
``blackjax.hmc(logdensity_fn, step_size, inverse_mass_matrix=ones, num_integration_steps=L)`` for one chain, its
log density the JAX port of our log joint (bench/jax_gbn.py) with the chain's own digit, ``jax.vmap`` over the
chains, ``jax.lax.scan`` over the iterations, the whole run one ``jax.jit`` program. Before anything is timed, the
port's log density and gradient are checked against our model's (autograd) at a few points (asserted).

Timing. BlackJAX's program is compiled ahead of time (``jit(...).lower(...).compile()``, reported as compile
seconds); a separately compiled ``--warmup`` -iteration program of the same shapes runs first, untimed. Ours runs
``--warmup`` transitions untimed first. Both include the initial density-and-gradient evaluation and the same
on-line diagnostics (per-chain sums of acceptance probabilities, divergences and, over the second half, the log
joint). With ``--repeat R`` the two sides alternate R times from the same start with the same seeds and the
median time is reported, so a first execution's one-off costs cannot decide the result. Rate = chains x
iterations x L / seconds (leapfrog steps, = gradient evaluations, per second).

Threads. ``--threads N`` (default: every core this process may use) gives both sides the same N cores: the
process is pinned to N cores (``os.sched_setaffinity``, before torch and jax start their thread pools; XLA sizes
its CPU pool from the affinity mask), ``torch.set_num_threads(N)``, OMP_NUM_THREADS=MKL_NUM_THREADS=N, and for
N = 1 XLA_FLAGS gets ``--xla_cpu_multi_thread_eigen=false``. (``intra_op_parallelism_threads=N`` is not an XLA
flag in this jaxlib; the affinity mask is what limits XLA.) ``--omp-wait-policy passive`` sets OMP_WAIT_POLICY
for torch's OpenMP threads, which otherwise spin at barriers: on cores shared with other busy processes that spin
can cost ours several times over (XLA's thread pool is not OpenMP and is unaffected); the header prints the
policy and the load average. BlackJAX always runs on the CPU; ``--device cuda`` moves only ours (the
verification and the start points stay identical).

Sanity: both sides sample the same Markov chain law from the same start, so the chain-averaged acceptance rate
and the mean log joint over the second half have the same expectation at every iteration (burn-in included):
their difference is reported in standard errors over the independent chains (|z| > 4 is flagged).
"""

from __future__ import annotations

import argparse
import os
import sys


def _pin_threads(argv: list[str]) -> int:
    """Give this process ``--threads`` cores before torch or jax is imported (see the module docstring)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--omp-wait-policy", default="default")
    known = p.parse_known_args(argv)[0]
    n = known.threads
    if known.omp_wait_policy in ("passive", "active"):
        os.environ["OMP_WAIT_POLICY"] = known.omp_wait_policy.upper()
    cores = sorted(os.sched_getaffinity(0))
    if n is None:
        n = len(cores)
    if not 1 <= n <= len(cores):
        sys.exit(f"--threads must be in [1, {len(cores)}] (the cores this process may use), got {n}")
    if n < len(cores):
        os.sched_setaffinity(0, cores[:n])
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(n)
    if n == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
    return n


if __name__ == "__main__":
    THREADS = _pin_threads(sys.argv[1:])

import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

from common import CONFIG_DIR, ROOT, cpu_name, markdown_table, sync  # noqa: E402,F401,I001

import numpy as np  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

import blackjax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jax_gbn  # noqa: E402
import jaxlib  # noqa: E402

from nvil.models import build_model  # noqa: E402
from nvil.core.config import resolve_device  # noqa: E402
from nvil.data import build_model_data  # noqa: E402
from nvil.app.evaluation import load_model  # noqa: E402
from nvil.mcmc.hmc import HMC  # noqa: E402

PRESET = "experiment=mcem_gbn_mnist"
CHECK_POINTS = 8  # points at which the JAX log density and gradient are checked against ours


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chains", type=int, default=1000, help="chains = MNIST training digits (default 1000)")
    p.add_argument("--iterations", type=int, default=200, help="HMC transitions per chain (default 200)")
    p.add_argument("--leapfrog", type=int, default=None, help="leapfrog steps L (default: the preset's num_leapfrog, 5)")
    p.add_argument("--step-size", type=float, default=None, help="leapfrog step size (default: the preset's 0.01)")
    p.add_argument("--form", choices=("centred", "auxiliary"), default="centred")
    p.add_argument("--layers", default=None, help="latent layer sizes, e.g. 64,64 (default: the preset's)")
    p.add_argument("--checkpoint", default=None, help="a Gaussian net checkpoint (default: random parameters)")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu", help="ours only; BlackJAX stays on the CPU")
    p.add_argument("--threads", type=int, default=None, help="cores for both sides (default: all this process may use)")
    p.add_argument("--omp-wait-policy", choices=("default", "passive", "active"), default="default",
                   help="OMP_WAIT_POLICY for torch's OpenMP pool (default: left as the environment has it); passive "
                        "stops idle threads spinning, which matters when other processes share the cores")
    p.add_argument("--accel", choices=("none", "compile", "cudagraphs"), default="none",
                   help="ours: HMC(accel=...) from nvil.backend.accel, torch.compile of the gradient (default none: eager)")
    p.add_argument("--gradient", choices=("closed", "autograd"), default="closed",
                   help="ours: the model's closed-form gradient (model.posterior, default) or autograd of log_joint")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=5, help="untimed warm-up transitions per side (default 5)")
    p.add_argument("--repeat", type=int, default=1, help="timed runs per side, alternating; the median is reported")
    args = p.parse_args()
    for key in ("chains", "iterations", "warmup", "repeat"):
        if getattr(args, key) < 1:
            p.error(f"--{key} must be positive")
    if args.iterations < 2:
        p.error("--iterations must be at least 2 (the summaries use the second half)")
    return args


# ---- the target ---------------------------------------------------------------------------------------

def build_target(args, device, dtype):
    """(model, data x [chains, n_visible] on ``device``, description)."""
    if args.checkpoint:
        model, _, payload = load_model(args.checkpoint, device)
        if not getattr(model, "is_continuous_latent", False):
            sys.exit(f"{args.checkpoint} holds a {type(model).__name__}, not a Gaussian net")
        data_cfg = OmegaConf.create(payload["config"]["data"])
        model_cfg = OmegaConf.create(payload["config"]["model"])
        what = f"checkpoint {args.checkpoint}"
    else:
        overrides = [PRESET, f"seed={args.seed}"]
        if args.layers:
            overrides.append(f"model.layers=[{args.layers}]")
        if args.chains > 10_000:  # the preset trains on 10,000 digits
            overrides.append("data.num_train=null")
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("train", overrides=overrides)
        data_cfg, model_cfg = cfg.data, cfg.model
        model = None
        what = f"random parameters (N(0, {model_cfg.init_scale}^2) under seed {args.seed})"
    data = build_model_data(data_cfg, torch.device("cpu"), labels=bool(model_cfg.get("labels", False)))
    if model is None:
        torch.manual_seed(args.seed)
        model, _ = build_model(model_cfg, data.dim)
        model.init_visible_bias(data.train_mean())
    train = data.split("train")
    if args.chains > train.shape[0]:
        sys.exit(f"--chains {args.chains} exceeds the {train.shape[0]} training rows")
    x = train[:args.chains].to(device=device, dtype=dtype)
    model.to(device=device, dtype=dtype).eval()
    return model, x, what


def start_points(model, chains: int, form: str, seed: int, dtype) -> torch.Tensor:
    """A prior draw on the CPU (eps, mapped to z in centred form): the same numbers for both sides and any device."""
    g = torch.Generator().manual_seed(seed + 7919)
    eps = torch.randn(chains, model.n_latent, generator=g, dtype=dtype)
    if form == "auxiliary":
        return eps
    w = next(model.parameters())
    with torch.no_grad():
        return model.to_centred(eps.to(w.device)).cpu()


# ---- the two samplers -----------------------------------------------------------------------------------

def make_ours(model, x, form: str, L: int, accel: str, gradient: str) -> HMC:
    """Our kernel on p(x_c, s) for every chain c at once: the model's closed-form gradient (``model.posterior``,
    what MCEM and ais_hmc run) or autograd through ``model.log_joint``; ``accel`` (nvil.backend.accel) other than none
    compiles what computes the gradient (the transition stays eager)."""
    kwargs = {} if accel == "none" else {"accel": accel}
    target = model.posterior(x, form) if gradient == "closed" else (lambda s: model.log_joint(x, s, form))
    return HMC(target, L, **kwargs)


@torch.no_grad()
def run_ours(hmc: HMC, s0, step_size, iterations, seed):
    """``iterations`` transitions of every chain from s0; per-chain (mean accept prob, mean log joint over the
    second half, divergences, final log joint). Everything stays on the device until the end."""
    device = s0.device
    g = torch.Generator(device=device).manual_seed(seed)
    eps = torch.full((s0.shape[0],), step_size, device=device, dtype=s0.dtype)  # one step size per chain
    state = hmc.init(s0)
    acc = torch.zeros_like(eps)
    lj = torch.zeros_like(eps)
    div = torch.zeros_like(eps)
    half = iterations // 2
    for it in range(iterations):
        state, info = hmc.step(state, generator=g, step_size=eps)
        acc += info.accept_prob
        div += info.divergent
        if it >= half:
            lj += state.log_density
    return acc / iterations, lj / (iterations - half), div, state.log_density


def make_blackjax(log_joint, step_size: float, L: int, iterations: int, dim: int, dtype):
    """A jitted ``run(params, xs [chains, D], z0s [chains, dim], keys [chains]) -> the same summaries as
    ``run_ours``: jax.vmap over chains of one chain's jax.lax.scan over ``iterations`` blackjax.hmc steps."""
    half = iterations // 2

    def one_chain(params, x, z0, key):
        hmc = blackjax.hmc(lambda z: log_joint(params, x, z), step_size, jnp.ones(dim, dtype), L)
        zero = jnp.zeros((), dtype)

        def body(carry, i):
            state, acc, lj, div = carry
            state, info = hmc.step(jax.random.fold_in(key, i), state)
            acc = acc + info.acceptance_rate
            div = div + info.is_divergent.astype(dtype)
            lj = lj + jnp.where(i >= half, state.logdensity, zero)
            return (state, acc, lj, div), None

        (state, acc, lj, div), _ = jax.lax.scan(body, (hmc.init(z0), zero, zero, zero), jnp.arange(iterations))
        return acc / iterations, lj / (iterations - half), div, state.logdensity

    return jax.jit(jax.vmap(one_chain, in_axes=(None, 0, 0, 0)))


# ---- report ---------------------------------------------------------------------------------------------

def mean_se(v: np.ndarray) -> tuple[float, float]:
    return float(v.mean()), float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")


def main() -> None:
    args = parse_args()
    threads = THREADS
    torch.set_num_threads(threads)
    device = resolve_device(args.device)
    tdtype = getattr(torch, args.dtype)
    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    ndtype = np.dtype(args.dtype)

    model, x, what = build_target(args, device, tdtype)
    hmc_defaults = OmegaConf.load(CONFIG_DIR / "experiment" / "mcem_gbn_mnist.yaml").learner
    L = args.leapfrog or int(hmc_defaults.num_leapfrog)
    step_size = args.step_size or float(hmc_defaults.step_size)
    chains, iters, form = args.chains, args.iterations, args.form
    s0_cpu = start_points(model, chains, form, args.seed, tdtype)
    s0 = s0_cpu.to(device)

    jax_cpu = jax.devices("cpu")[0]
    print(f"# Batched HMC on p(z | x), one chain per digit: ours (torch) vs BlackJAX\n"
          f"machine: {cpu_name()}, {os.cpu_count()} cores, pinned to {sorted(os.sched_getaffinity(0))}; "
          f"{platform.system()} {platform.release()}; python {platform.python_version()}\n"
          f"threads: torch {torch.get_num_threads()} (set_num_threads), XLA via affinity mask; "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}; load average {os.getloadavg()[0]:.1f}\n"
          f"versions: torch {torch.__version__}, jax {jax.__version__}, jaxlib {jaxlib.__version__}, "
          f"blackjax {blackjax.__version__}, numpy {np.__version__}\n"
          f"devices: ours {device}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
          + f", BlackJAX {jax_cpu.platform} ({jax_cpu.device_kind})\n"
          f"target: {type(model).__name__} {model.n_visible}-{'-'.join(str(n) for n in model.latent_sizes[::-1])} "
          f"({model.visible} visibles, {model.nonlinearity}), {form} form, {what}, dtype {args.dtype}\n"
          f"run: {chains} chains x {iters} iterations x L={L} leapfrog steps of {step_size}, warm-up {args.warmup}, "
          f"repeat {args.repeat}, seed {args.seed}, ours accel={args.accel}, gradient={args.gradient}", flush=True)

    # ---- the port equals our log joint (value and gradient) --------------------------------------------
    spec, params = jax_gbn.export(model, ndtype)
    log_joint = jax_gbn.make_log_joint(spec, form)
    k = min(CHECK_POINTS, chains)
    g = torch.Generator().manual_seed(args.seed + 1)
    pts = torch.cat([s0_cpu[:k], s0_cpu[:k] + 0.3 * torch.randn(k, model.n_latent, generator=g, dtype=tdtype)])
    err = jax_gbn.compare(model, torch.cat([x[:k], x[:k]]), pts.to(device), form)
    # float32 on a GPU sums in another order than XLA on the CPU: relative gradient errors reach ~1.5e-4 there
    tol = (1e-4 if device.type == "cpu" else 1e-3) if args.dtype == "float32" else 1e-9
    print(f"check at {2 * k} points: JAX vs ours, max relative error of log p(x, z) {err['value']:.1e} "
          f"(|log p| up to {err['max_abs_value']:.0f}), of its gradient {err['grad']:.1e} "
          f"(|grad| up to {err['max_abs_grad']:.0f}); tolerance {tol:.0e}", flush=True)
    assert err["value"] < tol and err["grad"] < tol, f"the JAX log joint differs from ours: {err}"

    # ---- BlackJAX: compile ahead of time, warm up ----------------------------------------------------
    xs = jax.device_put(x.cpu().numpy().astype(ndtype), jax_cpu)
    z0s = jax.device_put(s0_cpu.numpy().astype(ndtype), jax_cpu)
    keys = jax.random.split(jax.random.key(args.seed), chains)
    params = jax.device_put(params, jax_cpu)
    run_args = (params, xs, z0s, keys)
    t0 = time.perf_counter()
    bj_run = make_blackjax(log_joint, step_size, L, iters, model.n_latent, ndtype).lower(*run_args).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    bj_warm = make_blackjax(log_joint, step_size, L, args.warmup, model.n_latent, ndtype).lower(*run_args).compile()
    warm_compile_s = time.perf_counter() - t0
    jax.block_until_ready(bj_warm(*run_args))
    print(f"BlackJAX: compiled the {iters}-iteration program in {compile_s:.2f} s "
          f"(and the {args.warmup}-iteration warm-up program in {warm_compile_s:.2f} s)", flush=True)

    # ---- ours: warm up ------------------------------------------------------------------------------
    hmc = make_ours(model, x, form, L, args.accel, args.gradient)
    sync(device)
    t0 = time.perf_counter()
    run_ours(hmc, s0, step_size, args.warmup, args.seed)
    sync(device)
    print(f"ours: {args.warmup} warm-up transitions in {time.perf_counter() - t0:.2f} s (accel={args.accel}"
          + (", compilation included)" if args.accel != "none" else ")"), flush=True)

    # ---- timed runs, alternating -----------------------------------------------------------------------
    times = {"ours": [], "blackjax": []}
    for r in range(args.repeat):
        sync(device)
        t0 = time.perf_counter()
        ours = run_ours(hmc, s0, step_size, iters, args.seed)
        sync(device)
        times["ours"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        bj = jax.block_until_ready(bj_run(*run_args))
        times["blackjax"].append(time.perf_counter() - t0)
        print(f"  run {r + 1}/{args.repeat}: ours {times['ours'][-1]:.2f} s, BlackJAX {times['blackjax'][-1]:.2f} s",
              flush=True)

    ours = [t.cpu().double().numpy() for t in ours]
    bj = [np.asarray(t, dtype=np.float64) for t in bj]
    work = chains * iters * L
    rows, summary = [], {}
    ours_label = (f"ours (nvil HMC, torch, {args.gradient} gradient"
                  + ("" if args.accel == "none" else f", accel={args.accel}") + ")")
    for name, label, dev, res in (("ours", ours_label, str(device), ours),
                                  ("blackjax", "BlackJAX (hmc, vmap+scan+jit)", "cpu", bj)):
        sec, best = statistics.median(times[name]), min(times[name])
        acc, lj, div, _ = res
        summary[name] = {"sec": sec, "best": best, "acc": mean_se(acc), "lj": mean_se(lj)}
        rows.append([label, dev, str(threads), f"{sec:.2f}", f"{best:.2f}",
                     f"{compile_s:.2f}" if name == "blackjax" else "—",
                     f"{iters * chains / sec:,.0f}", f"{work / sec:,.0f}",
                     "{:.4f} ± {:.4f}".format(*summary[name]["acc"]), f"{int(div.sum())}",
                     "{:.2f} ± {:.2f}".format(*summary[name]["lj"])])
    ratio = summary["blackjax"]["sec"] / summary["ours"]["sec"]
    ratio_best = summary["blackjax"]["best"] / summary["ours"]["best"]
    rows.append(["ratio ours / BlackJAX", "", "", f"{summary['ours']['sec'] / summary['blackjax']['sec']:.2f}x time",
                 f"{summary['ours']['best'] / summary['blackjax']['best']:.2f}x time", "",
                 f"{ratio:.2f}x", f"{ratio:.2f}x (best runs: {ratio_best:.2f}x)", "", "", ""])
    print(f"\n{chains} chains x {iters} HMC transitions x L={L} (step {step_size}), {form} form, {args.dtype}, "
          f"median of {args.repeat} timed run(s); accept rate and log joint: mean ± se over chains")
    print(markdown_table(["sampler", "device", "threads", "seconds (median)", "best s", "compile s", "transitions/s",
                          "chains x leapfrog steps / s", "accept rate", "divergences",
                          "mean log p(x, z), 2nd half"], rows))

    def compare(key, floor):
        """(difference, z-score, disagree?): a difference counts when it is over 4 se and over ``floor``, the
        float32 round-off of Delta H alone moves acceptance rates near 1 by many (tiny) standard errors."""
        (m1, s1), (m2, s2) = summary["ours"][key], summary["blackjax"][key]
        d = m1 - m2
        z = d / max(float(np.hypot(s1, s2)), 1e-300)
        return d, z, abs(z) > 4 and abs(d) > floor

    d_acc, z_acc, bad_acc = compare("acc", 2e-3)
    d_lj, z_lj, bad_lj = compare("lj", 1e-3 * abs(summary["ours"]["lj"][0]))
    flag = "  <-- the samplers disagree" if bad_acc or bad_lj else "  (consistent)"
    print(f"\nsanity (same kernel, same start: equal expectations), ours - BlackJAX: accept rate {d_acc:+.2e} "
          f"({z_acc:+.1f} se), mean log joint {d_lj:+.3f} nats ({z_lj:+.1f} se){flag}")
    verdict = "at least as fast as" if ratio >= 1 else "slower than"
    print(f"ours is {verdict} BlackJAX here: {ratio:.2f}x its leapfrog steps per second "
          f"({work / summary['ours']['sec']:,.0f} vs {work / summary['blackjax']['sec']:,.0f}, median runs; best runs "
          f"{ratio_best:.2f}x)")


if __name__ == "__main__":
    main()
