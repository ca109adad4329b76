"""The K-sample bounds' draws from q (``LayeredInference.sample``, torch.rand with the estimator's generator) against
exact enumeration on a tiny two-layer SBN: the ELBO within its standard error of the enumerated ELBO, the
importance-sampled bound at large K within its standard error of log p(x). A draw that takes every sample's layer-2
logits from the first sample's (the bug the stride-0 shortcut of ``_first_logits`` invites) must fail the ELBO
check."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import enumerated_elbo, make_cfg, tiny_model
from nvil.estimators import build_estimator
from nvil.estimators.bounds import elbo, importance_sampled_bound
from nvil.estimators.exact import enumerate_states, exact_log_marginal
from nvil.core.errors import ConfigError

def elbo_error_in_se(model, inference, x) -> torch.Tensor:
    """|ELBO estimate - enumerated ELBO| per example, in standard errors of the estimate (4,000 samples each)."""
    n = 4000
    with torch.no_grad():
        est = elbo(model, inference, x, n, generator=torch.Generator().manual_seed(0))
        log_w = torch.stack([elbo(model, inference, x, 1, generator=torch.Generator().manual_seed(s))
                             for s in range(1, 201)])
        exact = enumerated_elbo(model, inference, x)
    return (est - exact).abs() / (log_w.std(0) / math.sqrt(n))


def test_the_draws_give_the_enumerated_elbo(monkeypatch):
    model, inference = tiny_model(seed=2, scale=2.0, q_scale=1.5)  # a q far from uniform: the draws matter
    x = enumerate_states(6, 0, 64)[::9]
    assert (elbo_error_in_se(model, inference, x) <= 4).all()

    logits = type(inference).layer_logits

    def first_sample_only(self, i, below):  # every sample's layer-2 units drawn with sample 0's logits
        out = logits(self, i, below)
        return out if i == 0 or out.dim() < 3 else out[:1].expand(out.shape)

    monkeypatch.setattr(type(inference), "layer_logits", first_sample_only)
    assert (elbo_error_in_se(model, inference, x) > 4).any()


def test_the_draws_give_an_importance_sampled_bound_that_reaches_log_p():
    model, inference = tiny_model(seed=2)
    x = enumerate_states(6, 0, 64)[::21]
    with torch.no_grad():
        est = torch.stack([importance_sampled_bound(model, inference, x, 5000, generator=torch.Generator().manual_seed(s))
                           for s in range(10)])
        exact = exact_log_marginal(model, x)
    se = est.std(0) / math.sqrt(10)
    assert ((est.mean(0) - exact).abs() <= 3 * se + 1e-3).all()


def test_the_draws_follow_the_seed_and_a_bad_accel_is_refused():
    model, inference = tiny_model(seed=3)
    x = enumerate_states(6, 0, 64)[::5]

    def bound(seed=0):
        with torch.no_grad():
            return importance_sampled_bound(model, inference, x, 50, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(bound(), bound())      # reproducible from the seed
    assert not torch.equal(bound(), bound(1))
    cfg = make_cfg("evaluate", ["estimator=iwae", "estimator.accel=fast"]).estimator
    with pytest.raises(ConfigError, match="estimator.accel must be one of"):
        build_estimator(cfg)
