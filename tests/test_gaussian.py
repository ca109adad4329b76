"""Gaussian belief nets (Kingma 2013): the two forms are one model, AIS-HMC and the Chib-style MH estimator
agree with closed-form log p(x) on linear-Gaussian nets, MCEM climbs the exact likelihood of factor analysis,
and the learners train, resume and evaluate through the CLI paths."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from conftest import make_cfg
from nvil.estimators.annealing import schedule
from nvil.estimators.ais_hmc import ContinuousLatent, ais_hmc_log_w
from nvil.estimators.chib import chib_log_p, climb_to_mode
from nvil.models.gaussian import DynamicBayesNet, GaussianBeliefNet, gaussian_log_prob
from nvil.learners import build_learner
from nvil.mcmc.mh import MetropolisHastings

DT = torch.float64


def linear_net(n_visible=4, layers=(2, 2), sigma=0.5, visible_sigma=0.5, seed=0, form="auxiliary"):
    """A Gaussian net with f = identity and Gaussian visibles: every marginal is Gaussian, log p(x) is exact."""
    torch.manual_seed(seed)
    net = GaussianBeliefNet(n_visible, list(layers), form=form, visible="gaussian", nonlinearity="identity",
                            sigma=sigma, visible_sigma=visible_sigma, init_scale=1.0).double()
    return net


def exact_log_p(net: GaussianBeliefNet, x: torch.Tensor) -> torch.Tensor:
    """Closed form for a linear chain z_L -> ... -> z_1 -> x: propagate means and covariances."""
    mean = torch.zeros(net.latent_sizes[0], dtype=DT)
    cov = torch.eye(net.latent_sizes[0], dtype=DT)
    for i in range(1, len(net.latent_sizes)):
        lin = net.links[net.latent_link[i]]
        mean = lin.weight @ mean + lin.bias
        cov = lin.weight @ cov @ lin.weight.T + torch.diag(torch.exp(2 * net.log_sigma(i)))
    emit = net.emissions[0]
    mean = emit.weight @ mean + emit.bias
    cov = emit.weight @ cov @ emit.weight.T + torch.diag(torch.exp(2 * net.log_sigma_x))
    return torch.distributions.MultivariateNormal(mean, cov).log_prob(x)


# ---- the two forms are one model -----------------------------------------------------------------------


def test_auxiliary_density_is_the_centred_density_times_the_jacobian():
    torch.manual_seed(1)
    net = GaussianBeliefNet(5, [3, 2, 2], nonlinearity="tanh", sigma=0.3, init_scale=0.7).double()
    x, _ = net.sample(7)
    eps = torch.randn(7, net.n_latent, dtype=DT)
    z = net.to_centred(eps)
    aux = net.log_joint(x, eps, "auxiliary")
    cen = net.log_joint(x, z, "centred")
    assert torch.allclose(aux, cen + net.log_jacobian(), atol=1e-10)
    assert torch.allclose(net.to_auxiliary(z), eps, atol=1e-10)


def test_both_forms_give_the_same_p_x_by_quadrature():
    """A 2-latent net (scalar z_2 -> scalar z_1, tanh) above 3 binary pixels: integrate p(x, .) over a grid of z
    (centred) and of eps (auxiliary) and compare. Dropping the Jacobian or decoding z wrongly breaks this by
    |log sigma| = 0.69 nats or more."""
    torch.manual_seed(2)
    net = GaussianBeliefNet(3, [1, 1], nonlinearity="tanh", sigma=0.5, init_scale=1.5).double()
    x = torch.tensor([[1.0, 0.0, 1.0]], dtype=DT)
    grid = torch.linspace(-8, 8, 801, dtype=DT)
    da = (grid[1] - grid[0]) ** 2
    a, b = torch.meshgrid(grid, grid, indexing="ij")
    states = torch.stack([a.flatten(), b.flatten()], -1)  # (top, bottom) in ancestral order
    log_p = {form: torch.logsumexp(net.log_joint(x, states, form), 0) + torch.log(da) for form in ("centred", "auxiliary")}
    assert abs(log_p["centred"] - log_p["auxiliary"]) < 1e-6


def test_linear_net_matches_its_closed_form_by_quadrature():
    """The closed form the AIS and MCEM tests rely on, checked by quadrature on a 1 x 1 latent net."""
    net = linear_net(n_visible=2, layers=(1, 1), seed=3)
    x, _ = net.sample(3)
    grid = torch.linspace(-10, 10, 1001, dtype=DT)
    a, b = torch.meshgrid(grid, grid, indexing="ij")
    states = torch.stack([a.flatten(), b.flatten()], -1)
    quad = torch.logsumexp(net.log_joint(x[:, None, :], states[None], "auxiliary"), 1) + 2 * torch.log(grid[1] - grid[0])
    assert torch.allclose(quad, exact_log_p(net, x), atol=1e-6)


def test_dynamic_net_shares_parameters_over_time_and_samples_consistently():
    torch.manual_seed(4)
    net = DynamicBayesNet(length=4, latent_dim=3, obs_dim=2, sigma=0.2).double()
    assert len(net.links) == 1 and len(net.emissions) == 1  # A, a, C, c shared by every time step
    x, eps = net.sample(5)
    assert x.shape == (5, 8) and eps.shape == (5, 12)
    z = net.split(net.to_centred(eps))
    assert torch.allclose(z[2], torch.tanh(net.links[0](z[1])) + torch.exp(net.log_sigmas[0]) * net.split(eps)[2])
    assert torch.allclose(net.log_joint(x, eps, "auxiliary"), net.log_joint(x, net.to_centred(eps), "centred") + net.log_jacobian())


# ---- estimators against the closed form ---------------------------------------------------------------


@pytest.mark.parametrize("form", ["auxiliary", "centred"])
def test_ais_hmc_is_unbiased_for_p_x_on_a_linear_gaussian_net(form):
    """E[exp(log w)] = p(x) for each run: the mean of exp(log w - log p(x)) over runs and examples is 1 within
    3 standard errors; and the log estimate sits at the exact value within 3 standard errors over examples."""
    net = linear_net(seed=5)
    x, _ = net.sample(20, generator=torch.Generator().manual_seed(0))
    runs = 40
    lm = ContinuousLatent(net, "test", form)
    log_w, final = ais_hmc_log_w(lm, x.repeat_interleave(runs, 0), schedule("sigmoid", 200), chains=runs,
                                 num_leapfrog=5, step_size=0.1, generator=torch.Generator().manual_seed(1))
    exact = exact_log_p(net, x).detach()
    d = log_w.view(20, runs) - exact[:, None]
    ratio = d.exp()
    se = ratio.std() / math.sqrt(ratio.numel())
    assert abs(ratio.mean() - 1) < 3 * se, f"mean ratio {ratio.mean():.4f} +- {se:.4f}"
    per_example = torch.logsumexp(d, 1) - math.log(runs)
    assert abs(per_example.mean()) < max(3 * per_example.std() / math.sqrt(20), 0.02)
    assert 0.3 < final.accept_sum.mean() / 198 <= 1.0  # the step sizes adapted to a working acceptance


def test_ais_hmc_with_weights_taken_after_each_move_fails_the_same_check():
    """Power: the ordering several public ports get wrong (each increment taken at the state the move just
    produced) over-estimates p(x), and the unbiasedness check above rejects it."""
    from nvil.estimators.model_paths import ModelPath
    from nvil.models.protocol import ProtocolModel

    net = linear_net(seed=5)
    x, _ = net.sample(20, generator=torch.Generator().manual_seed(0))
    xs, g = x.repeat_interleave(40, 0), torch.Generator().manual_seed(1)
    pm = ProtocolModel(ContinuousLatent(net, "test", "auxiliary"))
    path = ModelPath(pm, xs, pm.base("prior", xs), num_leapfrog=5, target_accept=0.65, adapt=True)
    state = path.state(torch.randn(xs.shape[0], net.n_latent, generator=g, dtype=DT), torch.full((xs.shape[0],), 0.1, dtype=DT),
                       torch.zeros(xs.shape[0], dtype=DT))
    betas, log_w = schedule("sigmoid", 20).tolist(), 0.0
    with torch.no_grad():
        for k in range(1, len(betas)):
            state = path.transition(state, betas[k], g)  # moved first: the wrong order
            log_w = log_w + path.log_f(state, betas[k]) - path.log_f(state, betas[k - 1])
    ratio = (log_w.view(20, 40) - exact_log_p(net, x).detach()[:, None]).exp()
    se = ratio.std() / math.sqrt(ratio.numel())
    assert ratio.mean() - 1 > 3 * se


def chib_ratios(op_factory, net, x, runs, num_steps, seed=0):
    lm = ContinuousLatent(net, "test", "auxiliary")
    xs = x.repeat(runs, 1)
    g = torch.Generator().manual_seed(seed)
    log_f = lambda s: lm.log_joint(xs, s)  # noqa: E731
    h_star = climb_to_mode(log_f, lm.sample_prior(runs, g, x.device), 300, 0.05)
    log_p = chib_log_p(op_factory(log_f), h_star, num_steps, g)
    return (log_p - exact_log_p(net, x).detach()).exp()


@pytest.mark.parametrize("proposal", ["langevin", "random_walk"])
def test_chib_mh_is_unbiased_for_p_x(proposal):
    """Murray & Salakhutdinov 2009, appendix: exp(estimate) is unbiased for p(x) with MH transitions, runs that
    land back on h* included (they estimate 0)."""
    net = linear_net(n_visible=3, layers=(1, 1), seed=6)
    x, _ = net.sample(1, generator=torch.Generator().manual_seed(2))
    ratio = chib_ratios(lambda f: MetropolisHastings(f, 0.6, proposal), net, x, runs=4000, num_steps=5)
    se = ratio.std() / math.sqrt(ratio.numel())
    assert abs(ratio.mean() - 1) < 3 * se, f"{proposal}: mean ratio {ratio.mean():.4f} +- {se:.4f}"
    assert (ratio == 0).any()  # some runs rejected back onto h*: the appendix's zero estimates occur


def test_chib_mh_without_the_acceptance_term_is_caught():
    """Power: T(h* <- h) without the MH acceptance probability is not the transition density, and the same
    unbiasedness check rejects it."""
    net = linear_net(n_visible=3, layers=(1, 1), seed=6)
    x, _ = net.sample(1, generator=torch.Generator().manual_seed(2))

    class NoAccept(MetropolisHastings):
        def log_transition(self, to, frm):
            eps = self._eps(frm)
            mean, _ = self._mean(frm, eps)
            return self._log_q(to, mean, eps)

    ratio = chib_ratios(lambda f: NoAccept(f, 0.6, "random_walk"), net, x, runs=4000, num_steps=5)
    se = ratio.std() / math.sqrt(ratio.numel())
    assert abs(ratio.mean() - 1) > 3 * se


def test_prior_proposal_iwae_is_a_lower_bound_that_tightens_with_k():
    from nvil.estimators import IWAE

    net = linear_net(seed=7)
    x, _ = net.sample(30, generator=torch.Generator().manual_seed(3))
    exact = exact_log_p(net, x).detach()
    small = IWAE(num_samples=10, start="prior").estimate(net, x, seed=4).log_p
    large = IWAE(num_samples=20000, start="prior").estimate(net, x, seed=4).log_p
    assert (large.mean() - exact.mean()) < 0.05
    assert small.mean() < large.mean() - 0.1  # the weak baseline: far below at small K
    assert abs(large.mean() - exact.mean()) < 0.5


# ---- MCEM climbs the exact likelihood of factor analysis -------------------------------------------------


def fa_log_likelihood(net, x) -> float:
    return exact_log_p(net, x).mean().item()


def test_mcem_increases_the_exact_factor_analysis_likelihood_towards_its_maximum():
    """Probabilistic PCA with a fixed noise sd (Tipping & Bishop 1999): the maximum-likelihood W spans the top
    eigenvectors of the sample covariance S, W = U_k (Lambda_k - sigma^2 I)^1/2, c = the sample mean. MCEM (HMC
    E-step, Adagrad M-step, no parameter prior) must close most of the gap from its random start to that maximum."""
    torch.manual_seed(8)
    d, k, n, sigma = 5, 2, 400, 0.5
    truth = linear_net(n_visible=d, layers=(k,), visible_sigma=sigma, seed=9)
    with torch.no_grad():
        truth.emissions[0].weight.mul_(2.0)
        x, _ = truth.sample(n, generator=torch.Generator().manual_seed(5))
    centred = x - x.mean(0)
    evals, evecs = torch.linalg.eigh(centred.T @ centred / n)
    w_ml = evecs[:, -k:] * (evals[-k:] - sigma**2).clamp(min=0).sqrt()
    ml = torch.distributions.MultivariateNormal(x.mean(0), w_ml @ w_ml.T + sigma**2 * torch.eye(d, dtype=DT)).log_prob(x).mean().item()

    net = GaussianBeliefNet(d, [k], visible="gaussian", nonlinearity="identity", visible_sigma=sigma,
                            learn_sigma=False, init_scale=0.3).double()
    cfg = make_cfg("train", ["model=gbn", "learner=mcem_hmc", "learner.adapt=dual_averaging", "learner.lr=0.1",
                             "learner.prior_std=null", "learner.step_size=0.3"]).learner
    learner = build_learner(cfg, net, None, torch.device("cpu"), seed=0)
    learner.bind_data(x)
    before = fa_log_likelihood(net, x)
    rows = torch.arange(n)
    for _ in range(300):
        metrics = learner.step(x, indices=rows)
    after = fa_log_likelihood(net, x)
    assert after > before + 0.95 * (ml - before), f"start {before:.3f}, MCEM {after:.3f}, maximum {ml:.3f}"
    assert after <= ml + 1e-6
    assert 0.3 < metrics["mcmc/accept_rate"].item() < 0.95
    assert learner.grad_evals == 300 * (1 + 5 + 5)


# ---- learners, CLI, checkpoints ---------------------------------------------------------------------------

GBN = ["data=synthetic", "model=gbn", "model.layers=[3,2]", "learner=mcem_hmc", "trainer.device=cpu",
       "trainer.progress=false", "trainer.tensorboard=false", "print_config=false", "trainer.log_every=10",
       "trainer.val_every=20", "trainer.ckpt_every=20", "trainer.sample_every=1000", "trainer.val_num_examples=30",
       "trainer.val_num_samples=4", "trainer.val_ais_betas=20", "trainer.batch_size=50", "final_eval.enabled=false"]


@pytest.mark.parametrize("extra", [["model.form=auxiliary"], ["model.form=centred", "learner.adapt=dual_averaging"],
                                   ["learner=map_latents"]], ids=["auxiliary", "centred_da", "map_latents"])
def test_gaussian_learners_resume_exactly(tmp_path, extra):
    from nvil.core.checkpoint import load_checkpoint
    from nvil.app.main import train

    train(make_cfg("train", GBN + extra + ["trainer.max_steps=40"]), tmp_path / "straight")
    train(make_cfg("train", GBN + extra + ["trainer.max_steps=20"]), tmp_path / "resumed")
    m = train(make_cfg("train", GBN + extra + ["trainer.max_steps=40", "trainer.resume=true"]), tmp_path / "resumed")
    assert m["step"] == 40 and m["val/tag"] == "val/log_likelihood" and math.isfinite(m["val/best"])
    a = load_checkpoint(tmp_path / "straight/checkpoints/last.pt")
    b = load_checkpoint(tmp_path / "resumed/checkpoints/last.pt")
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert torch.equal(a["learner"]["chains"], b["learner"]["chains"])  # the persistent chains travel
    assert a["learner"]["chains"].shape == (5000, 5)
    import json

    logged = set().union(*(json.loads(line) for line in (tmp_path / "straight/metrics.jsonl").read_text().splitlines()))
    assert {"train/log_joint", "train/grad_evals", "val/log_likelihood"} <= logged
    if "learner=map_latents" not in extra:  # the sampler's diagnostics (the TensorBoard list)
        assert {"mcmc/accept_rate", "mcmc/accept_below_0.1", "mcmc/divergences", "mcmc/step_size_q10",
                "mcmc/step_size_q50", "mcmc/step_size_q90"} <= logged


def test_dynamic_bayes_net_trains_on_its_synthetic_sequences(tmp_path):
    from nvil.app.main import train

    overrides = [o for o in GBN if not o.startswith(("data=", "model=", "model.layers", "trainer.batch_size"))]
    m = train(make_cfg("train", overrides + ["model=dbn_dynamic", "data=synthetic_dynamic", "trainer.batch_size=100",
                                             "trainer.max_steps=20"]), tmp_path)
    assert m["step"] == 20 and math.isfinite(m["val/best"])


def test_gaussian_estimators_and_errors_through_evaluate(tmp_path):
    from nvil.core.config import estimator_config
    from nvil.core.errors import ConfigError
    from nvil.app.evaluation import EvalSpec, evaluate_checkpoint
    from nvil.app.main import train

    m = train(make_cfg("train", GBN + ["trainer.max_steps=20"]), tmp_path)
    small = {"ais_hmc": {"num_betas": 30, "num_runs": 4}, "chib_mh": {"num_steps": 3, "num_runs": 4, "hill_climb_steps": 20},
             "iwae": {"num_samples": 50}}
    results = {}
    for name, opts in small.items():
        cfg = OmegaConf.merge(estimator_config(name), opts)
        results[name] = evaluate_checkpoint(m["checkpoint"], cfg, EvalSpec(
            device="cpu", progress=False, num_examples=20))
        assert torch.isfinite(results[name].log_p).all() and results[name].log_p.shape == (20,)
    assert results["iwae"].extras["proposal"] == "laplace"  # no inference network: a Laplace fit per example
    for name, hint in [("chib", "ais_hmc"), ("ais_posterior", "ais_hmc")]:
        with pytest.raises(ConfigError, match=hint):
            evaluate_checkpoint(m["checkpoint"], estimator_config(name), EvalSpec(
                device="cpu", progress=False, num_examples=5))
    # estimator=ais on a Gaussian net is per-example AIS through the protocol (ModelAIS), with its own defaults
    # and the settings given (not the Boltzmann machine's log-Z defaults of ais.yaml)
    ais = evaluate_checkpoint(m["checkpoint"], OmegaConf.merge(estimator_config("ais"), {"num_betas": 30, "num_chains": 4}),
                              EvalSpec(device="cpu", progress=False, num_examples=5, given=("num_betas", "num_chains")))
    assert ais.summary()["num_chains"] == 4 and ais.summary()["schedule"] == "sigmoid"
    assert torch.isfinite(ais.log_p).all()


def test_continuous_estimators_and_learners_refuse_other_models(tmp_path):
    from nvil.core.config import estimator_config
    from nvil.core.errors import ConfigError
    from nvil.app.evaluation import EvalSpec, evaluate_checkpoint
    from nvil.app.main import train

    sbn = [o for o in GBN if not o.startswith(("model=", "model.layers", "learner=", "trainer.val_"))] + ["model.layers=[4,3]"]
    m = train(make_cfg("train", sbn + ["trainer.max_steps=5"]), tmp_path)
    for name in ("ais_hmc", "chib_mh"):
        with pytest.raises(ConfigError, match="continuous latent"):
            evaluate_checkpoint(m["checkpoint"], estimator_config(name), EvalSpec(
                device="cpu", progress=False, num_examples=5))
    with pytest.raises(ConfigError, match="Gaussian belief nets"):
        train(make_cfg("train", sbn + ["learner=mcem_hmc", "trainer.max_steps=5"]), tmp_path / "x")
    with pytest.raises(ConfigError, match="real-valued"):
        train(make_cfg("train", [o for o in GBN if not o.startswith(("data=", "model.layers"))] +
                       ["data=synthetic_dynamic", "trainer.max_steps=5"]), tmp_path / "y")
    with pytest.raises(ConfigError, match="model.form"):
        train(make_cfg("train", GBN + ["model.form=centered", "trainer.max_steps=5"]), tmp_path / "z")


def test_gaussian_log_prob_matches_torch():
    x, mean, log_sigma = torch.randn(4, 3, dtype=DT), torch.randn(3, dtype=DT), torch.randn(3, dtype=DT)
    ref = torch.distributions.Normal(mean, log_sigma.exp()).log_prob(x).sum(-1)
    assert torch.allclose(gaussian_log_prob(x, mean, log_sigma), ref)
