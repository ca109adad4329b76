"""The VAE family (``nvil.models.vae``) through the contract, against log p(x) by quadrature: with one or two
latent units the integral over z is a sum on a fine grid, exact to far below the Monte Carlo errors here.

- The densities are normalised (prior and q(z | x) integrate to 1 on the grid); a q that forgets its scale fails.
- IWAE(K) from q and AIS through the protocol fall within 3 SE of the quadrature value, IWAE below it in
  expectation; the broken q's IWAE misses by many SE.
- learner=iwae's gradient with large k is the gradient of log p(x) (autograd through the quadrature), within its
  Monte Carlo error; the k = 1 (ELBO) gradient is not, so the test has power.
- ``train.py model=vae learner=iwae`` then ``evaluate.py`` with iwae, ais_hmc and bdmc, as a user would."""

from __future__ import annotations

import math

import pytest
import torch

import nvil
from conftest import SYNTHETIC
from nvil.estimators import IWAE, ModelAIS
from nvil.learners.iwae import ImportanceWeighted, stage_lr
from nvil.models.vae import VAE, GaussianLayer


def tiny_vae(latent=(1,), hidden=((6,),), seed: int = 0, n_visible: int = 5) -> VAE:
    torch.manual_seed(seed)
    vae = VAE(n_visible, list(latent), [list(h) for h in hidden]).double()
    with torch.no_grad():
        for p in vae.parameters():
            p.normal_(0, 0.7)
        for enc in vae.encoders:  # q(z | x) wider than the posterior: a proposal that covers it
            last = enc.net[-1]
            last.weight.mul_(0.3)
            last.bias[enc.n_out:] = 0.5
    return vae


def grid(d: int, n: int = 4001, lim: float = 9.0) -> tuple[torch.Tensor, float]:
    """Points [n^d, d] of a grid on [-lim, lim]^d and the log of each cell's volume."""
    axis = torch.linspace(-lim, lim, n, dtype=torch.float64)
    pts = torch.cartesian_prod(*[axis] * d).view(-1, d) if d > 1 else axis[:, None]
    return pts, d * math.log(axis[1] - axis[0])


def quadrature_log_p(vae: VAE, x: torch.Tensor, n: int = 4001) -> torch.Tensor:
    """log p(x) = log sum_grid p(z) p(x | z) dz, per row of x."""
    z, log_dz = grid(vae.latent.size, n)
    log_prior = vae.log_prior(z)
    out = [torch.logsumexp(log_prior + vae.log_likelihood(row.expand(z.shape[0], -1), z), 0) + log_dz for row in x]
    return torch.stack(out)


@pytest.fixture(scope="module")
def case():
    vae = tiny_vae()
    x = vae.sample(40, torch.Generator().manual_seed(3))[0]
    return vae, x, quadrature_log_p(vae, x)


def test_prior_and_proposal_are_normalised():
    vae = tiny_vae(latent=(1, 1), hidden=((4,), (3,)))
    z, log_dz = grid(2, 601, 9.0)
    assert torch.logsumexp(vae.log_prior(z) + log_dz, 0).item() == pytest.approx(0.0, abs=1e-4)
    x = torch.bernoulli(torch.full((3, 5), 0.5, dtype=torch.float64))
    q = vae.proposal(x)
    for i in range(3):
        log_q = q.log_prob(z[:, None, :].expand(-1, 3, -1))[:, i]
        assert torch.logsumexp(log_q + log_dz, 0).item() == pytest.approx(0.0, abs=1e-4)
    broken = GaussianLayer.log_prob(z[:, :1], torch.zeros(1), torch.full((1,), 1.0)) + 1.0  # a wrong constant
    assert abs(torch.logsumexp(broken + log_dz - math.log(2 * 9.0 / 600 * 600), 0).item()) > 0.5


def test_iwae_and_ais_agree_with_quadrature(case):
    vae, x, truth = case
    iwae = IWAE(num_samples=2000).estimate(vae, x, seed=0)
    gap = (iwae.log_p - truth).double()
    assert gap.mean().item() <= 3 * gap.std().item() / math.sqrt(len(gap)) + 1e-3
    assert abs(gap.mean().item()) < 3 * gap.std().item() / math.sqrt(len(gap)) + 2e-3
    ais = ModelAIS(num_betas=200, num_chains=16, iwae_samples=200, num_simulated=10).estimate(vae, x, seed=0)
    err = (ais.log_p - truth).double()
    assert abs(err.mean().item()) < 3 * err.std().item() / math.sqrt(len(err)) + 5e-3
    assert ais.certified is not False, ais.warnings


def test_a_proposal_that_forgets_its_scale_is_caught(case, monkeypatch):
    vae, x, truth = case
    good = IWAE(num_samples=200).estimate(vae, x, seed=0)
    monkeypatch.setattr(GaussianLayer, "log_prob", staticmethod(
        lambda z, mu, log_sigma: (-0.5 * ((z - mu) * torch.exp(-log_sigma)).square() - 0.9189385).sum(-1)))
    broken = IWAE(num_samples=200).estimate(vae, x, seed=0)
    se = (good.log_p - truth).std().item() / math.sqrt(len(truth))
    assert abs((good.log_p - truth).mean().item()) < 3 * se + 2e-3
    assert abs((broken.log_p - truth).mean().item()) > 10 * se


def gradient(vae: VAE, x: torch.Tensor, k: int, objective: str = "iwae", seed: int = 0) -> torch.Tensor:
    learner = ImportanceWeighted(vae, k=k, objective=objective, seed=seed)
    vae.zero_grad()
    loss, _ = learner.surrogate(x)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in vae.decoder.parameters()])


def test_the_iwae_gradient_is_the_gradient_of_log_p():
    vae = tiny_vae(seed=1)
    x = vae.sample(4, torch.Generator().manual_seed(5))[0]
    vae.zero_grad()
    (-quadrature_log_p(vae, x, 2001).mean()).backward()
    exact = torch.cat([p.grad.flatten() for p in vae.decoder.parameters()])
    draws = torch.stack([gradient(vae, x, 2000, seed=s) for s in range(8)])
    mean, se = draws.mean(0), draws.std(0) / math.sqrt(8)
    assert ((mean - exact).abs() <= 4 * se + 1e-3 * exact.abs().max()).all()
    elbo = torch.stack([gradient(vae, x, 2000, "elbo", seed=s) for s in range(8)]).mean(0)
    assert (elbo - exact).norm() > 10 * (mean - exact).norm()  # the VAE's gradient is not log p's


def test_k1_bounds_coincide_and_the_schedule_is_the_papers():
    vae = tiny_vae()
    x = vae.sample(8, torch.Generator().manual_seed(0))[0]
    a, _ = ImportanceWeighted(vae, k=1, objective="iwae", seed=2).surrogate(x)
    b, _ = ImportanceWeighted(vae, k=1, objective="elbo", seed=2).surrogate(x)
    assert a.item() == pytest.approx(b.item())
    ends = [sum(3**j for j in range(i + 1)) for i in range(8)]  # passes at the end of each stage: 1, 4, 13, ...
    assert [stage_lr(1e-3, 1, e - 1) for e in ends] == pytest.approx([1e-3 * 10 ** (-i / 7) for i in range(8)])
    assert stage_lr(1e-3, 1, ends[-1] - 1) == pytest.approx(1e-4) and ends[-1] == 3280


def test_train_then_evaluate_a_vae(tmp_path):
    run = nvil.train(*[o for o in SYNTHETIC if not o.startswith("model.layers")], "model=vae", "model.latent=[2]", "model.hidden=[[8]]", "learner=iwae",
                     "learner.k=5", "trainer.max_steps=60", run_dir=tmp_path / "run")
    assert run.metrics["val/tag"] == "val/iwae"
    model = nvil.load(run.checkpoint)
    x = model.sample(16)[0]
    iwae = nvil.evaluate(run.checkpoint, estimator="iwae", num_samples=50, **{"eval.num_examples": 30,
                                                                             "eval.progress": False})
    ais = nvil.evaluate(run.checkpoint, estimator="ais_hmc", num_betas=50, num_runs=4,
                        **{"eval.num_examples": 30, "eval.progress": False})
    assert ais.summary()["num_chains"] == 4 and math.isfinite(iwae.mean_log_p)
    assert ais.mean_log_p > iwae.mean_log_p - 3 * math.hypot(ais.stderr, iwae.stderr)
    # estimator=ais on a VAE is the same per-example AIS as ais_hmc's route: the same numbers for the same seed,
    # with the settings the user gave (num_chains=100 is AIS's log-Z default, honoured because it was given)
    by_name = nvil.evaluate(run.checkpoint, estimator="ais", num_betas=50, num_chains=4,
                            **{"eval.num_examples": 30, "eval.progress": False})
    assert torch.equal(by_name.log_p, ais.log_p) and by_name.summary()["schedule"] == "sigmoid"
    wide = nvil.evaluate(run.checkpoint, estimator="ais", num_betas=10, num_chains=100, iwae_samples=0,
                         num_simulated=0, **{"eval.num_examples": 2, "eval.progress": False})
    assert wide.summary()["num_chains"] == 100
    with pytest.raises(nvil.core.errors.ConfigError, match="reverse_sources is not a setting of estimator=ais "
                                                           r"\(per example, ModelAIS, on a VAE\)"):
        nvil.evaluate(run.checkpoint, estimator="ais", reverse_sources=["data"], **{"eval.progress": False})
    bdmc = nvil.evaluate(run.checkpoint, estimator="bdmc", num_simulated=8, num_betas=50, num_chains=2,
                         **{"eval.progress": False})
    assert bdmc.extras["bdmc_gap"] >= -1.0
    assert nvil.evaluate(model, x, estimator="iwae", num_samples=20).log_p.shape == (16,)
    with pytest.raises(nvil.core.errors.ConfigError, match="binary latent units.*chib_mh"):
        nvil.evaluate(run.checkpoint, estimator="chib", **{"eval.progress": False})
    with pytest.raises(nvil.core.errors.ConfigError, match="needs a capability"):
        nvil.evaluate(run.checkpoint, estimator="raise", **{"eval.progress": False})


@pytest.mark.slow
def test_two_stochastic_layers_agree_with_quadrature(monkeypatch):
    """z_2 -> z_1 -> x with q(z_1 | x) q(z_2 | z_1): IWAE and AIS from the proposal against a 2-D quadrature; the
    broken variant (the top layer's prior ignored in log p(z)) must miss it."""
    vae = tiny_vae(latent=(1, 1), hidden=((4,), (3,)))  # its prior sums to 1 on the grid (the test above)
    x = vae.sample(30, torch.Generator().manual_seed(5))[0]
    truth = quadrature_log_p(vae, x, n=301)  # within 1e-13 of n=601
    iwae = IWAE(num_samples=2000).estimate(vae, x, seed=1)
    gap = (iwae.log_p - truth).double()
    se = gap.std().item() / math.sqrt(len(gap))
    assert abs(gap.mean().item()) < 3 * se + 5e-3
    ais = ModelAIS(num_betas=100, num_chains=8, iwae_samples=200, num_simulated=4).estimate(vae, x, seed=1)
    err = (ais.log_p - truth).double()
    assert abs(err.mean().item()) < 3 * err.std().item() / math.sqrt(len(err)) + 5e-3
    top = vae.latent.layers[0]
    right = VAE.log_prior
    monkeypatch.setattr(VAE, "log_prior", lambda self, z: right(self, z) - GaussianLayer.log_prob(
        z[:, -top:], torch.zeros(top, dtype=z.dtype), torch.zeros(top, dtype=z.dtype)))
    wrong = IWAE(num_samples=2000).estimate(vae, x, seed=1)
    assert abs((wrong.log_p - truth).mean().item()) > 10 * se
