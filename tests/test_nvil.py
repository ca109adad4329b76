"""NVIL gradient estimates against the exact ELBO gradient by enumeration (tiny SBN 6-4-3)."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from conftest import enumerated_elbo, make_cfg, tiny_model
from nvil.learners.baselines import layerwise_signals
from nvil.learners import learner_settings
from nvil.learners.nvil import NVIL

ALL_ON = dict(input_baseline=True, constant_baseline=True, variance_normalisation=True, layerwise=True)
ALL_OFF = dict(input_baseline=False, constant_baseline=False, variance_normalisation=False, layerwise=False)
X = torch.tensor([[1, 0, 1, 1, 0, 0], [0, 1, 1, 0, 1, 0], [1, 1, 1, 0, 0, 1], [0, 0, 0, 1, 1, 1]],
                 dtype=torch.float32)


MODELS = {
    "sbn": dict(layers=(4, 3)),
    "fdarn": dict(layers=(6,), name="fdarn"),
    "sbn_ar_q": dict(layers=(4, 3), autoregressive_q=True),
}


def make_learner(switches: dict, seed: int = 0, model: str = "sbn") -> NVIL:
    model, inference = tiny_model(seed=5, scale=1.0, q_scale=0.5, **MODELS[model])
    cfg = OmegaConf.merge(make_cfg("train").learner, switches)
    return NVIL(model, inference, device=torch.device("cpu"), seed=seed, **learner_settings(cfg))


def train_baselines(learner: NVIL, steps: int = 1500) -> None:
    """Fit b_psi, c and v at fixed model and inference parameters (their rates set to zero)."""
    for group in learner.optimizer.param_groups:
        group["lr"] = 0.0 if group["name"] != "baseline" else 3e-3
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        learner.step(X[torch.randint(0, 4, (20,), generator=g)])


def gradient_groups(learner: NVIL, groups: int = 150, reps: int = 256) -> dict[str, torch.Tensor]:
    """[groups, ...] mean gradient estimates, each from reps samples per row of X; c, v held fixed.

    The surrogate's gradient is minus NVIL's ascent direction, so it is negated here.
    """
    x = X.repeat(reps, 1)
    params = dict(learner.model.named_parameters(prefix="model")) | dict(
        learner.inference.named_parameters(prefix="inference"))
    out = {k: [] for k in params}
    for _ in range(groups):
        learner.zero_grad(set_to_none=True)
        loss, _ = learner.surrogate(x, update_moments=False)
        loss.backward()
        for k, p in params.items():
            out[k].append(-p.grad.detach().clone())
    return {k: torch.stack(v) for k, v in out.items()}


def exact_gradient(learner: NVIL) -> dict[str, torch.Tensor]:
    """grad of mean_x ELBO(x) w.r.t. every parameter, by enumerating the 2^7 latent states.

    Variance normalisation divides layer j's inference signal by max(1, sqrt(v_j)), a positive
    constant per layer, so the expected inference gradient of encoder j is the exact one times it.
    """
    model, inference = learner.model, learner.inference
    model.zero_grad(), inference.zero_grad()
    enumerated_elbo(model, inference, X).mean().backward()
    grads = {f"model.{k}": p.grad.clone() for k, p in model.named_parameters()}
    for k, p in inference.named_parameters():
        j = int(k.split(".")[1])
        scale = learner.moments[j].var.sqrt().clamp(min=1.0) if learner.use_variance_norm else 1.0
        grads[f"inference.{k}"] = p.grad.clone() / scale
    return grads


def test_layerwise_signals_keep_the_terms_that_depend_on_each_layer():
    lp = [torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([4.0])]  # log p(x|h1), log p(h1|h2), log p(h2)
    lq = [torch.tensor([8.0]), torch.tensor([16.0])]                      # log q(h1|x), log q(h2|h1)
    l1, l2 = layerwise_signals(lp, lq, layerwise=True)
    assert l1.item() == 1 + 2 + 4 - 8 - 16  # log p(x, h1, h2) - log q(h1, h2 | x)
    assert l2.item() == 2 + 4 - 16          # log p(h1, h2) - log q(h2 | h1)
    assert [t.item() for t in layerwise_signals(lp, lq, layerwise=False)] == [l1.item(), l1.item()]


@pytest.mark.parametrize("switches, model", [
    (ALL_ON, "sbn"), (ALL_OFF, "sbn"), (dict(ALL_ON, layerwise=False), "sbn"), (ALL_ON, "fdarn"), (ALL_ON, "sbn_ar_q"),
], ids=["all_on", "all_off", "global_signal", "fdarn", "sbn_autoregressive_q"])
def test_nvil_gradient_matches_exact_elbo_gradient(switches, model):
    torch.manual_seed(0)
    learner = make_learner(switches, model=model)
    if switches["input_baseline"] or switches["constant_baseline"]:
        train_baselines(learner, steps=300)
    estimates = gradient_groups(learner)
    exact = exact_gradient(learner)
    worst = 0.0
    for k, g in estimates.items():
        mean, se = g.mean(0), g.std(0) / math.sqrt(g.shape[0])
        z = ((mean - exact[k]).abs() / (se + 1e-7)).max().item()
        worst = max(worst, z)
        assert z < 4.0, f"{k}: NVIL mean gradient is {z:.1f} standard errors from the exact gradient"
        # Power: the estimate is precise enough to tell the exact gradient from zero somewhere.
    total_se = torch.cat([(g.std(0) / math.sqrt(g.shape[0])).flatten() for g in estimates.values()])
    total_exact = torch.cat([e.flatten() for e in exact.values()])
    assert total_exact.abs().max() > 10 * total_se.median()


def test_variance_reduction_lowers_inference_gradient_variance():
    """Same parameters, baselines fitted: the centred, normalised signal gives a lower-variance
    inference gradient than the raw signal (normalisation undone, so both estimate the same vector)."""
    torch.manual_seed(0)
    on = make_learner(ALL_ON)
    train_baselines(on, steps=750)
    off = make_learner(ALL_OFF)
    off.model.load_state_dict(on.model.state_dict())
    off.inference.load_state_dict(on.inference.state_dict())

    def inference_variance(learner):
        grads = gradient_groups(learner, groups=100, reps=16)
        total = 0.0
        for k, g in grads.items():
            if k.startswith("inference."):
                j = int(k.split(".")[2])
                scale = learner.moments[j].var.sqrt().clamp(min=1.0) if learner.use_variance_norm else 1.0
                total += (g * scale).var(0).sum().item()
        return total

    v_on, v_off = inference_variance(on), inference_variance(off)
    assert v_on < 0.5 * v_off, f"variance with baselines {v_on:.3g} is not well below {v_off:.3g} without"


def test_running_moments_follow_algorithm_1():
    learner = make_learner(ALL_ON)
    m = learner.moments[0]
    m.update(torch.tensor([1.0, 3.0]))          # first batch sets the statistics
    assert (m.mean.item(), m.var.item()) == (2.0, 1.0)
    m.update(torch.tensor([5.0, 5.0]))          # then c <- 0.8 c + 0.2 mean, v <- 0.8 v + 0.2 var
    assert m.mean.item() == pytest.approx(0.8 * 2 + 0.2 * 5)
    assert m.var.item() == pytest.approx(0.8 * 1 + 0.2 * 0)
