"""Estimators against exact enumeration on a tiny SBN (6 visible, latents 4-3)."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import enumerated_elbo, tiny_model
from nvil.estimators.bounds import elbo, importance_sampled_bound
from nvil.estimators.exact import enumerate_states, exact_log_marginal
from nvil.models.sbn import SBN
from nvil.core.errors import ConfigError


def test_exact_marginal_is_normalised_over_all_visible_states():
    model, _ = tiny_model()
    all_v = enumerate_states(6, 0, 64)
    total = exact_log_marginal(model, all_v).double().exp().sum().item()
    assert abs(total - 1.0) < 1e-5


def test_exact_marginal_matches_a_hand_sum_for_one_latent():
    """p(v) = sum_{h in {0,1}} p(h) p(v | h) written out by hand for a 3-1 SBN."""
    torch.manual_seed(3)
    model = SBN(3, [1])
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    v = torch.tensor([[1.0, 0.0, 1.0]])
    w, b, a = model.decoders[0].weight[:, 0], model.decoders[0].bias, model.prior_logits[0]
    total = 0.0
    for h in (0.0, 1.0):
        ph = torch.sigmoid(a) if h else 1 - torch.sigmoid(a)
        pv = torch.sigmoid(w * h + b)
        total = total + ph * torch.prod(torch.where(v[0] > 0, pv, 1 - pv))
    assert exact_log_marginal(model, v).item() == pytest.approx(math.log(total.item()), abs=1e-5)


def test_exact_refuses_large_models_with_a_clear_message():
    model = SBN(6, [21])
    with pytest.raises(ConfigError, match=r"D <= 20.*D = 21"):
        exact_log_marginal(model, torch.zeros(2, 6))


def test_is_bound_grows_with_k_and_reaches_exact():
    """E[L_K] is non-decreasing in K; at K = 20000 it is within 3 standard errors of log p(v)."""
    model, inference = tiny_model(seed=1)
    x = torch.tensor([[1, 0, 1, 1, 0, 0], [0, 1, 1, 0, 1, 0]], dtype=torch.float32)
    exact = exact_log_marginal(model, x)
    g = torch.Generator().manual_seed(0)
    reps = 200
    means, ses = [], []
    for k in (1, 10, 100, 1000):
        est = importance_sampled_bound(model, inference, x.repeat(reps, 1), k, generator=g).view(reps, 2)
        means.append(est.mean(0))
        ses.append(est.std(0) / math.sqrt(reps))
    for (m0, s0), (m1, s1) in zip(zip(means, ses), zip(means[1:], ses[1:])):
        assert torch.all(m1 >= m0 - 3 * torch.sqrt(s0**2 + s1**2))
    assert torch.all(means[-1] > means[0] + 0.1)  # the test has power: the bound really moves
    est = importance_sampled_bound(model, inference, x.repeat(20, 1), 20000, generator=g).view(20, 2)
    se = est.std(0) / math.sqrt(20)
    assert torch.all((est.mean(0) - exact).abs() <= 3 * se + 1e-4)
    assert torch.all(est.mean(0) <= exact + 3 * se + 1e-4)


def test_elbo_estimate_matches_enumerated_elbo_and_lies_below_log_p():
    model, inference = tiny_model(seed=2)
    x = enumerate_states(6, 0, 64)[::9]
    g = torch.Generator().manual_seed(0)
    n = 4000
    est = elbo(model, inference, x, n, generator=g)
    with torch.no_grad():
        exact_elbo = enumerated_elbo(model, inference, x)
        log_w = torch.stack([
            elbo(model, inference, x, 1, generator=g) for _ in range(200)])
    se = log_w.std(0) / math.sqrt(n)
    assert torch.all((est - exact_elbo).abs() <= 4 * se)
    assert torch.all(exact_elbo <= exact_log_marginal(model, x) + 1e-5)


def test_chunking_keeps_the_estimator_unbiased():
    """Tiny chunks (one sample each) give the same distribution as one big chunk."""
    model, inference = tiny_model(seed=4)
    x = torch.tensor([[1, 1, 0, 0, 1, 0]], dtype=torch.float32).repeat(400, 1)
    g = torch.Generator().manual_seed(0)
    big = importance_sampled_bound(model, inference, x, 50, generator=g)
    small = importance_sampled_bound(model, inference, x, 50, generator=g, max_elements=1)
    se = torch.sqrt(big.var() / 400 + small.var() / 400)
    assert abs(big.mean() - small.mean()) <= 4 * se
