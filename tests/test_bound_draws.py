"""The K-sample bounds' draws from the C kernels' counter-based stream (``estimator.accel`` auto / native on a CPU:
``LayeredInference.sample(..., seed=...)``, ``nvil.backend.native.bernoulli_``) against exact enumeration on a tiny two-layer
SBN: the ELBO within its standard error of the enumerated ELBO, the importance-sampled bound at large K within its
standard error of log p(x). A draw that takes every sample's layer-2 probabilities from the first sample's (the bug the
stride-0 shortcut invites) must fail the ELBO check."""

from __future__ import annotations

import math

import pytest
import torch

import nvil.models.inference
from conftest import enumerated_elbo, make_cfg, tiny_model
from nvil.estimators import build_estimator
from nvil.estimators.bounds import elbo, importance_sampled_bound
from nvil.estimators.exact import enumerate_states, exact_log_marginal
from nvil.backend import native
from nvil.core.errors import ConfigError

pytestmark = pytest.mark.usefixtures("native_kernels")


def elbo_error_in_se(model, inference, x, accel: str) -> torch.Tensor:
    """|ELBO estimate - enumerated ELBO| per example, in standard errors of the estimate (4,000 samples each)."""
    n = 4000
    with torch.no_grad():
        est = elbo(model, inference, x, n, generator=torch.Generator().manual_seed(0), accel=accel)
        log_w = torch.stack([elbo(model, inference, x, 1, generator=torch.Generator().manual_seed(s), accel=accel)
                             for s in range(1, 201)])
        exact = enumerated_elbo(model, inference, x)
    return (est - exact).abs() / (log_w.std(0) / math.sqrt(n))


def test_seeded_draws_give_the_enumerated_elbo(monkeypatch):
    model, inference = tiny_model(seed=2, scale=2.0, q_scale=1.5)  # a q far from uniform: the draws matter
    x = enumerate_states(6, 0, 64)[::9]
    calls = []
    bernoulli = native.bernoulli_
    monkeypatch.setattr(native, "bernoulli_", lambda p, seed, offset=0: calls.append(offset) or bernoulli(p, seed, offset))
    assert (elbo_error_in_se(model, inference, x, "auto") <= 4).all()
    assert calls and any(offset > 0 for offset in calls)  # both layers drew from the C stream, the second after the first

    seeded = nvil.models.inference.seeded_bernoulli

    def first_sample_only(logits, seed, offset):  # every sample's units drawn with sample 0's probabilities
        return seeded(logits[:1].expand(logits.shape), seed, offset)

    monkeypatch.setattr(nvil.models.inference, "seeded_bernoulli", first_sample_only)
    assert (elbo_error_in_se(model, inference, x, "auto") > 4).any()


def test_seeded_draws_give_an_importance_sampled_bound_that_reaches_log_p():
    model, inference = tiny_model(seed=2)
    x = enumerate_states(6, 0, 64)[::21]
    with torch.no_grad():
        est = torch.stack([importance_sampled_bound(model, inference, x, 5000, generator=torch.Generator().manual_seed(s),
                                                    accel="auto") for s in range(10)])
        exact = exact_log_marginal(model, x)
    se = est.std(0) / math.sqrt(10)
    assert ((est.mean(0) - exact).abs() <= 3 * se + 1e-3).all()


def test_the_stream_follows_the_estimator_accel_and_the_seed():
    model, inference = tiny_model(seed=3)
    x = enumerate_states(6, 0, 64)[::5]

    def bound(accel, seed=0):
        with torch.no_grad():
            return importance_sampled_bound(model, inference, x, 50, generator=torch.Generator().manual_seed(seed),
                                            accel=accel)

    assert torch.equal(bound("auto"), bound("native"))  # one stream for both C modes
    assert torch.equal(bound("auto"), bound("auto"))    # reproducible from the seed
    assert not torch.equal(bound("auto"), bound("none"))  # torch.rand's stream
    assert not torch.equal(bound("auto"), bound("auto", seed=1))
    cfg = make_cfg("evaluate", ["estimator=iwae", "estimator.accel=fast"]).estimator
    with pytest.raises(ConfigError, match="estimator.accel must be one of"):
        build_estimator(cfg)
