"""The CUDA path: every learner and estimator on the GPU, and CPU-CUDA agreement. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from conftest import SYNTHETIC, make_cfg
from nvil.core.config import estimator_config
from nvil.app.evaluation import EvalSpec, evaluate_checkpoint, load_model
from nvil.app.main import train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CUDA = [o.replace("trainer.device=cpu", "trainer.device=cuda") for o in SYNTHETIC if not o.startswith("model.layers")]
RUNS = {
    "nvil_sbn": ["model.layers=[4,3]"],
    "nvil_fdarn_ar_q": ["model=fdarn", "model.n_latent=5", "model.inference.autoregressive=true"],
    "wake_sleep": ["learner=wake_sleep", "model.layers=[4,3]"],
    **{name: [f"learner={name}", "model.layers=[4,3]", "trainer.grad_diag_every=20", "trainer.grad_diag_repeats=4"]
       for name in ("vimco", "rloo", "arm", "disarm", "rebar", "relax", "gumbel_st")},
    "sap": ["model=rbm", "model.n_hidden=6", "learner=sap"],
    "sap_srbm": ["model=srbm", "model.n_hidden=6", "learner=sap"],  # the Triton pixel sweep (trainer.accel=auto)
    "trans_sap": ["model=rbm", "model.n_hidden=6", "learner=trans_sap", "learner.tt.every=10", "learner.tt.num_betas=5"],
    "pt_sap": ["model=rbm", "model.n_hidden=6", "learner=pt_sap", "learner.pt.num_temps=3"],
    "cd": ["model=rbm", "model.n_hidden=6", "learner=cd", "learner.k=3"],
    "exact_ml": ["model=rbm", "model.n_hidden=6", "learner=exact_ml"],
    "documents": ["data=synthetic_bow", "model.visible=multinomial", "model.layers=[5]"],
    "greedy_dbn": ["model=dbn", "model.layers=[5,4]", "learner=greedy", "learner.layer_steps=30"],
    "mcem_gbn": ["model=gbn", "model.layers=[3,2]", "learner=mcem_hmc", "learner.adapt=dual_averaging",
                 "trainer.val_ais_betas=10", "trainer.val_num_samples=2", "trainer.batch_size=50"],
    "map_latents_centred": ["model=gbn", "model.layers=[3,2]", "model.form=centred", "learner=map_latents",
                            "trainer.val_ais_betas=10", "trainer.val_num_samples=2", "trainer.batch_size=50"],
}
SMALL = {"ais": {"num_betas": 50, "num_chains": 20}, "raise": {"num_betas": 50, "num_chains": 20},
         "chib": {"num_steps": 3, "num_runs": 2}, "ais_posterior": {"num_betas": 20, "num_runs": 2},
         "harmonic": {"num_samples": 5, "num_runs": 2}, "dbn_bound": {"num_samples": 10},
         "ais_hmc": {"num_betas": 20, "num_runs": 2},
         # with 3 steps x 2 runs, ~3 of 100 examples have every run at p = 0 (log p = -inf, reported), on CPU alike
         "chib_mh": {"num_steps": 10, "num_runs": 10, "hill_climb_steps": 10}}
LOG_Z = {"log_z": {"num_betas": 50, "num_chains": 20}}


@pytest.mark.parametrize("name", RUNS)
def test_learner_trains_resumes_and_evaluates_on_cuda(tmp_path, name):
    extra = RUNS[name]
    m = train(make_cfg("train", CUDA + extra + ["trainer.max_steps=40"]), tmp_path)
    m = train(make_cfg("train", CUDA + extra + ["trainer.max_steps=60", "trainer.resume=true"]), tmp_path)
    assert m["step"] == 60
    if any(e.startswith(("model=rbm", "model=srbm")) for e in extra):
        estimators = ["exact", "ais", "raise"]
    elif "model=gbn" in extra:
        estimators = ["ais_hmc", "chib_mh", "iwae"]
    elif "model=dbn" in extra:
        estimators = ["iwae", "dbn_bound", "chib", "ais_posterior", "harmonic"]
    elif name == "documents":
        estimators = ["exact", "iwae", "elbo"]
    else:
        estimators = ["exact", "iwae", "elbo", "chib", "ais_posterior", "harmonic"]
    for est in estimators:
        cfg = OmegaConf.merge(estimator_config(est), SMALL.get(est, {}), LOG_Z if "model=dbn" in extra else {},
                              {"accel": "auto"} if est in ("ais", "raise") else {})  # a semi-RBM's sweep: Triton
        result = evaluate_checkpoint(m["checkpoint"], cfg, EvalSpec(device="cuda", progress=False, num_examples=100))
        assert torch.isfinite(result.log_p).all()


def test_cuda_and_cpu_agree_on_exact_log_p(tmp_path):
    train(make_cfg("train", SYNTHETIC + ["trainer.max_steps=20"]), tmp_path)
    ckpt = tmp_path / "checkpoints/last.pt"
    cfg = OmegaConf.load("configs/estimator/exact.yaml")
    cpu = evaluate_checkpoint(ckpt, cfg, EvalSpec(device="cpu", progress=False))
    gpu = evaluate_checkpoint(ckpt, cfg, EvalSpec(device="cuda", progress=False))
    assert torch.allclose(cpu.log_p, gpu.log_p, atol=1e-4)
    model, _, _ = load_model(ckpt, torch.device("cuda"))
    assert next(model.parameters()).is_cuda


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("learner", [
    ["model.layers=[4,3]", "final_eval.enabled=true", "final_eval.estimator.num_samples=10"],
    ["model=rbm", "model.n_hidden=6", "learner=sap", "learner.num_particles=20"]])
def test_torchrun_nccl_on_two_gpus(tmp_path, learner):
    """Data parallelism over 2 GPUs (nccl for the CUDA tensors): rank 0's checkpoint holds both ranks' state, and
    the sharded final evaluation reports the whole test set."""
    from test_distributed import json_lines, ok, torchrun

    from nvil.core.checkpoint import load_checkpoint

    proc = ok(torchrun("train.py", *CUDA, *learner, "trainer.batch_size=20", "trainer.max_steps=40",
                       f"hydra.run.dir={tmp_path}"))
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert ckpt["world_size"] == 2 and ckpt["step"] == 40
    if "final_eval.enabled=true" in learner:
        assert json_lines(proc.stdout)[-1]["num_processes"] == 2


def test_hmc_under_cudagraphs_makes_the_eager_chain():
    """accel=cudagraphs on the autograd path: the backward pass is replayed from a CUDA graph too, so the gradient HMC
    keeps from one step to the next must be a copy (before, the next replay overwrote it: a RuntimeError)."""
    from nvil.mcmc.hmc import HMC

    def log_density(q):
        return -0.5 * (q * q).sum(-1) - torch.log1p(torch.exp(q[:, 0] - q[:, 1]))

    chains = {}
    for mode in ("none", "cudagraphs"):
        hmc = HMC(log_density, num_leapfrog=5, accel=mode)
        g = torch.Generator("cuda").manual_seed(0)
        state = hmc.init(torch.zeros(64, 3, device="cuda"), generator=g)
        for _ in range(5):
            state = hmc.step(state, generator=g, step_size=0.3)[0]
        chains[mode] = state.position
    torch.testing.assert_close(chains["cudagraphs"], chains["none"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["compile", "cudagraphs"])
def test_mcem_compiled_on_cuda_takes_the_eager_steps(mode):
    """MCEM's ``trainer.accel`` on the GPU: the compiled (or CUDA-graph-replayed) E-step gradient and M-step objective
    give the eager chains and parameters after three iterations."""
    from test_accel import mcem_steps

    frames, out = mcem_steps("mcem_hmc", mode, "cuda")
    _, eager = mcem_steps("mcem_hmc", "none", "cuda")
    assert frames >= 2
    for a, b in zip(out, eager):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
