"""The hand-derived gradients of VIMCO, RLOO, ARM and DisARM (``fused_signals``; nvil/learners/discrete/) against
autograd's gradients of the same surrogates.

In float64 on tiny SBNs of one to three layers, fDARN's autoregressive prior and an autoregressive q, K = 2 and 5:
the same draws, the same metrics, the same gradients of every parameter and, after several updates (plain SGD
written by the GEMMs, or Adam), the same parameters. A fused path whose model gradient forgets the importance weights,
or whose inference gradient drops the w~ term, or whose baseline depends on its own sample (VIMCO's or RLOO's), or a
DisARM whose fused step takes ARM's per-unit gradient, fails the comparison.
"""

from __future__ import annotations

import copy
from functools import lru_cache

import pytest
import torch
from omegaconf import OmegaConf

from conftest import assert_same_parameters, assert_same_step, make_cfg, tiny_model
from nvil.learners import learner_settings
from nvil.learners.discrete.antithetic import ARM, DisARM
from nvil.learners.discrete.rloo import RLOO
from nvil.learners.discrete.vimco import VIMCO

LAYERS = {"one_layer": (4,), "two_layers": (4, 3), "three_layers": (5, 4, 3)}


LEARNERS = {"vimco": VIMCO, "rloo": RLOO, "arm": ARM, "disarm": DisARM}


@lru_cache(maxsize=4)
def learner_cfg(name: str):
    return make_cfg("train", [f"learner={name}"]).learner


def pair(layers=(4, 3), k=5, optimizer="sgd", name="sbn", autoregressive_q=False, learner="vimco"):
    """Two learners (VIMCO or RLOO) with identical parameters and generators: (fused path, autograd path)."""
    model, inference = tiny_model(layers=layers, seed=5, q_scale=0.5, name=name, autoregressive_q=autoregressive_q)
    samples = {"num_samples": k} if learner in ("vimco", "rloo") else {}  # ARM / DisARM: n + 1 paths, no K
    cfg = OmegaConf.merge(learner_cfg(learner), dict(optimizer=optimizer, lr=0.05, **samples))
    fast = LEARNERS[learner](model, inference, device=torch.device("cpu"), seed=3, **learner_settings(cfg))
    fast = fast.to(torch.float64)
    slow = copy.deepcopy(fast)
    slow.generator.set_state(fast.generator.get_state())
    slow.fused = None
    return fast, slow


def batches(steps: int, n_visible: int = 6):
    g = torch.Generator().manual_seed(0)
    return [(torch.rand(8, n_visible, generator=g) < 0.5).double() for _ in range(steps)]


def run_both(fast: VIMCO, slow: VIMCO, atol: float = 1e-12) -> None:
    """Three logging steps compared gradient by gradient, then three steps that log nothing (plain SGD's step written
    by the GEMMs) compared by their parameters (``atol``: see ``assert_same_step``)."""
    for x in batches(3):
        assert_same_step(fast, slow, x, atol)
    for t, x in enumerate(batches(3)):
        fast.step(x), slow.step(x)
        assert_same_parameters(fast, slow, f"after step {t + 1} without logging", atol)


@pytest.mark.parametrize("learner", LEARNERS)
@pytest.mark.parametrize("layers", LAYERS.values(), ids=LAYERS.keys())
@pytest.mark.parametrize("k", [2, 5])
def test_fused_gradients_and_updates_equal_autograd(layers, k, learner):
    fast, slow = pair(layers, k, learner=learner)
    assert fast.fused is not None
    run_both(fast, slow)


AUTOREGRESSIVE = [(learner, "fdarn", False) for learner in LEARNERS] + [("vimco", "sbn", True), ("rloo", "sbn", True)]


@pytest.mark.parametrize("learner, name, autoregressive_q", AUTOREGRESSIVE,  # ARM / DisARM need factorial q layers
                         ids=[f"{a}-{'fdarn_prior' if b == 'fdarn' else 'ar_q'}" for a, b, _ in AUTOREGRESSIVE])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_autoregressive_layers_and_adam_equal_autograd(name, autoregressive_q, optimizer, learner):
    """fDARN's prior (its masked weights weighted by w~ for VIMCO) and an autoregressive q (its masked weights by the
    signals), with plain SGD and with Adam."""
    fast, slow = pair(name=name, autoregressive_q=autoregressive_q, optimizer=optimizer, learner=learner)
    if name == "fdarn":
        with torch.no_grad():
            fast.model.prior_ar.weight.normal_(0.0, 0.7), slow.model.prior_ar.weight.copy_(fast.model.prior_ar.weight)
    run_both(fast, slow, 1e-9 if optimizer == "adam" else 1e-12)  # RLOO's fDARN q has gradient entries of 0


@pytest.mark.parametrize("learner", LEARNERS)
@pytest.mark.parametrize("layers", [(4,), (5, 4, 3)], ids=["one_layer", "three_layers"])
def test_a_centred_input_equals_autograd(layers, learner):
    """With SGD and trainer.accel=auto on a CPU and a training mean set, q's first layer reads the centred x of the
    K N rows: the same gradients and updates as autograd's."""
    fast, slow = pair(layers, learner=learner)
    mean = torch.linspace(0.1, 0.6, 6, dtype=torch.float64)
    for lrn in (fast, slow):
        lrn.inference.set_input_mean(mean)
    assert fast.accelerate("auto") is fast
    run_both(fast, slow)


def broken_uniform_weights(fast: VIMCO, monkeypatch) -> None:
    """The model's gradient with w~ replaced by 1 / K: the K-sample ELBO's, not the bound's."""
    model_grads = fast.fused.model_grads
    monkeypatch.setattr(fast.fused, "model_grads",
                        lambda f, rows, w, scale: model_grads(f, rows, torch.full_like(w, 1 / fast.k), scale))


def broken_no_direct_term(fast: VIMCO, monkeypatch) -> None:
    """q's gradient without the w~ grad log w term: the score-function part alone."""
    monkeypatch.setattr(fast, "inference_signal", lambda signal, w: signal)


def broken_own_sample_baseline(fast: VIMCO, monkeypatch) -> None:
    """A baseline that depends on its own sample: log w_k in place of the leave-one-out mean of the others."""
    monkeypatch.setattr(fast, "leave_one_out", lambda log_w: log_w)


def broken_rloo_own_sample_baseline(fast: RLOO, monkeypatch) -> None:
    """RLOO's baseline b_k = f_k, its own sample's: the signal vanishes."""
    monkeypatch.setattr(fast, "baseline", lambda f: f)


def broken_disarm_as_arm(fast: DisARM, monkeypatch) -> None:
    """DisARM's fused step with ARM's g_alpha = (f(b~) - f(b)) (u - 1/2): unbiased too, but not DisARM's."""
    monkeypatch.setattr(fast, "logit_gradient", lambda *args: ARM.logit_gradient(fast, *args))


BROKEN_LEARNER = {"rloo_own_sample_baseline": "rloo", "disarm_as_arm": "disarm"}


@pytest.mark.parametrize("broken", [broken_uniform_weights, broken_no_direct_term, broken_own_sample_baseline,
                                    broken_rloo_own_sample_baseline, broken_disarm_as_arm],
                         ids=["uniform_weights", "no_direct_term", "own_sample_baseline", "rloo_own_sample_baseline",
                              "disarm_as_arm"])
def test_a_broken_fused_path_fails_the_comparison(broken, monkeypatch):
    fast, slow = pair(learner=BROKEN_LEARNER.get(broken.__name__.removeprefix("broken_"), "vimco"))
    broken(fast, monkeypatch)
    with pytest.raises(AssertionError):
        assert_same_step(fast, slow, batches(1)[0])


def test_models_outside_the_fused_path_keep_autograd():
    """Multinomial visibles are not layered Bernoulli: VIMCO keeps autograd's surrogate and still steps."""
    fast, _ = pair()
    fast.fused = None
    before = [p.clone() for p in fast.parameters()]
    fast.step(batches(1)[0])
    assert any(not torch.equal(a, b) for a, b in zip(before, fast.parameters()))


@pytest.mark.slow
def test_the_compiled_fused_step_takes_the_same_updates():
    """trainer.accel=compile compiles VIMCO's hand-derived step: the same parameters as the eager fused step."""
    fast, _ = pair()
    eager, _ = pair()
    assert fast.accelerate("compile") is fast and fast.fused is not None
    for x in batches(4):
        fast.step(x), eager.step(x)
    assert_same_parameters(fast, eager)


@pytest.mark.slow
def test_two_compiled_learners_in_one_process_keep_their_own_graphs():
    """Dynamo caches graphs per code object and the fused step drops its module guards: VIMCO (two layers) and DisARM
    (one), both compiled from the one ``FusedPath.fused_step``, each take their eager twin's updates
    (``nvil.backend.accel.own_code``); sharing one graph fails with a KeyError or other parameters."""
    runs = []
    for learner, layers in (("vimco", (4, 3)), ("disarm", (4,))):
        fast, _ = pair(layers, learner=learner)
        eager, _ = pair(layers, learner=learner)
        fast.accelerate("compile")
        runs.append((fast, eager))
    for x in batches(3):
        for fast, eager in runs:
            fast.step(x), eager.step(x)
    for fast, eager in runs:
        assert_same_parameters(fast, eager)
