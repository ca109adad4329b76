"""Wake-sleep: the sleep-phase recognition gradient against its exact expectation by enumeration."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from conftest import make_cfg, tiny_model
from nvil.estimators.exact import enumerate_states, split_layers
from nvil.learners import build_learner
from nvil.learners.wake_sleep import WakeSleep


def test_sleep_gradient_matches_its_exact_expectation():
    """E_{p(x, h)}[grad_phi log q(h | x)], summing over all 2^6 x 2^7 joint states of a 6-4-3 SBN."""
    model, inference = tiny_model(seed=7, scale=1.0, q_scale=0.5)
    cfg = OmegaConf.merge(make_cfg("train", ["learner=wake_sleep"]).learner, {"sleep_batch_size": 1000})
    learner = build_learner(cfg, model, inference, torch.device("cpu"), seed=0)

    x = enumerate_states(6, 0, 64).repeat_interleave(128, 0)
    hs = split_layers(enumerate_states(7, 0, 128).repeat(64, 1), model.layers)
    with torch.no_grad():
        p_joint = model.log_joint(x, hs).double().exp()
    assert abs(p_joint.sum().item() - 1) < 1e-5
    inference.zero_grad()
    (p_joint.float() * inference.log_prob(hs, x)).sum().backward()
    exact = {k: p.grad.clone() for k, p in inference.named_parameters()}

    groups = []
    for _ in range(150):
        learner.zero_grad(set_to_none=True)
        loss, _ = learner.surrogate(torch.zeros(2, 6))
        loss.backward()
        groups.append({k: -p.grad.clone() for k, p in inference.named_parameters()})
    for k in exact:
        g = torch.stack([grp[k] for grp in groups])
        mean, se = g.mean(0), g.std(0) / math.sqrt(g.shape[0])
        z = ((mean - exact[k]).abs() / (se + 1e-7)).max().item()
        assert z < 4.0, f"{k}: sleep gradient {z:.1f} standard errors from its exact expectation"
    exact_all = torch.cat([e.flatten() for e in exact.values()])
    se_all = torch.cat([(torch.stack([grp[k] for grp in groups]).std(0) / math.sqrt(150)).flatten() for k in exact])
    assert exact_all.abs().max() > 10 * se_all.median()  # power: the exact gradient is far from zero


def test_wake_phase_is_nvils_model_update():
    """With the same h, wake-sleep's model gradient is grad_theta log p(x, h), as in NVIL."""
    model, inference = tiny_model(seed=8)
    cfg = make_cfg("train", ["learner=wake_sleep"]).learner
    learner = build_learner(cfg, model, inference, torch.device("cpu"), seed=3)
    x = torch.bernoulli(torch.full((50, 6), 0.5), generator=torch.Generator().manual_seed(0))
    learner.zero_grad()
    learner.surrogate(x)[0].backward()
    got = {k: p.grad.clone() for k, p in model.named_parameters()}
    # Replay the same wake sample: the learner's generator drew h first.
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        hs, _ = inference.sample(x, generator=g)
    model.zero_grad()
    (-model.log_joint(x, hs).mean()).backward()
    for k, p in model.named_parameters():
        assert torch.allclose(got[k], p.grad, atol=1e-6), k


def ws_pair(name: str = "sbn", optimizer: str = "sgd", autoregressive_q: bool = False):
    """Two wake-sleep learners with identical parameters and generators, in float64: (fused path, autograd path)."""
    import copy

    model, inference = tiny_model(layers=(4, 3), seed=5, q_scale=0.5, name=name, autoregressive_q=autoregressive_q)
    cfg = OmegaConf.merge(make_cfg("train", ["learner=wake_sleep"]).learner, {"optimizer": optimizer, "lr": 0.05})
    fast = build_learner(cfg, model, inference, torch.device("cpu"), seed=3).double()
    if model.prior_ar is not None:
        with torch.no_grad():
            model.prior_ar.weight.normal_(0.0, 0.7)
    slow = copy.deepcopy(fast)
    slow.generator.set_state(fast.generator.get_state())
    slow.fused = None
    return fast, slow


def ws_batches(steps: int):
    g = torch.Generator().manual_seed(0)
    return [(torch.rand(8, 6, generator=g) < 0.5).double() for _ in range(steps)]


def assert_same_ws_step(fast: WakeSleep, slow: WakeSleep, x: torch.Tensor, diagnostics: bool) -> None:
    got, want = fast.step(x, diagnostics=diagnostics), slow.step(x, diagnostics=diagnostics)
    assert got.keys() == want.keys()
    for k in got:
        torch.testing.assert_close(got[k], want[k], rtol=1e-10, atol=1e-10, msg=k)
    for (name, p), q in zip(fast.named_parameters(), slow.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=f"{name} after the update")


@pytest.mark.parametrize("name, optimizer, autoregressive_q",
                         [("sbn", "sgd", False), ("sbn", "adam", False), ("fdarn", "sgd", False), ("sbn", "sgd", True)])
def test_fused_wake_sleep_takes_the_autograd_paths_updates(name, optimizer, autoregressive_q):
    """The hand-derived wake and sleep gradients (and plain SGD written by their GEMMs on steps that log nothing)
    take the same updates as autograd through the surrogate, for an SBN, fDARN's autoregressive prior and an
    autoregressive q."""
    fast, slow = ws_pair(name, optimizer, autoregressive_q)
    assert fast.fused is not None
    for t, x in enumerate(ws_batches(4)):
        assert_same_ws_step(fast, slow, x, diagnostics=t % 2 == 0)


def test_a_fused_sleep_phase_at_the_wake_samples_fails_the_comparison(monkeypatch):
    """Power: recognition gradients taken at the wake phase's (x, h) instead of the dream fail the comparison."""
    fast, slow = ws_pair()
    sleep = fast.fused.sleep_grads
    monkeypatch.setattr(fast.fused, "sleep_grads", lambda x, hs: sleep(x_wake[0], h_wake[0]))
    x = ws_batches(1)[0]
    state = fast.generator.get_state()
    x_wake, h_wake = [x], [fast.inference.sample(x, generator=torch.Generator().manual_seed(1))[0]]
    fast.generator.set_state(state)
    with pytest.raises(AssertionError):
        assert_same_ws_step(fast, slow, x, diagnostics=True)


def test_fused_wake_sleep_with_a_centred_input_takes_the_autograd_paths_updates():
    """trainer.accel=auto on a CPU with a training mean set: q's first layer reads the centred x (the data, and the
    dream in the sleep phase); the same updates as autograd."""
    fast, slow = ws_pair()
    for learner in (fast, slow):
        learner.inference.set_input_mean(torch.tensor([0.3, 0.0, 0.5, 0.9, 0.0, 0.25], dtype=torch.float64))
    assert fast.accelerate("auto") is fast
    for t, x in enumerate(ws_batches(4)):
        assert_same_ws_step(fast, slow, x, diagnostics=t % 2 == 0)
