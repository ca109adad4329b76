"""The acceleration layer (nvil/backend/accel.py): ``compile`` gives the eager results (same generator seed -> same
samples, log-weights to float tolerance), ``none`` is the eager path itself, and bad modes fail in one line.

Each compile is slow (seconds), so the shapes are tiny and every compiled function is compiled once."""

from __future__ import annotations

import pytest
import torch

from nvil.estimators.ais_rbm import RBMPath, base_rate, rbm_log_z

from nvil.estimators.annealing import ais, schedule
from nvil.models.gaussian import GaussianBeliefNet
from nvil.models.rbm import BoltzmannMachine
from nvil.backend.accel import accelerate, check_mode
from nvil.core.errors import ConfigError
from nvil.mcmc import BlockGibbs, TemperedTransitions
from nvil.mcmc.hmc import HMC


def small_rbm(device="cpu") -> BoltzmannMachine:
    torch.manual_seed(0)
    rbm = BoltzmannMachine(12, 6).to(device)
    with torch.no_grad():
        rbm.W.normal_(0, 0.5)
        rbm.b.normal_(0, 0.5)
        rbm.c.normal_(0, 0.5)
    return rbm


def data(n=8, d=12, device="cpu"):
    return (torch.rand(n, d, generator=torch.Generator().manual_seed(1)) < 0.4).float().to(device)


def gen(seed=0, device="cpu"):
    return torch.Generator(device=device).manual_seed(seed)


def test_none_is_the_function_itself_and_bad_modes_fail_in_one_line():
    f = lambda t: t + 1  # noqa: E731
    assert accelerate(f, "none") is f
    with pytest.raises(ConfigError, match="accel must be one of") as err:
        accelerate(f, "fast")
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="needs a CUDA device") as err:
        check_mode("cudagraphs", "cpu")
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="estimator.accel"):
        RBMPath(small_rbm(), base_rate(small_rbm(), data()), "cudagraphs")
    with pytest.raises(ConfigError, match="accel"):
        BlockGibbs(small_rbm(), accel="turbo")


@pytest.mark.slow
@torch.no_grad()
def test_compiled_gibbs_and_tempered_transitions_draw_the_eager_samples():
    rbm = small_rbm()
    start = rbm.init_chains(data(), gen(2))
    betas = torch.linspace(0.8, 1.0, 4, dtype=torch.float64)
    out = {}
    for mode in ("none", "compile"):
        g = gen(3)
        fwd = BlockGibbs(rbm, accel=mode)
        s1, _ = fwd.step(start, 0.9, g)
        s2, info = fwd.reverse().step(s1, 0.9, g)
        tt, tt_info = TemperedTransitions(rbm, betas, accel=mode).step(s2, generator=g)
        out[mode] = (s1, s2, info["hidden_input"], tt, tt_info["accepted"], torch.rand(3, generator=g))
    for a, b in zip(out["none"], out["compile"]):
        if isinstance(a, tuple):
            for ta, tb in zip(a, b):
                assert torch.equal(ta, tb)
        elif a.is_floating_point() and not torch.equal(a.round(), a):
            torch.testing.assert_close(a, b)
        else:
            assert torch.equal(a, b)


@torch.no_grad()
def test_compiled_ais_gives_the_eager_log_weights():
    rbm = small_rbm()
    base = base_rate(rbm, data(50))
    betas = schedule("linear", 6)
    eager = rbm_log_z(rbm, base, 16, betas, gen(4))
    fast = rbm_log_z(rbm, base, 16, betas, gen(4), accel="compile")
    assert fast.log_z == pytest.approx(eager.log_z, abs=1e-4)
    path, fast_path = RBMPath(rbm, base), RBMPath(rbm, base, "compile")
    assert path.fused_step is None and fast_path.fused_step is not None
    log_w, state = ais(path, path.sample_base(16, gen(5)), betas, gen(6))
    fast_w, fast_state = ais(fast_path, fast_path.sample_base(16, gen(5)), betas, gen(6))
    assert torch.equal(state.x, fast_state.x)
    torch.testing.assert_close(fast_w, log_w, rtol=0, atol=1e-4)


def test_compiled_hmc_and_nvil_surrogate_match_eager():
    torch.manual_seed(0)
    net = GaussianBeliefNet(12, [3])
    x = data(8)
    start = net.sample_prior(8, gen(7))
    res = {}
    for mode in ("none", "compile"):
        hmc = HMC(lambda s: net.log_joint(x, s), 3, accel=mode)
        with torch.no_grad():
            state, info = hmc.step(hmc.init(start), generator=gen(8), step_size=0.05)
        res[mode] = (state, info.accepted)
    torch.testing.assert_close(res["compile"][0].position, res["none"][0].position, rtol=1e-5, atol=1e-5)
    assert torch.equal(res["compile"][1], res["none"][1])

    # Without c: with it, the first minibatch makes the baseline's output-bias gradient mean(l - c - b) = 0 up to
    # rounding, and Adam turns the sign of that rounding (which differs between compiled and eager kernels) into a
    # full step of +-lr.
    learners = nvil_learners(optimizer="adam", lr=1e-3, constant_baseline=False)
    metrics = {}
    for mode, learner in learners.items():
        for _ in range(2):
            m = learner.step(x)
        metrics[mode] = (m["train/elbo"], [p.detach().clone() for p in learner.parameters()])
    torch.testing.assert_close(metrics["compile"][0], metrics["none"][0], rtol=1e-5, atol=1e-5)
    for a, b in zip(metrics["compile"][1], metrics["none"][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    with pytest.raises(ConfigError, match="trainer.accel"):
        learners["compile"].accelerate("cudagraphs", "cpu")


def nvil_learners(**cfg) -> dict:
    """A tiny NVIL learner (SBN 12-4) per mode, none and compile, from one seed; ``cfg`` over the settings below."""
    from nvil.models.inference import LayeredInference
    from nvil.models.sbn import SBN
    from nvil.learners.nvil import NVIL

    cfg = {"optimizer": "sgd", "lr": 1e-2, "inference_lr_scale": 0.2, "baseline_lr_scale": 1.0, "baseline_hidden": 5,
           "smoothing": 0.8, "input_baseline": True, "constant_baseline": True, "variance_normalisation": True,
           "layerwise": True, **cfg}
    learners = {}
    for mode in ("none", "compile"):
        torch.manual_seed(0)
        learners[mode] = NVIL(SBN(12, [4]), LayeredInference(12, [4]), device=torch.device("cpu"), seed=0, **cfg)
        assert learners[mode].accelerate(mode) is learners[mode]
    return learners


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.no_grad()
def test_cudagraphs_ais_and_gibbs_match_eager_on_cuda():
    rbm = small_rbm("cuda")
    base = base_rate(rbm, data(50, device="cuda"))
    betas = schedule("linear", 6)
    eager = rbm_log_z(rbm, base, 16, betas, gen(4, "cuda"))
    for mode in ("compile", "cudagraphs"):
        assert rbm_log_z(rbm, base, 16, betas, gen(4, "cuda"), accel=mode).log_z == pytest.approx(eager.log_z, abs=1e-4)
    start = rbm.init_chains(data(device="cuda"), gen(2, "cuda"))
    a = BlockGibbs(rbm).step(start, 0.9, gen(3, "cuda"))[0]
    b = BlockGibbs(rbm, accel="cudagraphs").step(start, 0.9, gen(3, "cuda"))[0]
    assert torch.equal(a.x, b.x) and torch.equal(a.h, b.h)


def test_a_compiled_fused_step_takes_new_shapes():
    """NVIL's compiled fused step against the eager learner over minibatches of 8, then 5, then 8 rows again: each
    new shape gets its graph and the repeats reuse them."""
    learners = nvil_learners()
    for rows in (8, 8, 8, 5, 5, 8, 5):
        out = {mode: learner.step(data(rows)) for mode, learner in learners.items()}
        torch.testing.assert_close(out["compile"]["train/elbo"], out["none"]["train/elbo"], rtol=1e-5, atol=1e-5)
    for a, b in zip(learners["compile"].parameters(), learners["none"].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def mcem_steps(name: str, mode: str, device: str = "cpu") -> tuple[int, list[torch.Tensor]]:
    """(frames Dynamo compiled, [chains, *parameters]) after three iterations of ``learner=name`` (MCEM or
    MAP-latents) on a GBN 12-3-2 with ``trainer.accel=mode``, from one seed."""
    from conftest import make_cfg
    from nvil.learners import build_learner

    cfg = make_cfg("train", ["model=gbn", f"learner={name}", "learner.adapt=dual_averaging"]).learner
    x, rows = data(8, device=device), torch.arange(8, device=device)
    torch.manual_seed(0)
    net = GaussianBeliefNet(12, [3, 2]).to(device)
    learner = build_learner(cfg, net, None, torch.device(device), seed=0)
    learner.accelerate(mode, device)
    learner.bind_data(x)
    torch._dynamo.reset()  # compiled afresh here, whichever test compiled these functions before
    before = torch._dynamo.utils.counters["frames"]["ok"]
    for _ in range(3):
        learner.step(x, indices=rows)
    frames = torch._dynamo.utils.counters["frames"]["ok"] - before
    return frames, [learner.chains.clone()] + [p.detach().clone() for p in net.parameters()]


@pytest.mark.parametrize("name", ["mcem_hmc", "map_latents"])
def test_compiled_mcem_takes_the_eager_steps(name):
    """``trainer.accel=compile`` for MCEM compiles the E-step target's gradient and the M-step's objective (Dynamo
    compiles frames: the learner's ``accelerate`` is not the base class's no-op) and takes the eager steps: the same
    chains and parameters after three iterations, from one seed, to float tolerance."""
    frames, out = {}, {}
    for mode in ("none", "compile"):
        frames[mode], out[mode] = mcem_steps(name, mode)
    assert frames["none"] == 0 and frames["compile"] >= 2, frames
    for a, b in zip(out["compile"], out["none"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
