"""The discrete gradient estimators (``nvil.learners.discrete``) against exact gradients by enumeration.

Each estimator's mean over many draws is compared, coordinate by coordinate, with the exact gradient of its
objective (the ELBO; VIMCO: the K-sample bound) on a tiny two-layer SBN: within 4 standard errors of the mean.
Each has a deliberately broken variant (a baseline or antithetic partner that depends on the sample itself, or a
control variate left uncorrected) that must fail the same test by a wide margin, so the test has power. Gumbel-ST
is biased by construction and must fail it too.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from omegaconf import OmegaConf

from conftest import enumerated_elbo, make_cfg, tiny_model
from nvil.estimators.exact import enumerate_states, split_layers
from nvil.learners import LEARNERS, learner_settings
from nvil.learners.baselines import layerwise_signals
from nvil.learners.discrete import ARM, REBAR, RELAX, RLOO, VIMCO, DisARM
from nvil.learners.discrete.relaxed import _cat_broadcast, conditional_logistic, conditional_uniform, mlp, on_parts
from nvil.learners.nvil import NVIL
from nvil.backend.native.bernoulli_log_prob import bernoulli_log_prob

X = torch.tensor([[1, 0, 1, 1, 0, 0], [0, 1, 1, 0, 1, 0], [1, 1, 1, 0, 0, 1], [0, 0, 0, 1, 1, 1]],
                 dtype=torch.float32)
PASS_Z, FAIL_Z = 4.0, 8.0


def learner(name: str, layers=(4, 3), cls=None, **overrides):
    model, inference = tiny_model(layers=layers, seed=5, scale=1.0, q_scale=0.8)
    cfg = OmegaConf.merge(make_cfg("train", [f"learner={name}"]).learner, overrides)
    return (cls or LEARNERS[name])(model, inference, device=torch.device("cpu"), seed=0, **learner_settings(cfg))


def exact_elbo_gradient(lrn) -> dict[str, torch.Tensor]:
    params = lrn.estimated_params()
    grads = torch.autograd.grad(enumerated_elbo(lrn.model, lrn.inference, X).mean(), list(params.values()))
    return dict(zip(params, grads))


def exact_bound_gradient(lrn, k: int) -> dict[str, torch.Tensor]:
    """The gradient of mean_x E[log (1/K) sum_k w_k] by enumerating every K-tuple of latent states."""
    model, inference = lrn.model, lrn.inference
    h = enumerate_states(model.n_latent, 0, 2**model.n_latent, dtype=X.dtype)
    hs = [t.unsqueeze(1) for t in split_layers(h, model.layers)]
    log_q = inference.log_prob(hs, X.unsqueeze(0))                      # [S, batch]
    log_w = model.log_joint(X.unsqueeze(0), hs) - log_q
    s = h.shape[0]
    total = 0.0
    for idx in itertools.product(range(s), repeat=k - 1):             # the last sample's index vectorised
        fixed_q = sum(log_q[i] for i in idx)
        fixed_w = torch.stack([log_w[i] for i in idx])                   # [k - 1, batch]
        lw = torch.cat([fixed_w.unsqueeze(1).expand(-1, s, -1), log_w.unsqueeze(0)])   # [k, S, batch]
        bound = torch.logsumexp(lw, 0) - math.log(k)
        total = total + ((fixed_q + log_q).exp() * bound).sum(0)
    params = lrn.estimated_params()
    grads = torch.autograd.grad(total.mean(), list(params.values()))
    return dict(zip(params, grads))


def worst_z(lrn, exact: dict[str, torch.Tensor], groups: int = 60, reps: int = 256) -> float:
    """max over coordinates of |mean estimate - exact| / SE, from ``groups`` estimates on X repeated ``reps``
    times; also checks the estimates are precise enough to tell the exact gradient from zero."""
    torch.manual_seed(0)
    x = X.repeat(reps, 1)
    draws = [lrn.gradient_estimate(x) for _ in range(groups)]
    worst, ses, exacts = 0.0, [], []
    for k, e in exact.items():
        g = torch.stack([d[k].detach() for d in draws])
        se = g.std(0) / math.sqrt(groups)
        worst = max(worst, ((g.mean(0) - e).abs() / (se + 1e-7)).max().item())
        ses.append(se.flatten())
        exacts.append(e.flatten())
    assert torch.cat(exacts).abs().max() > 10 * torch.cat(ses).median(), "too few draws to tell anything"
    return worst


# ---- broken variants: each breaks the one thing that makes its estimator unbiased ----------------------------------
class SelfBaselineNVIL(NVIL):
    """Subtracts half of each sample's own signal: its baseline depends on the sample."""

    def signals(self, log_p, log_q, b, update_moments, diagnostics):
        signals, metrics = super().signals(log_p, log_q, b, update_moments, diagnostics)
        ls = layerwise_signals(log_p, log_q, self.flags.layerwise)
        return [s._replace(a=s.a - 0.5 * l / s.scale) for s, l in zip(signals, ls)], metrics


class SelfBaselineRLOO(RLOO):
    @staticmethod
    def baseline(f):
        return f.mean(0, keepdim=True)  # includes the sample's own f


class SelfBaselineVIMCO(VIMCO):
    @staticmethod
    def leave_one_out(log_w):
        return log_w.mean(0, keepdim=True).expand_as(log_w)  # the geometric mean of all K, its own included


class IndependentARM(ARM):
    def antithetic(self, u):
        return self.rand(u.shape, u)  # a fresh draw, not 1 - u: the pair is no longer antithetic


class SignedDisARM(DisARM):
    def logit_gradient(self, f, f_anti, u, b, b_anti, prob):
        sign = 1.0 - 2.0 * b_anti
        return 0.5 * (f - f_anti).unsqueeze(-1) * sign * (b != b_anti).to(f.dtype) * prob  # sigmoid(alpha), not |alpha|


class UncorrectedREBAR(REBAR):
    def correction(self, c_z, c_zt):
        return c_z.mean()  # the control variate's -grad c(z~) left out


class UncorrectedRELAX(RELAX):
    def correction(self, c_z, c_zt):
        return c_z.mean()


def perturbed(lrn):
    """Control variates away from their starting point (eta, lambda, and RELAX's r_rho), as after training."""
    cv = lrn.control_variate
    with torch.no_grad():
        cv.eta.fill_(0.7)
        cv.log_temperature.fill_(math.log(0.4))
        g = torch.Generator().manual_seed(3)
        for net in cv.networks():
            for p in net.parameters():
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
    return lrn


# The RELAX authors' code (duvenaud/relax): one r_rho per layer on (x - mean, z_i, 2 b_<i - 1), two ReLU layers,
# weight decay, and the logit-space variance objective.
AUTHORS = dict(cv_inputs="x_z", cv_depth=2, cv_activation="relu", cv_weight_decay=0.01, cv_objective="logits",
               cv_noise="common")  # common: z~ from z's own uniform (their v_from_u)


def fitted_nvil(cls=NVIL):
    lrn = learner("nvil", cls=cls)
    for group in lrn.optimizer.param_groups:
        group["lr"] = 0.0 if group["name"] != "baseline" else 3e-3
    g = torch.Generator().manual_seed(1)
    for _ in range(300):
        lrn.step(X[torch.randint(0, 4, (20,), generator=g)])
    return lrn


CASES = {  # name: (make the estimator, make its broken variant)
    "nvil": (fitted_nvil, lambda: fitted_nvil(SelfBaselineNVIL)),
    "rloo": (lambda: learner("rloo"), lambda: learner("rloo", cls=SelfBaselineRLOO)),
    "arm": (lambda: learner("arm"), lambda: learner("arm", cls=IndependentARM)),
    "disarm": (lambda: learner("disarm"), lambda: learner("disarm", cls=SignedDisARM)),
    "rebar": (lambda: perturbed(learner("rebar")), lambda: perturbed(learner("rebar", cls=UncorrectedREBAR))),
    "relax": (lambda: perturbed(learner("relax")), lambda: perturbed(learner("relax", cls=UncorrectedRELAX))),
    "rebar_common": (lambda: perturbed(learner("rebar", cv_noise="common")),
                     lambda: perturbed(learner("rebar", cls=UncorrectedREBAR, cv_noise="common"))),
    "relax_authors": (lambda: perturbed(learner("relax", **AUTHORS)),
                      lambda: perturbed(learner("relax", cls=UncorrectedRELAX, **AUTHORS))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_estimator_is_unbiased_for_the_elbo_gradient(name):
    make, _ = CASES[name]
    lrn = make()
    z = worst_z(lrn, exact_elbo_gradient(lrn))
    assert z < PASS_Z, f"{name}: mean gradient {z:.1f} standard errors from the exact ELBO gradient"


@pytest.mark.parametrize("name", list(CASES))
def test_broken_variant_fails_the_same_test(name):
    _, make_broken = CASES[name]
    lrn = make_broken()
    z = worst_z(lrn, exact_elbo_gradient(lrn))
    assert z > FAIL_Z, f"{name}: the broken variant is only {z:.1f} SE from the exact gradient; the test lacks power"


def test_vimco_is_unbiased_for_the_k_sample_bound_gradient():
    good = learner("vimco", layers=(3, 2), num_samples=3)
    assert worst_z(good, exact_bound_gradient(good, 3)) < PASS_Z
    broken = learner("vimco", layers=(3, 2), cls=SelfBaselineVIMCO, num_samples=3)
    assert worst_z(broken, exact_bound_gradient(broken, 3)) > FAIL_Z


def test_gumbel_straight_through_bias_is_detected():
    lrn = learner("gumbel_st")
    z = worst_z(lrn, exact_elbo_gradient(lrn))
    assert z > FAIL_Z, f"Gumbel-ST's mean gradient is within {z:.1f} SE of the exact one: its bias went unseen"


def parameter_space_variance(lrn, x: torch.Tensor) -> tuple[torch.Tensor, dict, dict]:
    """REBAR / RELAX's variance term by its definition, on the uniforms ``lrn.estimate`` draws next: with
    ``cv_objective=parameters`` the sum over every inference parameter of g_phi^2, g_phi of RELAX Eq. 5 taken by
    autograd with respect to the weights (create_graph); with ``logits`` the mean square of the same estimate taken
    with respect to each layer's logits. Returns (variance, the gradient of variance + weight decay in the control
    variate's parameters, g_phi)."""
    inf, n = lrn.inference, x.shape[0]
    sizes = [enc.out_features for enc in inf.encoders]
    us = [lrn.open_rand((n, k), x) for k in sizes]
    vs = [lrn.open_rand((n, k), x) for k in sizes] if lrn.noise == "independent" else []
    alphas, bs, below = [], [], x
    for i, u in enumerate(us):
        alphas.append(inf.layer_logits(i, below))
        below = (alphas[-1].detach() + torch.logit(u) > 0).to(x.dtype)
        bs.append(below)
        if lrn.noise == "common":  # z~ at z: the conditional uniform of z's own u
            vs.append(conditional_uniform(u, below, alphas[-1].detach()))
    log_q = [bernoulli_log_prob(a, b) for a, b in zip(alphas, bs)]
    f = (lrn.model.log_joint(x, bs) - sum(log_q)).detach()
    var, g_phi = 0.0, {}
    for i, (alpha, b, u, v) in enumerate(zip(alphas, bs, us, vs)):
        logits = [a.detach() for a in alphas[:i]] + [inf.layer_logits(i, x if i == 0 else bs[i - 1])]
        c_z = lrn.c(x, bs[:i], logits, alpha + torch.logit(u), us[i + 1:])
        c_zt = lrn.c(x, bs[:i], logits, conditional_logistic(alpha, b, v), us[i + 1:])
        phi_i = dict(inf.encoders[i].named_parameters(prefix=f"inference.encoders.{i}"))
        g = torch.autograd.grad((log_q[i], (c_z - c_zt).mean()), list(phi_i.values()),
                                grad_outputs=((f - c_zt) / n, torch.ones((), dtype=x.dtype)), create_graph=True)
        g_phi.update(zip(phi_i, g))
        if lrn.objective == "logits":
            # layer i's logits enter as alpha (z, z~) and as the recomputed logits[-1] (log q inside f's relaxation)
            g_alpha = torch.autograd.grad((log_q[i], (c_z - c_zt).mean()), [alpha, logits[-1]], create_graph=True,
                                          grad_outputs=((f - c_zt) / n, torch.ones((), dtype=x.dtype)))
            var = var + (g_alpha[0] + g_alpha[1]).pow(2).mean()
        else:
            var = var + sum(t.pow(2).sum() for t in g)
    cv = dict(lrn.control_variate.named_parameters())
    decay = sum(p.pow(2).sum() for k, p in cv.items() if k.startswith("net"))
    return var, dict(zip(cv, torch.autograd.grad(var + 0.5 * lrn.weight_decay * decay, list(cv.values())))), g_phi


@pytest.mark.parametrize("name, overrides", [("rebar", {}), ("relax", {}), ("rebar", dict(cv_objective="logits")),
                                             ("relax", AUTHORS)], ids=["rebar", "relax", "rebar_logits", "relax_authors"])
def test_control_variate_gradient_matches_the_parameter_space_form(name, overrides):
    """``estimate`` forms g_phi per example in logit space and the variance sum(g_phi^2) as a Gram form (or, the
    authors' objective, the mean square per logit); both must equal the definition (autograd with respect to the
    weights or the logits), in float64, with the same uniforms, weight decay on r_rho included."""
    lrn = perturbed(learner(name, **overrides))
    for m in (lrn.model, lrn.inference, lrn.control_variate):
        m.double()
    x = X.double().repeat(3, 1)
    state = lrn.generator.get_state()
    ascent, cv_grads, metrics = lrn.estimate(x, tune=True)
    lrn.generator.set_state(state)
    var, want, g_phi = parameter_space_variance(lrn, x)
    assert torch.allclose(metrics["rebar/grad_square"], var.detach(), rtol=1e-10)
    assert set(cv_grads) == set(want) and all(want[k].abs().max() > 1e-5 for k in ("eta", "log_temperature"))
    for k, g in want.items():
        assert torch.allclose(cv_grads[k], g, rtol=1e-9, atol=1e-12), k
    for k, g in g_phi.items():
        assert torch.allclose(ascent[k], g.detach(), rtol=1e-9, atol=1e-12), k


# ---- in the loop: resume, diagnostics, errors ---------------------------------------------------------------------
NAMES = ["vimco", "rloo", "arm", "disarm", "rebar", "relax", "gumbel_st"]


@pytest.mark.parametrize("name", NAMES)
def test_learner_resumes_exactly_and_logs_gradient_diagnostics(tmp_path, synthetic_overrides, name):
    from nvil.core.checkpoint import load_checkpoint
    from nvil.app.main import train

    base = synthetic_overrides + [f"learner={name}", "trainer.grad_diag_every=5", "trainer.grad_diag_repeats=4",
                                  "trainer.grad_diag_examples=8", "trainer.val_every=10", "trainer.ckpt_every=10"]
    train(make_cfg("train", base + ["trainer.max_steps=20"]), tmp_path / "straight")
    train(make_cfg("train", base + ["trainer.max_steps=10"]), tmp_path / "resumed")
    train(make_cfg("train", base + ["trainer.max_steps=20", "trainer.resume=true"]), tmp_path / "resumed")
    a, b = (load_checkpoint(tmp_path / run / "checkpoints/last.pt") for run in ("straight", "resumed"))
    for part in ("model", "inference"):
        for k, v in a[part].items():
            assert torch.equal(v, b[part][k]), f"{part}.{k}"
    rows = [json.loads(line) for line in (tmp_path / "straight/metrics.jsonl").read_text().splitlines()]
    diag = [r for r in rows if "grad/snr" in r]
    assert [r["step"] for r in diag] == [5, 10, 15, 20]
    assert all(r["grad/inference_variance"] > 0 and math.isfinite(r["grad/snr"]) for r in diag)


def test_disarm_variance_is_no_more_than_arms():
    """DisARM is ARM with part of its noise integrated out (Dong et al. 2020, Sec. 3): at the same parameters its
    inference-gradient variance, as the diagnostics measure it, is below ARM's."""
    x = X.repeat(8, 1)
    arm = learner("arm").gradient_diagnostics(x, 200, seed=0)
    disarm = learner("disarm").gradient_diagnostics(x, 200, seed=0)
    assert disarm["grad/inference_variance"] < arm["grad/inference_variance"]
    assert disarm["grad/snr"] > arm["grad/snr"]


def test_diagnostics_leave_the_training_stream_alone():
    a, b = learner("rloo"), learner("rloo")
    a.gradient_diagnostics(X, 3, seed=1)
    assert torch.equal(a.generator.get_state(), b.generator.get_state())


@pytest.mark.parametrize("override, message", [
    (["learner=vimco", "learner.num_samples=1"], "learner.num_samples must be at least 2"),
    (["learner=disarm", "model.inference.autoregressive=true"], "needs factorial Bernoulli inference layers"),
    (["learner=gumbel_st", "learner.temperature=0"], "learner.temperature"),
    (["learner=rebar", "learner.temperature=-1"], "learner.temperature"),
    (["learner=relax", "learner.cv_hidden=0"], "learner.cv_hidden"),
    (["learner=relax", "learner.cv_inputs=z"], "learner.cv_inputs must be one of"),
    (["learner=rebar", "learner.cv_objective=variance"], "learner.cv_objective must be one of"),
    (["learner=relax", "learner.cv_weight_decay=-1"], "learner.cv_weight_decay"),
    (["learner=rebar", "learner.beta2=1.5"], "learner.beta2 must be in"),
    (["learner=rebar", "learner.cv_noise=shared"], "learner.cv_noise must be one of"),
    (["trainer.grad_diag_repeats=1"], "trainer.grad_diag_repeats must be at least 2"),
])
def test_bad_settings_are_one_line_errors(tmp_path, synthetic_overrides, override, message):
    from nvil.core.errors import ConfigError
    from nvil.app.main import train

    with pytest.raises(ConfigError, match=message):
        train(make_cfg("train", synthetic_overrides + ["trainer.max_steps=5"] + override), tmp_path)


def ratio_form(alpha, b, v):
    """REBAR's Appendix as written (the form used before update 68,300 of RELAX's protocol went NaN)."""
    on = torch.log1p(v / ((1 - v) * torch.sigmoid(-alpha).clamp_min(1e-30)))
    off = -torch.log1p((1 - v) / (v * torch.sigmoid(alpha).clamp_min(1e-30)))
    return torch.where(b > 0, on, off)


def test_conditional_logistic_matches_rebar_s_form_and_stays_finite_in_the_tails():
    """z~ = the ratio form where that is finite (float64), on the side of 0 that b says (z~ > 0 iff b = 1); in float32
    with alpha = +-40 and v at the open-uniform clamp, z~ and its first and second alpha-derivatives (the control
    variate's variance objective differentiates twice) are finite, where the ratio form's are NaN (the broken
    variant)."""
    g = torch.Generator().manual_seed(0)
    alpha = 6 * torch.randn(4000, generator=g, dtype=torch.float64)
    v = torch.rand(4000, generator=g, dtype=torch.float64).clamp(1e-3, 1 - 1e-3)
    b = (torch.rand(4000, generator=g, dtype=torch.float64) < 0.5).double()
    z = conditional_logistic(alpha, b, v)
    torch.testing.assert_close(z, ratio_form(alpha, b, v), rtol=1e-10, atol=1e-10)
    assert torch.equal(z > 0, b > 0)
    tails = torch.tensor([-40.0, 40.0, -40.0, 40.0], requires_grad=True)
    v32, b32 = torch.tensor([1e-6, 1e-6, 1 - 1e-6, 1 - 1e-6]), torch.tensor([1.0, 0.0, 1.0, 0.0])
    for form, finite in ((conditional_logistic, True), (ratio_form, False)):
        out = form(tails, b32, v32)
        (grad,) = torch.autograd.grad(out.sum(), tails, create_graph=True)
        (second,) = torch.autograd.grad((grad * grad).sum(), tails)
        assert bool(torch.isfinite(out).all() and torch.isfinite(grad).all()
                    and torch.isfinite(second).all()) == finite, form.__name__


def test_common_noise_puts_z_tilde_at_z():
    """cv_noise=common: the conditional uniform of z's own u gives z~ = z in value (float64), on both sides of 0."""
    g = torch.Generator().manual_seed(2)
    alpha = 4 * torch.randn(5000, generator=g, dtype=torch.float64)
    u = torch.rand(5000, generator=g, dtype=torch.float64).clamp(1e-4, 1 - 1e-4)
    z = alpha + torch.logit(u)
    b = (z > 0).double()
    torch.testing.assert_close(conditional_logistic(alpha, b, conditional_uniform(u, b, alpha)), z, rtol=1e-8,
                               atol=1e-8)


def test_r_rho_on_parts_is_the_net_on_the_concatenated_parts():
    """RELAX's r_rho on (x - mean, z, 2 b - 1) with z and z~ stacked: the first layer applied block by block (x and b
    once per example) gives the net on the concatenation, value and gradients (float64); the blocks given to the
    wrong parts (x's columns to z, z's to x) do not."""
    torch.manual_seed(0)
    net = mlp(4 + 4 + 3, 6, 2, "relu").double()
    with torch.no_grad():
        net[-1].weight.normal_()
    x, b = torch.randn(5, 4, dtype=torch.float64), (torch.rand(5, 3) < 0.5).double()
    z = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    params = [z, *net.parameters()]

    def value_and_grads(out):
        return [out, *torch.autograd.grad(out.pow(2).sum(), params)]

    reference = value_and_grads(net(_cat_broadcast([x, z, 2 * b - 1])))
    for got, want in zip(value_and_grads(on_parts(net, [x, z, 2 * b - 1])), reference):
        torch.testing.assert_close(got, want)
    assert not torch.allclose(on_parts(net, [z, x, 2 * b - 1]), reference[0])



@pytest.mark.slow
def test_the_bench_scores_a_finished_run_without_training_it_again(tmp_path):
    """bench/discrete_estimators.py: a run stopped while it was being scored (its last checkpoint at the row's steps)
    is scored by the same command again, not refused as a resume past its end; with more steps it trains on."""
    import argparse
    import sys
    from dataclasses import replace
    from pathlib import Path

    bench = str(Path(__file__).resolve().parents[1] / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import discrete_estimators as de

    args = de.parse_args(["--estimators", "nvil", "--seeds", "0", "--steps", "4", "--test-examples", "5", "--iwae-k",
                          "3", "--ais-examples", "1", "--ais-betas", "3", "--train-examples", "5", "--device", "cpu",
                          "--out", str(tmp_path), "--extra-override", "data.num_train=100",
                          "--extra-override", "trainer.val_num_examples=10"])
    first = de.run_one("nvil", "sbn200", 0, args)
    ckpt = tmp_path / "sbn200" / "updates" / "nvil_s0" / "checkpoints" / "last.pt"
    scores = ckpt.parents[1] / "scores.jsonl"
    stamp, scored = ckpt.stat().st_mtime_ns, len(scores.read_text().splitlines())
    assert scored == 4  # test ELBO(10), IWAE(3), AIS, train ELBO
    again = de.run_one("nvil", "sbn200", 0, args)
    assert ckpt.stat().st_mtime_ns == stamp and again["steps"] == first["steps"] == 4
    # ... and its scores are read back from the evaluator's records, not computed again
    assert len(scores.read_text().splitlines()) == scored
    for key in ("elbo", "iwae", "ais", "train_elbo"):
        assert (again[key].mean, again[key].stderr) == pytest.approx((first[key].mean, first[key].stderr), abs=1e-4)
    assert again["ais"].certified == first["ais"].certified
    # a different setting, or --rescore, computes anew (the reuse is not blind to the settings)
    de.run_one("nvil", "sbn200", 0, argparse.Namespace(**{**vars(args), "iwae_k": 4}))
    assert len(scores.read_text().splitlines()) == scored + 1
    de.run_one("nvil", "sbn200", 0, argparse.Namespace(**{**vars(args), "rescore": True}))
    assert len(scores.read_text().splitlines()) == scored + 5
    longer = de.run_one("nvil", "sbn200", 0, argparse.Namespace(**{**vars(args), "steps": 6}))
    assert longer["steps"] == 6 and ckpt.stat().st_mtime_ns != stamp
    assert len(scores.read_text().splitlines()) == scored + 9  # a new step: every score computed
    # a record of 5 test images is not the whole test set's
    spec = de.EvalSpec(split="test", num_examples=5, seed=0, output=str(scores))
    assert de.scored_before(ckpt, 6, "elbo", {"num_samples": 10}, spec) is not None
    assert de.scored_before(ckpt, 6, "elbo", {"num_samples": 10}, replace(spec, num_examples=None)) is None


def test_the_bench_pairs_estimators_by_seed():
    """bench/discrete_estimators.py's paired table: differences from the best estimator taken seed by seed (by hand:
    d = 1, 1.5, 0.5 -> mean 1.0, SE sqrt(0.25 / 3)), over the seeds both ran only; pairing removes a shift the seeds
    share, which the unpaired SEs of the two means do not."""
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    bench = str(Path(__file__).resolve().parents[1] / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import common
    import discrete_estimators as de

    ours = {"a": {0: 110.0, 1: 112.0, 2: 111.0}, "b": {0: 111.0, 1: 113.5, 2: 111.5, 3: 99.0}, "c": {7: 1.0}}
    diffs = common.paired_differences(ours, "a")
    assert set(diffs) == {"b"}  # c shares no seed with a; a is the reference
    assert diffs["b"] == pytest.approx((1.0, (0.25 / 3) ** 0.5, 3))
    unpaired = (common.mean_se(list(ours["a"].values()))[1] ** 2 + common.mean_se([111.0, 113.5, 111.5])[1] ** 2) ** 0.5
    assert diffs["b"][1] < unpaired / 2
    assert common.mean_se([3.0], own_se=0.4) == (3.0, 0.4)

    def run(seed, train, iwae):
        return {"seed": seed, "train_elbo": SimpleNamespace(mean=-train), "iwae": SimpleNamespace(mean=-iwae)}

    results = {("sbn200", "arm"): [run(0, 118.0, 109.0), run(1, 117.5, 108.5)],
               ("sbn200", "disarm"): [run(0, 116.5, 108.4), run(1, 116.7, 108.6)],
               ("sbn200x3", "vimco"): [run(0, 99.0, 92.0)]}
    rows = de.paired_rows(results)  # by hand: train d = 1.5, 0.8; IWAE d = 0.6, -0.1; SE = |d0 - d1| / 2
    assert rows == [["sbn200", "arm - disarm", "2", "+1.15 ± 0.35", "+0.25 ± 0.35"]]


@pytest.mark.slow
def test_the_bench_prints_its_tables_again_from_records(tmp_path, monkeypatch, capsys):
    """bench/discrete_estimators.py ``--rows``: every scored run is recorded in <out>/rows.jsonl, and the same command
    with ``--rows`` prints the same figures from those records without training or scoring; a run named but not
    recorded, or recorded under other settings only, is said, and a file that is not a record is one error line."""
    import sys
    from pathlib import Path

    bench = str(Path(__file__).resolve().parents[1] / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import discrete_estimators as de

    argv = ["--estimators", "nvil", "--seeds", "0", "--steps", "4", "--test-examples", "5", "--iwae-k", "3",
            "--ais-examples", "1", "--ais-betas", "3", "--train-examples", "5", "--device", "cpu",
            "--extra-override", "data.num_train=100", "--extra-override", "trainer.val_num_examples=10",
            "--plot", str(tmp_path / "curves.png")]
    de.main([*argv, "--out", str(tmp_path / "trained")])
    rows = tmp_path / "trained" / "rows.jsonl"
    assert len(rows.read_text().splitlines()) == 1
    trained = json.loads((tmp_path / "trained" / "results.json").read_text())

    def no_training(*a, **k):
        raise AssertionError("--rows must not train or score")

    monkeypatch.setattr(de, "run_one", no_training)
    capsys.readouterr()
    de.main([*argv, "--out", str(tmp_path / "again"), "--seeds", "0,1", "--rows", str(rows)])
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    assert again == trained and set(trained) == {"sbn200/nvil"}
    out = capsys.readouterr()
    assert "not in --rows: sbn200 nvil seed 1: no record" in out.err
    assert "training s (recorded)" in out.out
    # other settings (here IWAE's K) do not mix into the table
    with pytest.raises(SystemExit, match="no record of the named runs"):
        de.main([*argv, "--iwae-k", "4", "--out", str(tmp_path / "again"), "--rows", str(rows)])
    assert "recorded under other settings only" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"model": "sbn200"}\n')
    with pytest.raises(SystemExit, match=r"^error: --rows: .*bad.jsonl line 1 is not a record"):
        de.main([*argv, "--rows", str(bad)])
    with pytest.raises(SystemExit, match=r"^error: --rows: .*missing.jsonl does not exist"):
        de.main([*argv, "--rows", str(tmp_path / "missing.jsonl")])
