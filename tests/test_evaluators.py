"""The marginal-likelihood evaluators against exact answers on models small enough to enumerate.

- forward / reverse AIS for an RBM's log Z, and Chib, AIS over the posterior and importance sampling for an
  SBN and a DBN, agree with enumeration within 3 standard errors (taken from independent runs);
- the biases go the way the theory says: forward AIS under, reverse AIS over, Chib under (in log), the
  harmonic mean over;
- Chib's exp(estimate) is unbiased, and a check with power: the exact sequential-Gibbs transition matrix
  (normalised, invariant, reversed by T~) and a wrong variant of Fig. 1 that the same statistic rejects;
- the BinaryDensity views of the joint and of Q equal log_joint / log_prob;
- evaluate.py: one-line errors for estimators that do not fit a checkpoint, and a DBN run end to end
  (log Z cache, sharding + nvil.app.merge).

Expected values come from enumeration written here (not from the estimators); tolerances from standard
errors over independent runs with fixed seeds.
"""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import CHI2_999, SYNTHETIC, chi_square, run_script
from nvil.estimators.ais_rbm import base_rate, rbm_log_z, rbm_log_z_reverse
from nvil.estimators.annealing import schedule
from nvil.estimators.bounds import importance_sampled_bound
from nvil.estimators.chib import Chib
from nvil.estimators.exact import enumerate_states, exact_log_marginal, split_layers
from nvil.estimators.harmonic import Harmonic
from nvil.estimators.ais_posterior import AISPosterior
from nvil.estimators.latent_model import LatentModel
from nvil.models.dbn import DBN
from nvil.models.inference import LayeredInference
from nvil.models.rbm import BoltzmannMachine
from nvil.models.sbn import SBN
from nvil.mcmc.sequential_gibbs import SequentialGibbs

# float32 evaluation of log P* (sums of ~10-20 terms of magnitude up to ~50) by two code paths (BinaryDensity
# vs log_joint), or of AIS steps, rounds at the 1e-5..1e-4 level; where an estimator is nearly exact (a sharp
# posterior gives Chib a run spread of ~0) the 3-SE band gets this floor so rounding alone cannot fail it.
ROUNDING = 1e-3


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def randomise(*modules, scale=1.0, seed=0):
    torch.manual_seed(seed)
    for m in modules:
        for p in m.parameters():
            p.normal_(0.0, scale)


# ---- exact references ---------------------------------------------------------------------------------


def rbm_exact(rbm: BoltzmannMachine):
    """(log Z, all visible states, their log probabilities) by enumerating v, h summed analytically, float64."""
    V = enumerate_states(rbm.n_pixels, 0, 2**rbm.n_pixels, dtype=torch.float64)
    W, b, c = rbm.W.double(), rbm.b.double(), rbm.c.double()
    log_f = V @ b + F.softplus(c + V @ W).sum(-1)  # -F(v), energy -v'b - h'c - v'Wh
    log_z = torch.logsumexp(log_f, 0).item()
    return log_z, V, log_f - log_z


def exact_log_sum(model, x: torch.Tensor) -> torch.Tensor:
    """log sum_h exp(model.log_joint(x, h)) per row of x, float64, by enumerating h (log P* for a DBN)."""
    h = enumerate_states(model.n_latent, 0, 2**model.n_latent, dtype=torch.float64)
    hs = [t.unsqueeze(1) for t in split_layers(h, model.layers)]
    return torch.logsumexp(_double(model).log_joint(x.double().unsqueeze(0), hs), 0)


def _double(model):
    return copy.deepcopy(model).double()


def ratio_stats(log_est: torch.Tensor, exact: torch.Tensor):
    """log_est [examples, runs] of log P; r = exp(log_est - exact) (unbiased estimators: E r = 1).
    Returns (mean r, its standard error) per example."""
    r = torch.exp(log_est.double() - exact.double()[:, None])
    return r.mean(1), r.std(1) / math.sqrt(r.shape[1])


# ---- models ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rbm12():
    rbm = BoltzmannMachine(12, 8)
    torch.manual_seed(0)
    with torch.no_grad():
        rbm.W.normal_(0, 1)
        rbm.b.normal_(0, 0.5)
        rbm.c.normal_(0, 0.5)
    log_z, V, log_p = rbm_exact(rbm)
    g = torch.Generator().manual_seed(11)
    samples = V[torch.multinomial(log_p.exp(), 4000, replacement=True, generator=g)].float()
    return rbm, log_z, samples


def sbn_model(seed=0, q_scale=1.0):
    m, q = SBN(10, [4, 3]), LayeredInference(10, [4, 3])
    randomise(m, seed=seed)
    randomise(q, seed=seed + 100, scale=q_scale)
    return m, q


def dbn_model(seed=0, sizes=(6, 5)):
    m = DBN(10, list(sizes))
    randomise(m, seed=seed)
    return m


def test_rbm_reference_matches_log_z_exact(rbm12):
    rbm, log_z, _ = rbm12
    assert abs(rbm.log_z_exact().item() - log_z) < 1e-3


# ---- 1. agreement with exact ----------------------------------------------------------------------------


def test_forward_and_reverse_ais_log_z_agree_with_enumeration(rbm12):
    rbm, log_z, samples = rbm12
    base = base_rate(rbm, samples)
    betas = schedule("paper", 500)
    g = torch.Generator().manual_seed(1)
    runs = 8
    fwd = [rbm_log_z(rbm, base, 100, betas, g) for _ in range(runs)]
    rev = [rbm_log_z_reverse(rbm, base, samples[torch.randint(0, samples.shape[0], (100,), generator=g)], betas, g)
           for _ in range(runs)]
    for name, ests in (("forward", fwd), ("reverse", rev)):
        values = torch.tensor([e.log_z for e in ests], dtype=torch.float64)
        se = values.std().item() / math.sqrt(runs)
        assert se < 0.05, (name, se)  # the check has power: an error of ~0.1 nats would fail it
        assert abs(values.mean().item() - log_z) < 3 * max(se, ROUNDING), (name, values.mean().item(), log_z, se)
        # each run's own (delta-method) standard error is of the size of the spread between runs
        own = torch.tensor([e.stderr for e in ests]).mean().item()
        assert 0.3 < own / values.std().item() < 3.0, (name, own, values.std().item())
        for e in ests:
            assert e.direction == name and e.num_chains == 100 and e.num_betas == 500
            assert abs(e.log_z - log_z) < 5 * e.stderr + ROUNDING


@pytest.fixture(scope="module")
def data10():
    torch.manual_seed(5)
    return (torch.rand(5, 10) < 0.5).float()


def per_run(est, lm, x, seed=0):
    g = torch.Generator().manual_seed(seed)
    return est.run_batch(lm, x.repeat_interleave(est.num_runs, 0), g).double().view(x.shape[0], est.num_runs)


@pytest.mark.parametrize("kind", ["sbn", "dbn"])
def test_per_example_estimators_agree_with_enumeration(kind, data10):
    # q_scale 0.3: a Q close to uniform over the 2^7 states covers the posterior, so importance sampling
    # converges at K = 2000 (Chib and AIS start from Q too and do not need it)
    model, q = sbn_model(seed=1, q_scale=0.3) if kind == "sbn" else (dbn_model(seed=2), None)
    x = data10
    exact = exact_log_sum(model, x)  # log P(v) for the SBN, log sum_h P*(v, h) for the DBN
    lm = LatentModel(model, q, "test")
    estimates = {
        "chib": per_run(Chib(num_steps=10, num_runs=200, accel="none"), lm, x),
        "ais_posterior": per_run(AISPosterior(num_betas=50, num_runs=300, accel="none"), lm, x),
    }
    runs, k = 40, 2000
    g = torch.Generator().manual_seed(3)
    if kind == "sbn":
        is_runs = [importance_sampled_bound(model, q, x, k, generator=g) for _ in range(runs)]
    else:
        rec = model.recognition()
        is_runs = []
        for _ in range(runs):
            xk = x.unsqueeze(0).expand(k, *x.shape)
            hs, _ = rec.sample(xk, generator=g)
            log_w = model.log_joint(xk, hs) - rec.log_prob(hs, xk)
            is_runs.append(torch.logsumexp(log_w.double(), 0) - math.log(k))
    estimates["importance"] = torch.stack(is_runs, 1).double()
    for name, est in estimates.items():
        mean_r, se = ratio_stats(est, exact)
        assert (se < 0.05).all(), (name, se)
        assert ((mean_r - 1).abs() < 3 * se + ROUNDING).all(), (name, mean_r, se)


# ---- 2. bias directions ---------------------------------------------------------------------------------


def test_short_ais_forward_under_and_reverse_over_estimates_log_z():
    # Stronger weights than rbm12 and a near-uniform base model, 20 betas, 2 chains a run: each run's log Z is
    # off by Jensen's gap, forward AIS below and reverse AIS from exact samples above, by several SE of the mean.
    rbm = BoltzmannMachine(12, 8)
    torch.manual_seed(0)
    rbm.W.normal_(0, 1.5)
    rbm.b.normal_(0, 0.5)
    rbm.c.normal_(0, 0.5)
    log_z, V, log_p = rbm_exact(rbm)
    g = torch.Generator().manual_seed(2)
    samples = V[torch.multinomial(log_p.exp(), 4000, replacement=True, generator=g)].float()
    base = base_rate(rbm, torch.full((1, 12), 0.5))
    betas = schedule("linear", 20)
    runs, chains = 150, 2
    fwd = torch.tensor([rbm_log_z(rbm, base, chains, betas, g).log_z for _ in range(runs)], dtype=torch.float64)
    rev = torch.tensor([rbm_log_z_reverse(rbm, base, samples[torch.randint(0, samples.shape[0], (chains,), generator=g)],
                                          betas, g).log_z for _ in range(runs)], dtype=torch.float64)
    se_f, se_r = fwd.std().item() / math.sqrt(runs), rev.std().item() / math.sqrt(runs)
    assert fwd.mean().item() < log_z - 2 * se_f, (fwd.mean().item(), log_z, se_f)
    assert rev.mean().item() > log_z + 2 * se_r, (rev.mean().item(), log_z, se_r)


def test_base_rate_stays_finite_for_pixels_always_on_or_off(rbm12):
    # (p = (mean + s) / (1 + s) once gave b = +inf for an always-on pixel, and AIS a log Z of nan)
    rbm, log_z, samples = rbm12
    train = samples.clone()
    train[:, 0], train[:, 1] = 1.0, 0.0
    base = base_rate(rbm, train)
    assert torch.isfinite(base.b).all(), base.b
    assert base.b[0] > 2 and base.b[1] < -2  # still near the data: p close to 1 and to 0
    est = rbm_log_z(rbm, base, 100, schedule("paper", 1000), torch.Generator().manual_seed(0))
    assert math.isfinite(est.log_z) and abs(est.log_z - log_z) < 5 * est.stderr + ROUNDING


@pytest.mark.parametrize("kind", ["sbn", "dbn"])
def test_chib_log_estimate_is_not_above_exact(kind, data10):
    model, q = sbn_model(seed=4) if kind == "sbn" else (dbn_model(seed=4), None)
    exact = exact_log_sum(model, data10)
    est = per_run(Chib(num_steps=2, num_runs=500, hill_climb=False, accel="none"),
                  LatentModel(model, q, "chib"), data10)
    mean, se = est.mean(1), est.std(1) / math.sqrt(est.shape[1])
    assert (mean <= exact + 3 * se + ROUNDING).all(), (mean - exact, se)


def test_harmonic_mean_over_estimates_on_a_broad_prior_and_sharp_likelihood():
    # 8 latent units under a uniform prior, 20 visibles with large weights: P(h | v) sits on a few states,
    # the chain never visits the 2^8 states whose 1 / P(v | h) carry the sum, and the estimate comes out
    # near P(v | h_mode) instead of 2^-8 sum_h P(v | h), several nats too high.
    model, q = SBN(20, [8]), LayeredInference(20, [8])
    randomise(model, seed=6, scale=3.0)
    randomise(q, seed=7, scale=0.3)
    with torch.no_grad():
        model.prior_logits.zero_()
    x, _ = model.sample(4, generator=torch.Generator().manual_seed(8))
    exact = exact_log_marginal(model, x).double()
    assert torch.allclose(exact, exact_log_sum(model, x), atol=1e-3)
    h = Harmonic(num_samples=50, burn_in=5, num_runs=20, accel="none")
    est = per_run(h, LatentModel(model, q, "harmonic"), x)
    mean, se = est.mean(1), est.std(1) / math.sqrt(est.shape[1])
    assert (mean > exact + 5 * se + 0.5).all(), (mean - exact, se)
    assert (h.combine(est) > exact + 0.5).all()


# ---- 3. Chib is unbiased --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sbn", "dbn"])
def test_chib_exp_estimate_is_unbiased(kind, data10):
    model, q = sbn_model(seed=9) if kind == "sbn" else (dbn_model(seed=9), None)
    x = data10[:3]
    exact = exact_log_sum(model, x)
    est = per_run(Chib(num_steps=5, num_runs=4000, accel="none"), LatentModel(model, q, "chib"), x, seed=3)
    mean_r, se = ratio_stats(est, exact)
    assert (se < 0.02).all(), se
    assert ((mean_r - 1).abs() < 3 * se + ROUNDING).all(), (mean_r, se)


# ---- 4. power: the transition operator and a wrong variant of Fig. 1 ------------------------------------


def fig1(gibbs: SequentialGibbs, h_star, num_steps, generator, first_reverse=True):
    """Murray & Salakhutdinov's Fig. 1 written chain by chain from the sweep primitive: log P*(h*) - log p_hat.
    ``first_reverse=False`` draws h^(s) from T(. <- h*) instead of T~(. <- h*): a wrong estimator."""
    n, S = h_star.shape[0], num_steps
    s = torch.randint(0, S, (n,), generator=generator)
    h_s, _ = gibbs.sweep(h_star, reverse=first_reverse, generator=generator)
    log_t = torch.full((n, S), float("nan"), dtype=torch.float64)
    idx = torch.arange(n)
    log_t[idx, s] = gibbs.sweep(h_s, force=h_star)[1].double()
    fwd, bwd = h_s.clone(), h_s.clone()
    for k in range(1, S):
        fwd, _ = gibbs.sweep(fwd, generator=generator)  # h^(s + k)
        bwd, _ = gibbs.sweep(bwd, reverse=True, generator=generator)  # h^(s - k)
        for pos, h in ((s + k, fwd), (s - k, bwd)):
            ok = (pos >= 0) & (pos < S)
            log_t[idx[ok], pos[ok]] = gibbs.sweep(h, force=h_star)[1].double()[ok]
    assert not log_t.isnan().any()
    return gibbs.log_prob(h_star).double() - (torch.logsumexp(log_t, 1) - math.log(S))


def test_wrong_first_step_is_detected_by_the_unbiasedness_statistic(data10):
    model, q = sbn_model(seed=9)
    x = data10[:3]
    exact = exact_log_sum(model, x)
    lm = LatentModel(model, q, "chib")
    runs = 4000
    xr = x.repeat_interleave(runs, 0)
    gibbs = SequentialGibbs([(1.0, lm.joint(xr))])
    h_star, _ = gibbs.hill_climb(lm.sample_q(xr, torch.Generator().manual_seed(0)))
    results = {}
    for first_reverse in (True, False):
        est = fig1(gibbs, h_star, 5, torch.Generator().manual_seed(1), first_reverse).view(3, runs)
        results[first_reverse] = ratio_stats(est, exact)
    mean_r, se = results[True]  # the reference implementation passes the statistic ...
    assert ((mean_r - 1).abs() < 3 * se + ROUNDING).all(), (mean_r, se)
    mean_r, se = results[False]  # ... and the wrong one fails it
    assert ((mean_r - 1).abs() > 5 * se).any(), (mean_r, se)


def transition_matrices(model, x):
    """T[a, b] = T(h_a <- h_b) of a forward sweep and Tr of a reverse one, by forced sweeps; log P(h | v)."""
    n = model.n_latent
    H = enumerate_states(n, 0, 2**n)
    N = H.shape[0]
    gibbs = SequentialGibbs([(1.0, model.latent_density(x.expand(N * N, -1)))])
    to = H.repeat_interleave(N, 0)  # row a * N + b: to h_a, from h_b
    frm = H.repeat(N, 1)
    T = gibbs.sweep(frm, force=to)[1].double().exp().view(N, N)
    Tr = gibbs.sweep(frm, force=to, reverse=True)[1].double().exp().view(N, N)
    log_p = exact_log_sum_states(model, x, H)
    return T, Tr, log_p, H


def exact_log_sum_states(model, x, H):
    lj = _double(model).log_joint(x.double(), split_layers(H.double(), model.layers))
    return lj - torch.logsumexp(lj, 0)


@pytest.mark.parametrize("kind", ["sbn", "dbn"])
def test_sweep_transition_matrix_is_normalised_invariant_and_reversed_by_reverse_sweep(kind, data10):
    model = sbn_model(seed=12)[0] if kind == "sbn" else dbn_model(seed=12)
    x = data10[:1]
    T, Tr, log_p, H = transition_matrices(model, x)
    p = log_p.exp()
    ones = torch.ones(T.shape[0], dtype=torch.float64)
    assert torch.allclose(T.sum(0), ones, atol=1e-5) and torch.allclose(Tr.sum(0), ones, atol=1e-5)
    assert torch.allclose(T @ p, p, atol=1e-6, rtol=1e-4)  # sum_b T(a <- b) P(b) = P(a)
    assert torch.allclose(Tr @ p, p, atol=1e-6, rtol=1e-4)
    # T~(b <- a) = T(a <- b) P(b) / P(a)
    assert torch.allclose(Tr.T, T * p[None, :] / p[:, None], atol=1e-6, rtol=1e-3)
    assert not torch.allclose(T, Tr, atol=1e-3)  # the two orders differ, so the relation above has content


def test_sampled_sweep_follows_the_forced_sweep_probabilities(data10):
    # 6 latent units, modest weights: every T(. <- h0) entry is large enough for a Pearson test.
    model = SBN(10, [4, 2])
    randomise(model, seed=13, scale=0.5)
    x = data10[:1]
    T, Tr, _, H = transition_matrices(model, x)
    n = 40000
    gibbs = SequentialGibbs([(1.0, model.latent_density(x.expand(n, -1)))])
    start = H[37].expand(n, -1)
    g = torch.Generator().manual_seed(14)
    for reverse, M in ((False, T), (True, Tr)):
        probs = M[:, 37]
        assert probs.min() * n > 5
        h, log_t = gibbs.sweep(start, reverse=reverse, generator=g)
        stat, dof = chi_square(h, probs.log())
        assert stat < CHI2_999[dof], (reverse, stat)
        # the sweep's own log T of the state it drew is the forced-sweep value
        codes = (h * 2 ** torch.arange(5, -1, -1)).sum(1).long()
        assert torch.allclose(log_t.double(), probs.log()[codes], atol=1e-4)


# ---- 5. the BinaryDensity views -------------------------------------------------------------------------


def sbn_cases():
    for prior in ("factorial", "autoregressive"):
        for layers in ([7], [3, 2, 2]):
            for ar_q in (False, True):
                yield pytest.param(prior, layers, ar_q, id=f"{prior}-{layers}-{'arq' if ar_q else 'q'}")


@pytest.mark.parametrize("prior, layers, ar_q", list(sbn_cases()))
def test_sbn_latent_densities_equal_log_joint_and_log_q(prior, layers, ar_q):
    model, q = SBN(9, layers, prior=prior), LayeredInference(9, layers, autoregressive=ar_q)
    randomise(model, q, seed=15)
    q.set_input_mean(torch.rand(9, generator=torch.Generator().manual_seed(16)))
    n = model.n_latent
    H = enumerate_states(n, 0, 2**n)
    x = (torch.rand(3, 9, generator=torch.Generator().manual_seed(17)) < 0.5).float()
    X, HH = x.repeat_interleave(H.shape[0], 0), H.repeat(3, 1)
    hs = split_layers(HH, model.layers)
    assert torch.allclose(model.latent_density(X).log_prob(HH), model.log_joint(X, hs), atol=1e-4)
    assert torch.allclose(q.latent_density(X).log_prob(HH), q.log_prob(hs, X), atol=1e-4)
    # Q is normalised: it sums to 1 over h for each x
    assert torch.allclose(q.log_prob(hs, X).view(3, -1).logsumexp(1), torch.zeros(3), atol=1e-4)


@pytest.mark.parametrize("sizes", [[6, 5], [4, 3, 5]], ids=["6-5", "4-3-5"])
def test_dbn_latent_densities_equal_log_joint_and_recognition(sizes):
    model = dbn_model(seed=18, sizes=sizes)
    rec = model.recognition()
    n = model.n_latent
    H = enumerate_states(n, 0, 2**n)
    x = (torch.rand(3, 10, generator=torch.Generator().manual_seed(19)) < 0.5).float()
    X, HH = x.repeat_interleave(H.shape[0], 0), H.repeat(3, 1)
    hs = split_layers(HH, model.layers)
    assert torch.allclose(model.latent_density(X).log_prob(HH), model.log_joint(X, hs), atol=1e-4)
    assert torch.allclose(rec.latent_density(X).log_prob(HH), rec.log_prob(hs, X), atol=1e-4)
    assert torch.allclose(rec.log_prob(hs, X).view(3, -1).logsumexp(1), torch.zeros(3), atol=1e-4)
    # log P* sums over h_1.. and the top layer to Z_top: sum_v sum_h P*(v, h) = Z of the top RBM
    V = enumerate_states(10, 0, 2**10)
    per_v = _double(model).log_joint(V.double()[:, None], [t[None] for t in split_layers(H.double(), model.layers)])
    assert abs(per_v.logsumexp(1).logsumexp(0).item() - model.top.log_z_exact().item()) < 1e-3


# ---- 6-7. evaluate.py ------------------------------------------------------------------------------------


run = run_script  # ``python SCRIPT *args`` (or ``-m nvil.app.merge``), in this process


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def assert_one_line_error(proc, *fragments):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    err = proc.stderr.strip()
    assert err.startswith("error:") and "\n" not in err, err
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in err, err


def base_overrides(*extra):
    return [o for o in SYNTHETIC if not o.startswith("model.layers")] + list(extra)


def test_cli_refuses_estimators_that_do_not_fit_the_checkpoint(tmp_path):
    rbm_dir, sbn_dir = tmp_path / "rbm", tmp_path / "sbn"
    train = run("train.py", *base_overrides("model=rbm", "model.n_hidden=4", "learner=cd", "trainer.max_steps=20",
                                            f"hydra.run.dir={rbm_dir}"))
    assert train.returncode == 0, train.stderr
    proc = run("evaluate.py", f"checkpoint={rbm_dir}/checkpoints/last.pt", "estimator=chib", "eval.progress=false",
               cwd=tmp_path)
    assert_one_line_error(proc, "estimator=chib", "ais")
    train = run("train.py", *SYNTHETIC, "trainer.max_steps=5", f"hydra.run.dir={sbn_dir}")
    assert train.returncode == 0, train.stderr
    proc = run("evaluate.py", f"checkpoint={sbn_dir}/checkpoints/last.pt", "estimator=ais", "eval.progress=false",
               cwd=tmp_path)
    assert_one_line_error(proc, "estimator=ais", "chib")


def test_cli_dbn_chib_log_z_cache_and_sharding(tmp_path):
    run_dir = tmp_path / "dbn"
    train = run("train.py", *base_overrides("model=dbn", "model.layers=[6,5]", "learner=greedy",
                                            "learner.layer_steps=50", "trainer.max_steps=100",
                                            f"hydra.run.dir={run_dir}"))
    assert train.returncode == 0, train.stderr
    ckpt = run_dir / "checkpoints/last.pt"
    log_z = ["estimator.log_z.num_betas=200", "estimator.log_z.num_chains=20"]
    chib = [f"checkpoint={ckpt}", "estimator=chib", "estimator.num_steps=5", "estimator.num_runs=2",
            "estimator.batch_size=10", *log_z, "eval.num_examples=20", "eval.progress=false", "seed=3"]
    proc = run("evaluate.py", *chib, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (line,) = json_lines(proc.stdout)
    assert set(line) >= {"mean_log_p", "stderr", "run_spread", "seconds", "seed"}
    assert line["estimator"] == "chib" and line["num_examples"] == 20 and line["seed"] == 3
    assert line["log_z_cached"] is False and math.isfinite(line["mean_log_p"]) and line["mean_log_p"] < 0
    cache = ckpt.parent / "last.pt.log_z.json"
    assert cache.exists()
    proc = run("evaluate.py", f"checkpoint={ckpt}", "estimator=dbn_bound", *log_z, "eval.num_examples=20",
               "eval.progress=false", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (bound,) = json_lines(proc.stdout)
    assert bound["log_z_cached"] is True and bound["log_z"] == line["log_z"]
    assert bound["mean_log_p"] <= line["mean_log_p"] + 3 * line["stderr"]  # a lower bound, same examples
    shards = tmp_path / "shards.jsonl"
    for shard in (0, 1):
        proc = run("evaluate.py", *chib, "eval.num_shards=2", f"eval.shard={shard}", f"eval.output={shards}",
                   cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    proc = run("-m nvil.app.merge", str(shards))
    assert proc.returncode == 0, proc.stderr
    (merged,) = json_lines(proc.stdout)
    assert merged["num_examples"] == 20 and merged["seed"] == 3
    assert abs(merged["mean_log_p"] - line["mean_log_p"]) < 1e-3
    assert abs(merged["stderr"] - line["stderr"]) < 1e-3
