"""Before and after: the hot loops of this checkout against another git revision, timed the same way.

    python bench/before_after.py --before HEAD~1             # this checkout against its parent commit
    python bench/before_after.py --before HEAD~3 --repeats 9 --threads 1
    python bench/before_after.py --before main --groups nvil,sap --threads 2      # some of the loops only

The older revision is checked out into a temporary git worktree. The same timing code (below, using only APIs
both revisions have: ``learner.step``, ``log_weights``, ``BlockGibbs.step``, ``TemperedTransitions.step``, ``rbm_log_z``,
``SequentialGibbs.sweep``) runs in a
fresh subprocess per revision and repeat, alternating before / after, so a busy machine slows both alike; the
table gives the median milliseconds per call and the speed-up. Every process uses ``--threads`` torch threads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, markdown_table  # noqa: I001

CHILD = r'''
import json, os, sys, time
root, threads, groups = sys.argv[1], int(sys.argv[2]), set(sys.argv[3].split(","))
sys.path.insert(0, root)
if os.path.isdir(f"{root}/nvil/core"):
    # The folders the package maps in (models/ as nvil.models, estimators/ as nvil.estimators) from this revision,
    # not from the editable install's checkout.
    import importlib.util
    for _name, _folder in (("nvil.models", "models"), ("nvil.estimators", "estimators")):
        _spec = importlib.util.spec_from_file_location(_name, f"{root}/{_folder}/__init__.py",
                                                       submodule_search_locations=[f"{root}/{_folder}"])
        _module = importlib.util.module_from_spec(_spec)
        sys.modules[_name] = _module
        _spec.loader.exec_module(_module)
if os.path.isdir(f"{root}/nvil/backend"):  # the entry points' kernel set (older revisions chose it on import)
    from nvil.backend.cpu_kernels import choose_kernels
    choose_kernels()
import torch
torch.set_num_threads(threads)
from omegaconf import OmegaConf
if os.path.isdir(f"{root}/nvil/core"):  # the floors' names (an older revision: models/, estimators/ at the top)
    from nvil.models import build_model
    from nvil.models.rbm import BoltzmannMachine
    try:
        from nvil.estimators.ais_rbm import base_rate, rbm_log_z
        from nvil.estimators.annealing import schedule
    except ImportError:  # a revision whose nvil.estimators.ais gathered them
        from nvil.estimators.ais import base_rate, rbm_log_z, schedule
    from nvil.estimators.bounds import log_weights
else:
    from models import build_model
    from models.rbm import BoltzmannMachine
    from estimators.ais import base_rate, rbm_log_z, schedule
    from estimators.bounds import log_weights
from nvil.learners import build_learner
from nvil.mcmc import BlockGibbs, TemperedTransitions, uniform_betas
from nvil.mcmc.sequential_gibbs import SequentialGibbs

def per_call(fn, n):
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3

def model_cfg(name, **kw):
    cfg = OmegaConf.load(f"{root}/configs/model/{name}.yaml")
    cfg.pop("defaults", None)
    return OmegaConf.merge(cfg, kw)

def binary(rows, p=0.13):
    return (torch.rand(rows, 784) < p).float()

out = {}
torch.manual_seed(0)
g = torch.Generator().manual_seed(0)
if "nvil" in groups:
    cfg = OmegaConf.load(f"{root}/configs/learner/nvil.yaml")
    for optimizer, lr in (("adam", 0.001), ("sgd", 0.006)):  # the default preset; the paper's (nvil_mnist_paper)
        for mode in ("none", "auto", "compile"):  # trainer.accel
            cfg.optimizer, cfg.lr = optimizer, lr
            model, inference = build_model(model_cfg("sbn", layers=[200]), 784)
            inference.set_input_mean(torch.full((784,), 0.13))  # centred x, as trained on MNIST
            nvil = build_learner(cfg, model, inference, torch.device("cpu"), 0)
            nvil.accelerate(mode)
            for batch in (20, 100):
                x = binary(batch)
                key = f"NVIL step ({optimizer}, accel={mode}), SBN-200, batch {batch}"
                out[key] = per_call(lambda: nvil.step(x), 200 if batch == 20 else 50)
if "autoregressive" in groups:  # NVIL with an autoregressive q (Mnih & Gregor, Table 2), trainer.accel's default auto
    cfg = OmegaConf.load(f"{root}/configs/learner/nvil.yaml")
    for optimizer, lr in (("adam", 0.001), ("sgd", 0.006)):  # the default preset; the paper's (nvil_sbn200_ar)
        cfg.optimizer, cfg.lr = optimizer, lr
        model, inference = build_model(model_cfg("sbn", layers=[200], inference={"autoregressive": True}), 784)
        nvil = build_learner(cfg, model, inference, torch.device("cpu"), 0)
        nvil.accelerate("auto")
        x = binary(20)
        out[f"NVIL step ({optimizer}), SBN-200 with autoregressive q, batch 20"] = per_call(lambda: nvil.step(x), 50)
if "discrete" in groups:  # REBAR / RELAX at RELAX's protocol batch
    for name in ("rebar", "relax"):
        model, inference = build_model(model_cfg("sbn", layers=[200]), 784)
        lrn = build_learner(OmegaConf.load(f"{root}/configs/learner/{name}.yaml"), model, inference,
                            torch.device("cpu"), 0)
        x = binary(24)
        out[f"{name.upper()} step, SBN-200, batch 24"] = per_call(lambda: lrn.step(x), 50)
    for mode in ("auto", "compile"):  # VIMCO at its protocol (SBN-200-200-200, K = 5, batch 24)
        model, inference = build_model(model_cfg("sbn", layers=[200, 200, 200]), 784)
        cfg = OmegaConf.merge(OmegaConf.load(f"{root}/configs/learner/vimco.yaml"), {"num_samples": 5})
        lrn = build_learner(cfg, model, inference, torch.device("cpu"), 0)
        lrn.accelerate(mode)
        x = binary(24)
        out[f"VIMCO step (accel={mode}), SBN-200-200-200, K = 5, batch 24"] = per_call(lambda: lrn.step(x), 50)
    for name, extra, label in (("rloo", {"num_samples": 2}, "K = 2, "), ("disarm", {}, "")):  # DisARM's protocol
        for mode in ("auto", "compile"):
            model, inference = build_model(model_cfg("sbn", layers=[200]), 784)
            cfg = OmegaConf.merge(OmegaConf.load(f"{root}/configs/learner/{name}.yaml"), extra)
            lrn = build_learner(cfg, model, inference, torch.device("cpu"), 0)
            lrn.accelerate(mode)
            x = binary(50)
            out[f"{name.upper()} step (accel={mode}), SBN-200, {label}batch 50"] = per_call(lambda: lrn.step(x), 50)
if "iwae" in groups:
    model, inference = build_model(model_cfg("sbn", layers=[200]), 784)
    x = binary(100)
    import inspect
    # estimator.accel (the bounds' default, auto) where this revision's log_weights takes it
    accel = {"accel": "auto"} if "accel" in inspect.signature(log_weights).parameters else {}
    with torch.no_grad():
        out["IWAE chunk, SBN-200, 100 examples x 341 samples"] = per_call(
            lambda: log_weights(model, inference, x, 341, g, **accel), 3)
rbm = BoltzmannMachine(784, 500)
with torch.no_grad():
    rbm.W.normal_(0, 0.1)
if "gibbs" in groups:
    for chains in (100, 1000):
        state = rbm.init_chains(binary(chains), g)
        gibbs = BlockGibbs(rbm)
        out[f"Gibbs sweep, RBM 784-500, {chains} chains"] = per_call(lambda: gibbs.step(state, 1.0, g), 20)
    tt = TemperedTransitions(rbm, uniform_betas(50, 0.9))
    state = rbm.init_chains(binary(100), g)
    out["tempered-transitions run, 50 betas, 100 chains"] = per_call(lambda: tt.step(state, generator=g), 5)
if "sap" in groups:
    model, _ = build_model(model_cfg("rbm"), 784)
    sap = build_learner(OmegaConf.load(f"{root}/configs/learner/sap.yaml"), model, None, torch.device("cpu"), 0)
    x = binary(100)
    out["PCD update (learner=sap), RBM 784-500, batch 100, 100 particles"] = per_call(lambda: sap.step(x), 20)
if "ais" in groups:
    base = base_rate(rbm, binary(1000))
    for chains in (100, 1000):
        betas = schedule("paper", 200)
        out[f"AIS step, RBM 784-500, {chains} chains"] = per_call(lambda: rbm_log_z(rbm, base, chains, betas, g), 2) / 200
if "sequential" in groups:
    srbm, _ = build_model(model_cfg("srbm"), 784)
    with torch.no_grad():
        srbm.W.normal_(0, 0.1)
        lateral = 0.01 * torch.randn(784, 784)
        srbm.L.copy_((lateral + lateral.T) / 2 * srbm.off_diagonal)
    state = srbm.init_chains(binary(100), g)
    gibbs = BlockGibbs(srbm)
    out["semi-RBM Gibbs sweep (784 pixels in sequence), 100 chains"] = per_call(lambda: gibbs.step(state, 1.0, g), 3)
    for name, spec, chains, n in (("SBN-200", model_cfg("sbn", layers=[200]), 50, 5),
                                  ("DBN 784-500-2000, h1", model_cfg("dbn"), 100, 1)):
        model, _ = build_model(spec, 784)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.05)
        sweep = SequentialGibbs([(1.0, model.latent_density(binary(chains)))])
        h = (torch.rand(chains, model.n_latent) < 0.5).float()
        out[f"sequential Gibbs sweep over h, {name}, {chains} chains"] = per_call(lambda: sweep.sweep(h, generator=g), n)
if "ais_hmc" in groups:  # estimator=ais_hmc on a GBN 784-64-64 (the Gaussian nets' AIS, with its pilot run)
    from nvil.estimators.ais_hmc import AISHMC
    from nvil.models.gaussian import GaussianBeliefNet
    net = GaussianBeliefNet(784, [64, 64], form="auxiliary", init_scale=0.3)
    x = binary(20, 0.2)
    est = AISHMC(num_betas=200, num_runs=8, batch_size=20)
    out["AIS-HMC estimate, GBN 784-64-64, 20 examples x 8 chains, 200 betas"] = per_call(
        lambda: est.estimate(net, x, seed=0), 2)
print(json.dumps(out))
'''


GROUPS = ("nvil", "autoregressive", "discrete", "iwae", "gibbs", "sap", "ais", "sequential", "ais_hmc")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="git revision to compare with (e.g. a commit hash)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--groups", default=",".join(GROUPS),
                   help=f"comma-separated loops to time (default all: {','.join(GROUPS)})")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.before], check=True,
                       capture_output=True)
        try:
            times: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
            for _ in range(args.repeats):
                for side, root in (("before", old), ("after", ROOT)):
                    run = subprocess.run([sys.executable, "-c", CHILD, str(root), str(args.threads), args.groups], cwd=root,
                                         capture_output=True, text=True)
                    if run.returncode != 0:
                        sys.exit(f"the timing process failed on the {side} side ({root}):\n{run.stderr[-3000:]}")
                    for k, v in json.loads(run.stdout.splitlines()[-1]).items():
                        times[side].setdefault(k, []).append(v)
                print(".", end="", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)
    rows = []
    for k in times["after"]:
        b, a = statistics.median(times["before"][k]), statistics.median(times["after"][k])
        rows.append([k, f"{b:.3f}", f"{a:.3f}", f"{b / a:.2f}x"])
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"\nbefore = {args.before}, after = {head.stdout.strip()} (+ working tree); CPU, {args.threads} thread(s), "
          f"median of {args.repeats} alternating runs")
    print(markdown_table(["loop", "before ms", "after ms", "speed-up"], rows))


if __name__ == "__main__":
    main()
