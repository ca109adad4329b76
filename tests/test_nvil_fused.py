"""NVIL's hand-derived gradients (nvil/learners/fused.py) against autograd's gradients of the same surrogate.

In float64 on tiny SBNs of one to three layers, for every combination of the variance-reduction switches that changes
the gradient: the same draws, the same gradients of every parameter (model, inference network, baselines), the same
metrics, and after several updates the same parameters. A fused path with the baseline's sign flipped or sigmoid(a_q)
dropped fails the same comparison; so do fDARN's autoregressive prior and an autoregressive q. Models the path does
not cover (multinomial visibles) keep the autograd path and still train. On steps that log nothing, plain SGD's step is written by the GEMMs themselves
and equals torch.optim.SGD's.
"""

from __future__ import annotations

import copy
from functools import lru_cache

import pytest
import torch
from omegaconf import OmegaConf

from conftest import assert_same_parameters, assert_same_step, make_cfg, tiny_model
from nvil.models.sbn import SBN
from nvil.models.inference import LayeredInference
from nvil.learners import fused, learner_settings, weight_steps
from nvil.learners.nvil import NVIL
from nvil.core.ops import RunningMoments, sigmoid_and_softplus_sum

ALL_ON = dict(input_baseline=True, constant_baseline=True, variance_normalisation=True, layerwise=True)
SWITCHES = {
    "all_on": ALL_ON,
    "global_signal": dict(ALL_ON, layerwise=False),
    "no_input_baseline": dict(ALL_ON, input_baseline=False),
    "no_c_no_v": dict(ALL_ON, constant_baseline=False, variance_normalisation=False),
    "all_off": dict(input_baseline=False, constant_baseline=False, variance_normalisation=False, layerwise=False),
}
LAYERS = {"one_layer": (4,), "two_layers": (4, 3), "three_layers": (5, 4, 3)}


@lru_cache(maxsize=1)
def learner_cfg():
    return make_cfg("train").learner  # composed once: Hydra's first compose is the slowest part of these tests


def pair(layers=(4, 3), switches=ALL_ON, optimizer="sgd", name="sbn", autoregressive_q=False, dtype=torch.float64):
    """Two NVIL learners with identical parameters, baselines and generators: (fused path, autograd path)."""
    model, inference = tiny_model(layers=layers, seed=5, q_scale=0.5, name=name, autoregressive_q=autoregressive_q)
    cfg = OmegaConf.merge(learner_cfg(), dict(switches, optimizer=optimizer, lr=0.05, baseline_hidden=7))
    fast = NVIL(model, inference, device=torch.device("cpu"), seed=3, **learner_settings(cfg)).to(dtype)
    with torch.no_grad():  # a nonzero output layer, so every baseline parameter has a gradient that can be wrong
        for p in fast.baselines.parameters():
            p.normal_(0.0, 0.3)
    slow = copy.deepcopy(fast)
    slow.generator.set_state(fast.generator.get_state())
    slow.fused = None
    return fast, slow


def batches(steps: int, n_visible: int = 6, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    return [(torch.rand(8, n_visible, generator=g) < 0.5).to(dtype) for _ in range(steps)]


@pytest.mark.parametrize("layers", LAYERS.values(), ids=LAYERS.keys())
@pytest.mark.parametrize("switches", SWITCHES.values(), ids=SWITCHES.keys())
def test_fused_gradients_and_updates_equal_autograd(layers, switches):
    fast, slow = pair(layers, switches)
    assert fast.fused is not None
    for x in batches(4):
        assert_same_step(fast, slow, x)


def test_adam_and_sgd_with_momentum_take_the_same_updates():
    # Without c: with it, the first minibatch makes the baseline's output-bias gradient mean(l - c - b) = 0 up to
    # rounding, and Adam turns the sign of that rounding into a full step of +-lr on either path.
    fast, slow = pair(switches=dict(ALL_ON, constant_baseline=False), optimizer="adam")
    for x in batches(3):
        assert_same_step(fast, slow, x)
    cfg_momentum = dict(ALL_ON, momentum=0.9)
    fast, slow = pair(switches=cfg_momentum)
    for x in batches(3):
        assert_same_step(fast, slow, x)


def test_the_draws_are_those_of_inference_sample_in_float32():
    fast, _ = pair(layers=(5, 4), dtype=torch.float32)
    x = batches(1, dtype=torch.float32)[0]
    state = fast.generator.get_state()
    hs, _ = fast.inference.sample(x, generator=fast.generator)
    fast.generator.set_state(state)
    f = fast.fused.forward(x, fast.generator)
    for h, h_fused in zip(hs, f.hs):
        assert torch.equal(h, h_fused)


@pytest.mark.parametrize("broken", ["baseline_sign", "no_sigmoid_q"])
def test_a_broken_fused_path_fails_the_comparison(broken, monkeypatch):
    """Power: the comparison above catches a sign error in the baseline's gradient and a dropped sigmoid(a_q)."""
    fast, slow = pair()
    if broken == "baseline_sign":
        right = fused.baseline_loss_grad
        monkeypatch.setattr(fused, "baseline_loss_grad", lambda s: -right(s))
    else:
        forward = fast.fused.forward_from

        def no_sigmoid(x, uniforms):
            f = forward(x, uniforms)
            f.q_probs = [torch.zeros_like(p) for p in f.q_probs]  # dlog q/da = h instead of h - sigmoid(a)
            return f

        monkeypatch.setattr(fast.fused, "forward_from", no_sigmoid)
    with pytest.raises(AssertionError):
        assert_same_step(fast, slow, batches(1)[0])


@pytest.mark.parametrize("layers", LAYERS.values(), ids=LAYERS.keys())
def test_plain_sgd_applied_in_the_gemm_takes_the_optimisers_steps(layers):
    """Steps that log nothing, with plain SGD (the paper's preset): the fused path writes theta - lr g in the GEMM
    that computes g and skips the optimiser; the parameters equal the autograd path's torch.optim.SGD steps."""
    fast, slow = pair(layers)
    assert weight_steps.plain_sgd_rates(fast.optimizer) is not None
    for t, x in enumerate(batches(5)):
        fast.step(x), slow.step(x)
        assert_same_parameters(fast, slow, f"after step {t + 1}")
    fast, _ = pair(layers, switches=dict(ALL_ON, momentum=0.9))
    assert weight_steps.plain_sgd_rates(fast.optimizer) is None  # momentum: the optimiser keeps a buffer, so it steps


def test_a_wrong_rate_in_the_gemm_fails_the_comparison(monkeypatch):
    """Power: the same comparison catches a step applied at a rate off by a factor (e.g. a missing 1/N)."""
    fast, slow = pair()
    right = weight_steps.plain_sgd_rates
    monkeypatch.setattr("nvil.learners.fused_path.plain_sgd_rates", lambda opt: {k: 1.1 * v for k, v in right(opt).items()})
    fast.step(batches(1)[0]), slow.step(batches(1)[0])
    with pytest.raises(AssertionError):
        assert_same_parameters(fast, slow)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_fdarn_autoregressive_prior_fused_equals_autograd(optimizer):
    """fDARN (an autoregressive prior over one layer): the fused path's gradients, masked weights included, and its
    updates (plain SGD written by the GEMM; Adam through the optimiser) equal the autograd path's."""
    switches = ALL_ON if optimizer == "sgd" else dict(ALL_ON, constant_baseline=False)  # see the Adam test above
    fast, slow = pair(name="fdarn", optimizer=optimizer, switches=switches)
    assert fast.fused is not None and fast.model.prior_ar is not None
    with torch.no_grad():
        fast.model.prior_ar.weight.normal_(0.0, 0.7), slow.model.prior_ar.weight.copy_(fast.model.prior_ar.weight)
    for x in batches(3):
        assert_same_step(fast, slow, x)
    for t, x in enumerate(batches(3)):
        fast.step(x), slow.step(x)
        assert_same_parameters(fast, slow, f"after step {t + 1} without logging")


@pytest.mark.parametrize("layers", [(4,), (4, 3)], ids=["one_layer", "two_layers"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_autoregressive_q_fused_equals_autograd(layers, optimizer):
    """An autoregressive q (Table 2): the fused path draws each layer's units in index order with the uniforms of
    ``inference.sample`` and sets the masked within-layer weights' gradients by hand; the same gradients and updates
    as the autograd path, on logging steps and on plain SGD's steps written by the GEMMs."""
    switches = ALL_ON if optimizer == "sgd" else dict(ALL_ON, constant_baseline=False)  # see the Adam test above
    fast, slow = pair(layers, switches, optimizer=optimizer, autoregressive_q=True)
    assert fast.fused is not None and not fast.fused.compilable
    for x in batches(3):
        assert_same_step(fast, slow, x)
    for t, x in enumerate(batches(3)):
        fast.step(x), slow.step(x)
        assert_same_parameters(fast, slow, f"after step {t + 1} without logging")


def test_autoregressive_q_under_compile_stays_eager_and_draws_in_c():
    """trainer.accel=compile with an autoregressive q: the step is not compiled (its draws are sequential), the
    draws run in C (auto), and the updates equal the eager fused path's."""
    fast, _ = pair(autoregressive_q=True)
    eager, _ = pair(autoregressive_q=True)
    step = fast.fused_step
    assert fast.accelerate("compile") is fast and fast.fused_step == step
    assert all(w.sample_mode == "auto" for w in fast.inference.within)
    for x in batches(3):
        fast.step(x), eager.step(x)
    assert_same_parameters(fast, eager)


@pytest.mark.parametrize("name, autoregressive_q", [("fdarn", False), ("sbn", True)], ids=["fdarn_prior", "ar_q"])
def test_an_unmasked_autoregressive_gradient_fails_the_comparison(name, autoregressive_q, monkeypatch):
    """Power: the comparison catches the autoregressive weights' gradient (fDARN's prior, q's) left unmasked."""
    fast, slow = pair(name=name, autoregressive_q=autoregressive_q)
    monkeypatch.setattr(weight_steps, "_masked_grads",
                        lambda layer, d, v, scale, rates: weight_steps._grad_buffer(layer.weight).copy_(scale * d.t() @ v))
    with pytest.raises(AssertionError):
        assert_same_step(fast, slow, batches(1)[0])


def test_models_outside_the_fused_path_keep_autograd_and_train(monkeypatch):
    monkeypatch.setattr("nvil.learners.fused.covers", lambda model, inference: False)  # e.g. multinomial visibles
    fast, _ = pair(dtype=torch.float32)
    assert fast.fused is None
    before = [p.detach().clone() for p in fast.model.parameters()]
    for x in batches(3, dtype=torch.float32):
        metrics = fast.step(x, diagnostics=True)
    assert torch.isfinite(metrics["train/elbo"])
    assert all(not torch.equal(a, b) for a, b in zip(before, fast.model.parameters()))


def test_multinomial_visibles_are_not_covered():
    assert not fused.covers(SBN(6, [4], visible="multinomial"), LayeredInference(6, [4]))
    assert fused.covers(SBN(6, [4]), LayeredInference(6, [4]))


def test_both_paths_write_the_same_checkpoint():
    fast, slow = pair()
    assert fast.accelerate("none") is fast and fast.fused is not None  # trainer.accel=none keeps the fused path
    for x in batches(2):
        fast.step(x), slow.step(x)
    a, b = fast.learner_state(), slow.learner_state()
    assert a.keys() == b.keys() and a["optimizer"].keys() == b["optimizer"].keys()
    slow.load_learner_state(a)  # one path resumes from the other's checkpoint


def expected_moments(xs, alpha):
    """c and v by Algorithm 1's recursion, the first minibatch setting them."""
    c = v = None
    for x in xs:
        mean, var = x.double().mean(), x.double().var(unbiased=False) if x.numel() > 1 else torch.zeros((), dtype=torch.float64)
        c, v = (mean, var) if c is None else (alpha * c + (1 - alpha) * mean, alpha * v + (1 - alpha) * var)
    return c, v


@pytest.mark.parametrize("alpha, power", [(0.8, False), (0.5, True)])
def test_running_moments_follow_algorithm_1(alpha, power):
    """c <- alpha c + (1 - alpha) mean(l), v likewise with var(l), the first minibatch (and a one-element one) included;
    the power variant checks the recursion against the wrong smoothing (0.8 vs 0.5), which must fail."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(20, generator=g) * 3 + 1 for _ in range(5)] + [torch.randn(1, generator=g)]
    moments = RunningMoments(0.8)
    for x in xs:
        moments.update(x)
    c, v = expected_moments(xs, alpha)
    close = torch.allclose(moments.mean.double(), c, atol=1e-5) and torch.allclose(moments.var.double(), v, atol=1e-5)
    assert close != power


@pytest.mark.slow
def test_the_compiled_fused_step_takes_the_same_updates():
    """trainer.accel=compile compiles the hand-derived step (forward, signals, backward with plain SGD's step in the
    GEMMs) and keeps the fused path: the same parameters and c, v as the eager fused step, in float64 (~20 s of
    compilation, hence slow)."""
    fast, _ = pair(switches=ALL_ON)
    eager, _ = pair(switches=ALL_ON)
    assert fast.accelerate("compile") is fast and fast.fused is not None
    for x in batches(4):
        fast.step(x), eager.step(x)
    assert_same_parameters(fast, eager)
    for a, b in zip(fast.moments, eager.moments):
        torch.testing.assert_close(a.mean, b.mean, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("width", [784, 200, 37])  # groups of 16, of 8, and of 1 (a prime width)
def test_sigmoid_and_softplus_sum_compiled_form_is_exact(width):
    """The compiled form of ``sigmoid_and_softplus_sum`` (one exp per element, one log per group of factors) gives
    sigmoid(a) and sum softplus(a) to float64 rounding, logits up to |a| = 40 included; the eager form is the
    reference's own two kernels."""
    a = torch.cat([8 * torch.randn(19, width, generator=torch.Generator().manual_seed(width), dtype=torch.float64),
                   torch.linspace(-40, 40, width, dtype=torch.float64)[None]])
    prob, softplus_sum = torch.compile(sigmoid_and_softplus_sum)(a)
    torch.testing.assert_close(prob, torch.sigmoid(a), rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(softplus_sum, torch.nn.functional.softplus(a).sum(-1), rtol=1e-10, atol=1e-10)
    eager = sigmoid_and_softplus_sum(a)
    assert torch.equal(eager[0], torch.sigmoid(a))


# ---- a centred x (the training mean set), on the general path's dense products --------------------------------------
INPUT_MEAN = torch.tensor([0.3, 0.0, 0.5, 0.9, 0.0, 0.25], dtype=torch.float64)  # two inputs with mean 0


@pytest.mark.parametrize("layers", LAYERS.values(), ids=LAYERS.keys())
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_a_centred_input_equals_autograd(layers, momentum):
    """With a training mean that centres x (trainer.accel=auto on a CPU): logging steps (gradients into .grad, then
    the optimiser) and steps that log nothing (plain SGD written by the GEMM; with momentum: into .grad, then the
    optimiser) take autograd's gradients and parameters, in float64."""
    fast, slow = pair(layers, switches=dict(ALL_ON, momentum=momentum))
    for learner in (fast, slow):
        learner.inference.set_input_mean(INPUT_MEAN)
    assert fast.accelerate("auto") is fast
    assert fast.inference.encoders[0].weight.is_contiguous()  # nn.Linear's own layout
    for x in batches(3):
        assert_same_step(fast, slow, x)
    for x in batches(3):
        fast.step(x), slow.step(x)
    assert_same_parameters(fast, slow, "after steps that log nothing")
