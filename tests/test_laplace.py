"""The Laplace base (``nvil.models.laplace``, ``LaplaceBase``): a user's continuous model without a proposal is annealed
from a Gaussian fitted at each posterior mode. On a linear-Gaussian model the fit is the posterior (closed form);
AIS from it is unbiased for p(x) (a base whose log-density is off by a constant must fail the same test); and the
sharp model that the prior cannot reach in minutes (10 latents, 40 visibles, sigma 0.1) is certified by
``evaluate_model(model, x)`` with no settings, next to its closed-form log p(x)."""

from __future__ import annotations

import math

import pytest
import torch

import nvil
from nvil.core.errors import ConfigError
from nvil.estimators import ModelAIS
from nvil.models.laplace import INFLATION
from nvil.models.protocol import LaplaceBase, ProtocolModel
from test_user_model import BinaryVAE, LinearGaussianVAE


class NoProposal(LinearGaussianVAE):
    """The linear-Gaussian model of test_user_model with D latents and no q(z | x)."""

    proposal = None

    def __init__(self, d: int, v: int, sigma: float, seed: int = 0) -> None:
        super().__init__(d=d, v=v, sigma=sigma, seed=seed)
        self.latent = nvil.Latent.continuous(d)

    def posterior(self, x):
        """The exact posterior N(m, S): S = (I + W'W / sigma^2)^-1, m = S W'(x - b) / sigma^2."""
        w = self.W.detach().double()
        s = torch.linalg.inv(torch.eye(w.shape[1], dtype=w.dtype) + w.T @ w / self.sigma**2)
        return ((x.double() - self.b.detach().double()) @ w / self.sigma**2) @ s, s


def data(model, n: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        return model.sample_likelihood(model.sample_prior(n, g), g)


def test_the_fit_is_the_posterior_of_a_linear_gaussian_model():
    model = NoProposal(d=4, v=12, sigma=0.2)
    x = data(model, 6)
    f0 = LaplaceBase(ProtocolModel(model), x)
    mean, cov = model.posterior(x)
    torch.testing.assert_close(f0.loc.double(), mean, rtol=0, atol=2e-4)
    fitted = (f0.scale_tril @ f0.scale_tril.transpose(1, 2)).double() / INFLATION**2
    torch.testing.assert_close(fitted, cov.expand_as(fitted), rtol=2e-3, atol=1e-6)
    torch.testing.assert_close(f0.inv_mass.double(), (INFLATION**2 * cov.diagonal()).expand(6, -1), rtol=2e-3, atol=0)
    # its draws are the density it scores: sample mean and covariance of 20,000 draws
    z = f0.sample(20000, torch.Generator().manual_seed(0)).double()
    se = (INFLATION**2 * cov.diagonal()).sqrt() / math.sqrt(20000)
    assert ((z.mean(0) - mean).abs() < 4 * se).all()


def test_equal_rows_are_fitted_once_and_get_the_same_base():
    model = NoProposal(d=3, v=8, sigma=0.3)
    x = data(model, 3).repeat_interleave(4, 0)
    f0 = LaplaceBase(ProtocolModel(model), x)
    assert torch.equal(f0.loc[0], f0.loc[3]) and not torch.equal(f0.loc[0], f0.loc[4])


def normalised_ratio(monkeypatch=None, shift: float = 0.0):
    """mean and SE over runs and examples of p_hat(x) / p(x), AIS from the Laplace base with 4 betas."""
    if shift:
        monkeypatch.setattr(LaplaceBase, "log_prob", lambda self, z: self.q.log_prob(z) + shift)
    model = NoProposal(d=2, v=5, sigma=0.5)
    x = data(model, 4, seed=3)
    est = ModelAIS(num_betas=4, num_chains=4000, num_leapfrog=3, iwae_samples=0, num_simulated=0, batch_size=4)
    r = est.estimate(model, x, seed=0)
    assert r.extras["start"] == "laplace"
    ratio = torch.exp(r.run_log_p.double() - model.exact_log_p(x))
    return ratio.mean().item(), (ratio.std() / math.sqrt(ratio.numel())).item()


def test_ais_from_the_laplace_base_is_unbiased_for_p_x():
    mean, se = normalised_ratio()
    assert abs(mean - 1) < 3 * se and se < 0.02


def test_broken_variant_a_base_off_by_a_constant_is_caught(monkeypatch):
    mean, se = normalised_ratio(monkeypatch, shift=0.1)
    assert abs(mean - 1) > 3 * se


def test_the_sharp_model_is_certified_with_no_settings():
    """The model the prior start could not certify in 300 s: certified, next to the exact log p(x), cost reported."""
    model = NoProposal(d=10, v=40, sigma=0.1)
    x = data(model, 32)
    r = nvil.evaluate_model(model, x)
    exact = model.exact_log_p(x)
    assert r.certified, r.warnings
    assert r.extras["start"] == "laplace"
    low, high = r.extras["mean_log_p_band"]
    assert low <= exact.mean().item() <= high and high - low < 0.5, (low, exact.mean().item(), high)
    assert (r.log_p.double() - exact).abs().max() < 1.0
    assert 0 < r.extras["budget"]["spent"] < r.extras["budget"]["seconds"]


def test_binary_latents_refuse_a_laplace_start():
    with pytest.raises(ConfigError, match="laplace.*binary"):
        ProtocolModel(BinaryVAE()).base("laplace", torch.zeros(2, 12))
    with pytest.raises(ConfigError, match="prior, proposal or laplace"):
        ModelAIS(start="gaussian")


def test_an_estimate_above_its_reverse_runs_is_flagged():
    """The sandwich on the real rows: the runs back from the chains' final states; moved up by 2 nats the estimate
    fails reverse_order, moved down reverse_gap; without the reverse runs (the broken variant) neither is checked."""
    from dataclasses import replace

    model = NoProposal(d=3, v=8, sigma=0.3)
    x = data(model, 16)
    settings = {"num_betas": 100, "num_chains": 4, "num_leapfrog": 3, "iwae_samples": 0, "num_simulated": 0}
    est = ModelAIS(**settings)
    r = est.estimate(model, x, seed=0)
    assert "reverse_order" in r.checks and "reverse_order" not in r.failed, r.warnings
    assert r.extras["ais_minus_reverse"] <= 0.05 and r.extras["reverse_mean_log_p"] >= model.exact_log_p(x).mean() - 0.05
    for delta, check in ((2.0, "reverse_order"), (-2.0, "reverse_gap")):
        moved = replace(r, log_p=r.log_p + delta, checks=[], failed=[], warnings=[])
        est.check_reverse(moved)
        assert moved.failed == [check], (delta, moved.warnings)
    assert r.checks.index("reverse_gap") and "reverse_gap" not in r.failed
    unchecked = ModelAIS(**settings, reverse=False).estimate(model, x, seed=0)
    assert "reverse_order" not in unchecked.checks and unchecked.certified
