"""Certified log p(x) for a model of the user's own (nvil.models.protocol, nvil.estimators.model_estimators), checked
against closed forms (a linear-Gaussian VAE: p(x) = N(x; b, W W^T + sigma^2 I)) and brute-force sums (a binary VAE with
10 latent units), with a broken variant for each check: a log-likelihood that ignores z, a ladder too short, AIS that
loses to IWAE."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nvil
from nvil.core.errors import CheckpointError, ConfigError, UserError
from nvil.core.ops import mean_and_stderr
from nvil.estimators import BDMC, IWAE, Exact, ModelAIS, evaluate_model
from nvil.models.protocol import Latent, gaussian_log_prob


class LinearGaussianVAE(nn.Module):
    """z ~ N(0, I_d), x | z ~ N(W z + b, sigma^2 I): log p(x) in closed form; q(z | x) a deliberately rough Gaussian."""

    latent = Latent.continuous(2)

    def __init__(self, d: int = 2, v: int = 5, sigma: float = 1.0, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.W = nn.Parameter(0.8 * torch.randn(v, d, generator=g))
        self.b = nn.Parameter(torch.randn(v, generator=g))
        self.sigma = sigma

    def log_prior(self, z):
        return gaussian_log_prob(z)

    def log_likelihood(self, x, z):
        mu = z @ self.W.T + self.b
        return (-0.5 * ((x - mu) / self.sigma).square() - math.log(self.sigma) - 0.5 * math.log(2 * math.pi)).sum(-1)

    def sample_prior(self, n, generator):
        return torch.randn(n, self.W.shape[1], generator=generator)

    def sample_likelihood(self, z, generator):
        mu = z @ self.W.T + self.b
        return mu + self.sigma * torch.randn(mu.shape, generator=generator)

    def proposal(self, x):
        loc = 0.5 * (x - self.b) @ self.W  # not the posterior mean: the importance weights must do some work
        return torch.distributions.Independent(torch.distributions.Normal(loc, torch.ones_like(loc)), 1)

    def exact_log_p(self, x):
        cov = self.W @ self.W.T + self.sigma**2 * torch.eye(self.W.shape[0])
        return torch.distributions.MultivariateNormal(self.b, cov).log_prob(x).double()


class BinaryVAE(nn.Module):
    """z in {0, 1}^10 with a factorial Bernoulli prior, x in {0, 1}^12 Bernoulli given z; q(z | x) factorial."""

    latent = Latent.binary(10)

    def __init__(self, d: int = 10, v: int = 12, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.a = nn.Parameter(torch.randn(d, generator=g))
        self.W = nn.Parameter(2 * torch.randn(v, d, generator=g))
        self.c = nn.Parameter(torch.randn(v, generator=g))
        self.E = nn.Parameter(0.5 * torch.randn(d, v, generator=g))

    def log_prior(self, z):
        return -F.binary_cross_entropy_with_logits(self.a.expand_as(z), z, reduction="none").sum(-1)

    def log_likelihood(self, x, z):
        return -F.binary_cross_entropy_with_logits(z @ self.W.T + self.c, x, reduction="none").sum(-1)

    def sample_prior(self, n, generator):
        return (torch.rand(n, self.a.numel(), generator=generator) < torch.sigmoid(self.a)).float()

    def sample_likelihood(self, z, generator):
        p = torch.sigmoid(z @ self.W.T + self.c)
        return (torch.rand(p.shape, generator=generator) < p).float()

    def proposal(self, x):
        return torch.distributions.Bernoulli(logits=(x - 0.5) @ self.E.T + self.a)

    @torch.no_grad()
    def brute_force_log_p(self, x):
        """sum over the 1,024 states written out with itertools, independently of Exact's enumeration."""
        states = torch.tensor(list(itertools.product([0.0, 1.0], repeat=self.a.numel())))
        terms = [self.log_prior(states) + self.log_likelihood(row.expand(len(states), -1), states) for row in x]
        return torch.stack([torch.logsumexp(t.double(), 0) for t in terms])


def within(estimate, truth, k=3.0):
    """(mean difference, its standard error) of per-example estimates from the truth; the test is |mean| <= k se."""
    diff, se = mean_and_stderr(estimate.double() - truth.double())
    return diff, se, abs(diff) <= k * se + 1e-9


@pytest.fixture(scope="module")
def linear():
    model = LinearGaussianVAE()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        x = model.sample_likelihood(model.sample_prior(40, g), g)
    return model, x


@pytest.fixture(scope="module")
def binary():
    model = BinaryVAE()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        x = model.sample_likelihood(model.sample_prior(40, g), g)
    return model, x


# ---- a linear-Gaussian VAE: closed form ------------------------------------------------------------------------


def test_ais_on_a_linear_gaussian_vae_matches_the_closed_form_and_certifies(linear):
    model, x = linear
    result = evaluate_model(model, x, "ais", num_betas=100, num_chains=8, start="prior", num_simulated=30,
                            iwae_samples=100)
    diff, se, ok = within(result.log_p, model.exact_log_p(x))
    assert ok, f"AIS is {diff:.4f} +- {se:.4f} nats from the closed form"
    assert result.certified is True, result.warnings
    assert {"example_ess", "above_iwae", "bdmc_gap", "likelihood_consistency"} <= set(result.checks)


def test_a_ladder_too_short_misses_the_closed_form_and_bdmc_flags_it(linear):
    model, x = linear
    result = evaluate_model(model, x, "ais", num_betas=2, num_chains=2, start="prior", num_simulated=30,
                            iwae_samples=0)
    diff, se, ok = within(result.log_p, model.exact_log_p(x))
    assert not ok and diff < 0, f"two betas should miss the closed form, got {diff:.3f} +- {se:.3f}"
    assert result.certified is False and "bdmc_gap" in result.failed


def test_bdmc_brackets_the_closed_form_on_simulated_data(linear):
    model, _ = linear
    result = BDMC(num_simulated=40, num_betas=100, num_chains=4).estimate(model, seed=3)
    truth = model.exact_log_p(result.simulated)
    lower, se_lower = mean_and_stderr(result.log_p - truth)
    upper, se_upper = mean_and_stderr(result.log_p_upper - truth)
    assert lower <= 3 * se_lower and upper >= -3 * se_upper, (lower, upper)
    assert result.certified is True, result.warnings


def test_iwae_from_the_prior_lies_below_the_closed_form(linear):
    model, x = linear
    result = evaluate_model(model, x, "iwae", num_samples=1, start="prior")
    diff, se = mean_and_stderr(result.log_p - model.exact_log_p(x))
    assert diff < -3 * se, f"IWAE(1) from the prior should lie below log p(x): {diff:.3f} +- {se:.3f}"
    tight = evaluate_model(model, x, "iwae", num_samples=20_000, start="prior")
    assert within(tight.log_p, model.exact_log_p(x))[2]


def test_ais_below_a_cheaper_iwae_is_flagged(linear):
    model, x = linear
    result = evaluate_model(model, x, "ais", num_betas=1, num_chains=2, start="prior", iwae_samples=2000,
                            num_simulated=0)
    assert "above_iwae" in result.failed and result.certified is False


def test_chib_mh_on_a_users_continuous_model_matches_the_closed_form(linear, monkeypatch):
    """The Chib-style estimator with MH moves (Murray & Salakhutdinov 2009, appendix) on the user's densities;
    an adapter that hands it log p(x | z) for log p(x, z) (the prior dropped) must miss."""
    model, x = linear
    truth = model.exact_log_p(x)
    result = evaluate_model(model, x, "chib_mh", num_runs=40)
    diff, se, ok = within(result.log_p, truth)
    assert ok, f"chib_mh is {diff:.4f} +- {se:.4f} from the closed form"
    assert result.certified is True, result.warnings
    from nvil.models.protocol import ProtocolModel

    monkeypatch.setattr(ProtocolModel, "log_joint", lambda self, x, z: self.log_likelihood(x, z))
    broken = evaluate_model(model, x, "chib_mh", num_runs=40)
    assert not within(broken.log_p, truth)[2]


# ---- a binary VAE: brute force -----------------------------------------------------------------------------------


def test_exact_enumeration_equals_the_brute_force_sum(binary):
    model, x = binary
    result = evaluate_model(model, x, "exact")
    torch.testing.assert_close(result.log_p, model.brute_force_log_p(x), rtol=0, atol=1e-5)
    assert result.certified is True


@pytest.mark.parametrize("moves", ["gibbs", "mh"])
def test_ais_and_iwae_on_a_binary_vae_match_enumeration(binary, moves):
    model, x = binary
    truth = model.brute_force_log_p(x)
    ais = evaluate_model(model, x, "ais", num_betas=100, num_chains=8, moves=moves, num_simulated=20,
                         iwae_samples=300)
    diff, se, ok = within(ais.log_p, truth)
    assert ok, f"AIS ({moves}) is {diff:.4f} +- {se:.4f} from enumeration"
    assert ais.certified is True, ais.warnings
    iwae = evaluate_model(model, x, "iwae", num_samples=300)
    assert within(iwae.log_p, truth)[2]


def test_bdmc_brackets_enumeration_on_a_binary_vae(binary):
    model, _ = binary
    result = BDMC(num_simulated=40, num_betas=50, num_chains=4).estimate(model, seed=2)
    truth = model.brute_force_log_p(result.simulated)
    lower, se_lower = mean_and_stderr(result.log_p - truth)
    upper, se_upper = mean_and_stderr(result.log_p_upper - truth)
    assert lower <= 3 * se_lower and upper >= -3 * se_upper, (lower, upper)


def test_a_binary_ladder_too_short_is_flagged_by_bdmc(binary):
    model, _ = binary
    short = BDMC(num_simulated=40, num_betas=1, num_chains=1, start="prior", max_gap=0.5).estimate(model, seed=2)
    assert "bdmc_gap" in short.failed


# ---- the protocol as users write it --------------------------------------------------------------------------


def plain_functions(model: LinearGaussianVAE):
    """The same model as a namespace of plain functions: nothing of the package's is subclassed."""
    W, b, s = model.W.detach(), model.b.detach(), model.sigma

    def log_likelihood(x, z):
        return (-0.5 * ((x - z @ W.T - b) / s).square() - math.log(s) - 0.5 * math.log(2 * math.pi)).sum(-1)

    return SimpleNamespace(
        latent=nvil.Latent.continuous(2),
        log_prior=lambda z: -0.5 * (z.square().sum(-1) + 2 * math.log(2 * math.pi)),
        log_likelihood=log_likelihood,
        sample_prior=lambda n, generator: torch.randn(n, 2, generator=generator),
        sample_likelihood=lambda z, generator: z @ W.T + b + s * torch.randn(z.shape[0], W.shape[0], generator=generator),
    )


def test_a_namespace_of_plain_functions_is_a_model(linear):
    model, x = linear
    plain = plain_functions(model)
    a = evaluate_model(plain, x, "ais", num_betas=50, num_chains=8, num_simulated=20, iwae_samples=100, start="prior")
    b = evaluate_model(model, x, "ais", num_betas=50, num_chains=8, num_simulated=0, iwae_samples=0, start="prior")
    torch.testing.assert_close(a.log_p, b.log_p, rtol=0, atol=1e-4)  # the same draws, the same numbers
    assert a.certified is True, a.warnings
    assert within(a.log_p, model.exact_log_p(x))[2]


def test_a_log_likelihood_that_ignores_z_fails_the_checks(linear):
    model, x = linear
    broken = plain_functions(model)
    right = broken.log_likelihood
    broken.log_likelihood = lambda x, z: right(x, torch.zeros_like(z))
    result = evaluate_model(broken, x, "ais", num_betas=20, num_chains=4, num_simulated=30, iwae_samples=100)
    assert "likelihood_consistency" in result.failed and result.certified is False
    healthy = BDMC(num_simulated=30, num_betas=20, num_chains=4).estimate(plain_functions(model))
    assert "likelihood_consistency" not in healthy.failed


def test_a_model_without_samplers_is_scored_and_says_what_was_not_checked(linear):
    model, x = linear
    plain = plain_functions(model)
    del plain.sample_likelihood
    plain.proposal = model.proposal
    result = evaluate_model(plain, x, "ais", num_betas=50, num_chains=4, iwae_samples=100)
    assert "bdmc_gap" not in result.checks and "sample_likelihood" in result.extras["unchecked"]
    with pytest.raises(ConfigError, match="sample_prior"):
        evaluate_model(plain, x, "bdmc")


def test_a_model_with_a_prior_sampler_only_anneals_from_the_prior(linear):
    """AIS from p(z) needs ``sample_prior`` alone; BDMC, which simulates data, needs both samplers."""
    model, x = linear
    plain = plain_functions(model)
    del plain.sample_likelihood
    result = evaluate_model(plain, x, "ais", start="prior", num_betas=50, num_chains=4, iwae_samples=100)
    assert math.isfinite(result.mean_log_p)
    del plain.sample_prior
    with pytest.raises(ConfigError, match="sample_prior"):
        evaluate_model(plain, x, "ais", start="prior", num_betas=50, num_chains=4, iwae_samples=100)


def test_seeds_fix_the_estimate_and_the_users_module_mode_is_kept(binary):
    model, x = binary
    model.train()
    a = evaluate_model(model, x[:8], "ais", num_betas=20, num_chains=4, num_simulated=0, iwae_samples=0, seed=5)
    b = evaluate_model(model, x[:8], "ais", num_betas=20, num_chains=4, num_simulated=0, iwae_samples=0, seed=5)
    c = evaluate_model(model, x[:8], "ais", num_betas=20, num_chains=4, num_simulated=0, iwae_samples=0, seed=6)
    assert torch.equal(a.log_p, b.log_p) and not torch.equal(a.log_p, c.log_p)
    assert model.training
    d = evaluate_model(model, x[:8], "iwae", num_samples=50, seed=5)
    e = evaluate_model(model, x[:8], "iwae", num_samples=50, seed=5)
    assert torch.equal(d.log_p, e.log_p)


# ---- one line per problem ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("change, message", [
    (lambda m: delattr(m, "log_likelihood"), "lacks log_likelihood"),
    (lambda m: setattr(m, "latent", 2), "nvil.Latent"),
    (lambda m: setattr(m, "log_prior", lambda z: z), r"log_prior\(z\) must return one value per row"),
    (lambda m: setattr(m, "proposal", lambda x: torch.zeros(3)), "Distribution"),
    (lambda m: setattr(m, "proposal", lambda x: torch.distributions.Normal(torch.zeros(3), 1.0)), "batch and event"),
])
def test_a_model_that_breaks_the_protocol_is_one_line(linear, change, message):
    model, x = linear
    plain = plain_functions(model)
    change(plain)
    with pytest.raises(ConfigError, match=message):
        evaluate_model(plain, x[:4], "iwae", num_samples=4, start="proposal" if "proposal" in message or
                       "Distribution" in message or "batch" in message else None)


def test_settings_a_model_cannot_use_are_refused(linear, binary):
    with pytest.raises(ConfigError, match="continuous"):
        evaluate_model(linear[0], linear[1], "exact")
    with pytest.raises(ConfigError, match="limited to D <= 4"):
        Exact(max_latent=4).check(binary[0])
    with pytest.raises(ConfigError, match="not a setting of estimator=ais"):
        evaluate_model(linear[0], linear[1], "ais", num_temperatures=10)
    with pytest.raises(ConfigError, match="estimator=raise needs a capability"):
        evaluate_model(linear[0], linear[1], "raise")
    with pytest.raises(ConfigError, match="unknown estimator"):
        evaluate_model(linear[0], linear[1], "ais_typo")
    with pytest.raises(ConfigError, match="binary latent units.*continuous"):
        evaluate_model(linear[0], linear[1], "chib")
    with pytest.raises(ConfigError, match="fixed ladder"):
        ModelAIS(schedule="adaptive")
    with pytest.raises(ConfigError, match="moves"):
        ModelAIS(moves="swendsen")
    with pytest.raises(ConfigError, match="start"):
        IWAE(start="posterior")


# ---- evaluate.py model_module=... ------------------------------------------------------------------------------------

USER_FILE = """
import math, torch
from torch import nn
import nvil

class Decoder(nn.Module):
    latent = nvil.Latent.continuous(2)

    def __init__(self, visible=5):
        super().__init__()
        self.linear = nn.Linear(2, visible)

    def log_prior(self, z):
        return -0.5 * (z.square().sum(-1) + 2 * math.log(2 * math.pi))

    def log_likelihood(self, x, z):
        return (-0.5 * (x - self.linear(z)).square() - 0.5 * math.log(2 * math.pi)).sum(-1)

    def sample_prior(self, n, generator):
        return torch.randn(n, 2, generator=generator)

    def sample_likelihood(self, z, generator):
        mu = self.linear(z)
        return mu + torch.randn(mu.shape, generator=generator)
"""


@pytest.fixture
def user_files(tmp_path):
    (tmp_path / "decoder.py").write_text(USER_FILE)
    g = torch.Generator().manual_seed(0)
    weights = {"linear.weight": 0.8 * torch.randn(5, 2, generator=g), "linear.bias": torch.randn(5, generator=g)}
    torch.save(weights, tmp_path / "w.pt")
    cov = weights["linear.weight"] @ weights["linear.weight"].T + torch.eye(5)
    truth = torch.distributions.MultivariateNormal(weights["linear.bias"], cov)
    x = truth.sample((30,))
    torch.save(x, tmp_path / "x.pt")
    return tmp_path, truth.log_prob(x).double()


def test_evaluate_py_scores_a_users_module_with_its_weights(user_files, capsys):
    tmp, truth = user_files
    result = nvil.evaluate(tmp / "w.pt", f"model_module={tmp / 'decoder.py'}:Decoder", f"data_file={tmp / 'x.pt'}",
                           "estimator=ais", "estimator.num_betas=50", "estimator.num_chains=8",
                           "estimator.num_simulated=20", "estimator.iwae_samples=100", "eval.progress=false")
    assert within(result.log_p, truth)[2] and result.certified is True, result.warnings
    record = (tmp / "w.pt.eval.jsonl").read_text().splitlines()
    assert len(record) == 1 and '"estimator": "ais"' in record[0] and "decoder.py:Decoder" in record[0]


def test_evaluate_py_grows_a_users_ais_within_estimator_budget(user_files):
    tmp, truth = user_files
    result = nvil.evaluate(tmp / "w.pt", f"model_module={tmp / 'decoder.py'}:Decoder", f"data_file={tmp / 'x.pt'}",
                           "estimator=ais", "estimator.budget=60", "estimator.num_betas=160",
                           "estimator.num_chains=16", "estimator.num_simulated=10", "estimator.iwae_samples=50",
                           "eval.progress=false")
    rounds = result.extras["budget"]["rounds"]
    assert rounds[0]["num_betas"] == 10 and rounds[0]["num_chains"] == 4
    assert result.certified is rounds[-1]["certified"] and within(result.log_p, truth)[2], result.warnings


def test_evaluate_py_scores_a_users_module_by_smc_and_sizes_it_itself(user_files):
    """``estimator=smc`` on a user's module: per-example SMC, right against the closed form; with no schedule the
    budget is auto (300 s) and the result says what it spent."""
    tmp, truth = user_files
    common = [f"model_module={tmp / 'decoder.py'}:Decoder", f"data_file={tmp / 'x.pt'}", "estimator=smc",
              "estimator.num_simulated=10", "estimator.iwae_samples=50", "eval.progress=false"]
    fixed = nvil.evaluate(tmp / "w.pt", *common, "estimator.num_particles=16", "estimator.num_runs=4")
    assert "budget" not in fixed.extras and fixed.summary()["schedule"] == "smc"
    assert within(fixed.log_p, truth)[2], fixed.warnings
    auto = nvil.evaluate(tmp / "w.pt", *common)
    assert auto.extras["budget"]["seconds"] == 300 and auto.extras["budget"]["rounds"][0]["cess"] == 0.5
    assert auto.certified is True and within(auto.log_p, truth)[2], auto.warnings


@pytest.mark.parametrize("override, message", [
    ("estimator.num_temperatures=5", "not a setting of estimator=iwae"),
    ("model_kwargs={visible: 7}", "does not match"),
    ("data_file=missing.pt", "not found"),
])
def test_evaluate_py_with_a_users_module_refuses_bad_settings_in_one_line(user_files, override, message):
    tmp, _ = user_files
    overrides = [f"model_module={tmp / 'decoder.py'}:Decoder", f"data_file={tmp / 'x.pt'}", "estimator=iwae",
                 override.replace("missing.pt", str(tmp / "missing.pt"))]
    with pytest.raises(UserError, match=message):
        nvil.evaluate(tmp / "w.pt", *overrides)


def test_a_weights_file_that_pickles_objects_is_refused(user_files):
    tmp, _ = user_files
    torch.save({"linear.weight": torch.zeros(5, 2), "linear.bias": torch.zeros(5), "extra": SimpleNamespace()},
               tmp / "evil.pt")
    with pytest.raises(CheckpointError, match="pickled Python objects"):
        nvil.evaluate(tmp / "evil.pt", f"model_module={tmp / 'decoder.py'}:Decoder", f"data_file={tmp / 'x.pt'}")
