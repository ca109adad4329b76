"""fDARN's autoregressive prior and autoregressive inference layers against enumeration."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import CHI2_999, chi_square, tiny_model
from nvil.estimators.exact import enumerate_states
from nvil.models.autoregressive import AutoregressiveLinear


def chain_rule_log_prob(a: torch.Tensor, w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """log p(h) = sum_j log p(h_j | h_<j), written as the explicit loop the definition gives."""
    total = torch.zeros(h.shape[0], dtype=torch.float64)
    for j in range(h.shape[1]):
        logit = a[j].double() + (h[:, :j].double() * w[j, :j].double()).sum(1)
        p1 = torch.sigmoid(logit)
        total += torch.where(h[:, j] > 0, p1, 1 - p1).log()
    return total


@pytest.fixture
def ar_layer():
    torch.manual_seed(0)
    layer = AutoregressiveLinear(6)
    with torch.no_grad():
        layer.weight.normal_(0, 1.5)  # the upper triangle is masked away and must not matter
    return layer, torch.randn(6)


def test_autoregressive_log_prob_matches_the_chain_rule_and_normalises(ar_layer):
    layer, a = ar_layer
    states = enumerate_states(6, 0, 64)
    log_p = layer.log_prob(a, states)
    assert torch.allclose(log_p.double(), chain_rule_log_prob(a, layer.weight, states), atol=1e-5)
    assert log_p.double().exp().sum().item() == pytest.approx(1.0, abs=1e-5)


def test_autoregressive_sample_draws_from_the_distribution(ar_layer):
    layer, a = ar_layer
    g = torch.Generator().manual_seed(0)
    samples = layer.sample(a.expand(40000, 6), generator=g)
    stat, dof = chi_square(samples, layer.log_prob(a, enumerate_states(6, 0, 64)))
    assert stat < CHI2_999[dof]


def test_fdarn_prior_matches_enumeration_and_sampling():
    model, _ = tiny_model(n_visible=5, layers=(6,), name="fdarn", scale=1.2)
    states = enumerate_states(6, 0, 64)
    log_prior = model.prior_log_prob(states)
    expected = chain_rule_log_prob(model.prior_logits, model.prior_ar.weight * model.prior_ar.mask, states)
    assert torch.allclose(log_prior.double(), expected, atol=1e-5)
    assert log_prior.double().exp().sum().item() == pytest.approx(1.0, abs=1e-5)
    _, (h,) = model.sample(40000, generator=torch.Generator().manual_seed(1))
    stat, dof = chi_square(h, log_prior)
    assert stat < CHI2_999[dof]
    # The prior is not factorial: the test has power against a sampler that ignores W.
    marginals = h.mean(0)
    factorial = (states * marginals.log() + (1 - states) * (1 - marginals).log()).sum(1)
    assert chi_square(h, factorial)[0] > CHI2_999[dof]


def test_autoregressive_inference_layer_matches_enumeration_and_sampling():
    _, inference = tiny_model(n_visible=5, layers=(4,), autoregressive_q=True, q_scale=1.2, seed=3)
    x = torch.tensor([[1.0, 0.0, 1.0, 1.0, 0.0]])
    states = enumerate_states(4, 0, 16)
    log_q = inference.log_prob([states], x)
    base = inference.encoders[0](inference.centre(x))[0]
    expected = chain_rule_log_prob(base, inference.within[0].weight * inference.within[0].mask, states)
    assert torch.allclose(log_q.double(), expected, atol=1e-5)
    assert log_q.double().exp().sum().item() == pytest.approx(1.0, abs=1e-5)
    (h,), (lq,) = inference.sample(x.expand(40000, 5), generator=torch.Generator().manual_seed(2))
    stat, dof = chi_square(h, log_q)
    assert stat < CHI2_999[dof]
    # The returned log q is that of the returned sample.
    assert torch.allclose(lq, inference.log_prob([h], x.expand(40000, 5)), atol=1e-5)


def test_masked_weights_get_no_gradient():
    layer = AutoregressiveLinear(4)
    layer.log_prob(torch.zeros(4), torch.ones(3, 4)).sum().backward()
    assert torch.all(layer.weight.grad.triu() == 0)
    assert math.isclose(layer.weight.grad.tril(-1).abs().sum().item(), layer.weight.grad.abs().sum().item())


# ---- accel=native / auto: the draw as one C call (nvil.backend.native.autoregressive) ------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.usefixtures("native_kernels")
def test_native_draw_equals_the_eager_loop_for_the_same_uniforms(dtype):
    """The same generator state gives the same units in both modes (float64: every unit; float32: the C expf may
    round a logit's sigmoid one ulp away from torch's, so a draw sitting on the boundary may differ), over leading
    dimensions and in two threads."""
    torch.manual_seed(1)
    layer = AutoregressiveLinear(50).to(dtype)
    with torch.no_grad():
        layer.weight.normal_(0, 1.0)
    base = torch.randn(3, 70, 50, dtype=dtype)
    eager = layer.sample(base, generator=torch.Generator().manual_seed(7))
    layer.accelerate_sampling("native")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        fast = layer.sample(base, generator=torch.Generator().manual_seed(7))
    finally:
        torch.set_num_threads(threads)
    assert fast.shape == eager.shape and fast.dtype == dtype
    mismatch = (fast != eager).double().mean().item()
    assert mismatch == 0.0 if dtype == torch.float64 else mismatch < 1e-3


@pytest.mark.usefixtures("native_kernels")
def test_native_draw_with_w_untransposed_fails():
    """A broken variant, W passed where its transpose belongs (each unit that comes on moves the wrong logits),
    disagrees with the eager loop, so the equality above has power."""
    from nvil.backend import native
    torch.manual_seed(1)
    layer = AutoregressiveLinear(30).double()
    with torch.no_grad():
        layer.weight.normal_(0, 1.0)
    base = torch.randn(200, 30, dtype=torch.float64)
    eager = layer.sample(base, generator=torch.Generator().manual_seed(3))
    u = torch.rand(base.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    broken = native.autoregressive(base, layer.masked_weight().detach().contiguous(), u)
    assert (broken != eager).double().mean().item() > 0.05


@pytest.mark.usefixtures("native_kernels")
def test_native_draw_matches_the_distribution(ar_layer):
    layer, a = ar_layer
    layer.accelerate_sampling("auto")
    samples = layer.sample(a.expand(40000, 6), generator=torch.Generator().manual_seed(0))
    stat, dof = chi_square(samples, layer.log_prob(a, enumerate_states(6, 0, 64)))
    assert stat < CHI2_999[dof]


def test_trainer_accel_reaches_the_autoregressive_layers():
    """``trainer.accel`` (the learner's ``accelerate``) reaches fDARN's prior and an autoregressive q."""
    from conftest import make_cfg
    from nvil.learners import build_learner

    for name, q_ar in (("fdarn", False), ("sbn", True)):
        model, inference = tiny_model(layers=(4,), name=name, autoregressive_q=q_ar)
        learner = build_learner(make_cfg("train", ["learner=nvil"]).learner, model, inference, torch.device("cpu"), 0)
        learner.accelerate("auto")
        layers = [m for m in (*model.modules(), *inference.modules()) if isinstance(m, AutoregressiveLinear)]
        assert layers and all(m.sample_mode == "auto" for m in layers)


@pytest.mark.usefixtures("native_kernels")
def test_evaluation_draws_autoregressive_q_natively(tmp_path, synthetic_overrides, monkeypatch):
    """An evaluation with the estimator's default accel (auto) draws an autoregressive q through the C kernel, and
    scores it as the eager draw does (same uniforms: the same bound to float rounding)."""
    from conftest import make_cfg
    from nvil.backend import native
    from nvil.app.evaluation import EvalSpec, evaluate_checkpoint
    from nvil.app.main import train

    train(make_cfg("train", synthetic_overrides + ["model.inference.autoregressive=true", "trainer.max_steps=20"]),
          tmp_path / "run")
    calls, kernel = [], native.autoregressive
    monkeypatch.setattr(native, "autoregressive", lambda *a: calls.append(1) or kernel(*a))
    ckpt = tmp_path / "run" / "checkpoints" / "last.pt"
    estimator = make_cfg("evaluate", ["estimator=iwae", "estimator.num_samples=20"]).estimator
    spec = EvalSpec(split="test", num_examples=30, seed=0, device="cpu", progress=False)
    fast = evaluate_checkpoint(ckpt, estimator, spec)
    assert calls, "the autoregressive q was drawn eagerly"
    n_calls = len(calls)
    eager_cfg = make_cfg("evaluate", ["estimator=iwae", "estimator.num_samples=20", "estimator.accel=none"]).estimator
    eager = evaluate_checkpoint(ckpt, eager_cfg, spec)
    assert len(calls) == n_calls, "accel=none still drew through the C kernel"
    assert fast.mean == pytest.approx(eager.mean, abs=1e-4)
