"""The bridges of the peer benchmarks (bench/peers.py) against the peers' own code: Pyro's log densities of the
model and guide written over our SBN, and scikit-learn's BernoulliRBM parameters loaded into our RBM.

Pyro and scikit-learn are optional extras (``pip install -e '.[bench]'``); each test skips without its peer.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

BENCH = Path(__file__).resolve().parent.parent / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from nvil.models import build_model  # noqa: E402
from peers import PyroSBN, pyro_param_groups  # noqa: E402
from nvil.models.importers import rbm_from_sklearn  # noqa: E402


# ---- Pyro ------------------------------------------------------------------------------------------------

def random_sbn(layers=(5, 3), n_visible: int = 7, seed: int = 0):
    torch.manual_seed(seed)
    model, inference = build_model(OmegaConf.create({"name": "sbn", "layers": list(layers)}), n_visible)
    with torch.no_grad():
        for p in [*model.parameters(), *inference.parameters()]:
            p.normal_(0.0, 1.0)
        inference.set_input_mean(torch.rand(n_visible))
    return model, inference


def random_binary(*shape) -> torch.Tensor:
    return (torch.rand(*shape) < 0.5).float()


@pytest.mark.parametrize("layers", [(5,), (5, 3)])
def test_pyro_model_and_guide_give_our_log_joint_and_log_q(layers):
    pyro = pytest.importorskip("pyro")
    from pyro import poutine

    model, inference = random_sbn(layers)
    pm = PyroSBN(model, inference)
    x = random_binary(6, model.n_visible)
    hs = [random_binary(6, n) for n in layers]
    pyro.clear_param_store()
    with torch.no_grad():
        tr = poutine.trace(poutine.condition(pm.model, data=pm.conditioned(hs))).get_trace(x)
        tr.compute_log_prob()
        pyro_log_p = sum(site["log_prob"] for site in tr.nodes.values() if site["type"] == "sample")
        tq = poutine.trace(poutine.condition(pm.guide, data=pm.conditioned(hs))).get_trace(x)
        tq.compute_log_prob()
        pyro_log_q = sum(site["log_prob"] for site in tq.nodes.values() if site["type"] == "sample")
        ours_p, ours_q = model.log_joint(x, hs), inference.log_prob(hs, x)
    assert set(tr.nodes) >= {"x", *(f"h{i + 1}" for i in range(len(layers)))}
    assert pyro_log_p.shape == ours_p.shape == (6,)
    torch.testing.assert_close(pyro_log_p, ours_p, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(pyro_log_q, ours_q, rtol=1e-5, atol=1e-4)
    pyro.clear_param_store()


def test_pyro_svi_trains_our_own_parameters_at_nvil_rates():
    pyro = pytest.importorskip("pyro")
    from pyro.infer import SVI, TraceGraph_ELBO

    from nvil.learners.baselines import InputDependentBaseline

    model, inference = random_sbn((4,))
    baselines = torch.nn.ModuleList([InputDependentBaseline(model.n_visible, 8)])
    pm = PyroSBN(model, inference, baselines, decaying_avg=True, baseline_beta=0.8)
    before = {n: p.detach().clone() for n, p in [*model.named_parameters(), *inference.named_parameters()]}
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    svi = SVI(pm.model, pm.guide, pyro_param_groups(1e-3, 0.2, 1.0), loss=TraceGraph_ELBO())
    loss = svi.step(random_binary(5, model.n_visible))
    assert np.isfinite(loss)
    store = pyro.get_param_store()
    assert store["sbn$$$decoders.0.weight"] is model.decoders[0].weight
    assert store["inference$$$encoders.0.weight"] is inference.encoders[0].weight
    assert store["baselines$$$0.net.0.weight"] is baselines[0].net[0].weight
    named = [*model.named_parameters(), *inference.named_parameters()]
    changed = {n for n, p in named if not torch.equal(p, before[n])}
    assert changed == set(before)  # every parameter of both networks moved
    # The rates per group: Adam's first step moves each coordinate by about lr (the sign of the gradient).
    step_model = (model.decoders[0].weight - before["decoders.0.weight"]).abs().max().item()
    step_q = (inference.encoders[0].weight - before["encoders.0.weight"]).abs().max().item()
    assert step_model == pytest.approx(1e-3, rel=0.05) and step_q == pytest.approx(2e-4, rel=0.05)
    pyro.clear_param_store()


# ---- scikit-learn -------------------------------------------------------------------------------------

def random_sklearn_rbm(n_visible: int = 9, n_hidden: int = 6, seed: int = 0):
    pytest.importorskip("sklearn")
    from sklearn.neural_network import BernoulliRBM

    rng = np.random.RandomState(seed)
    sk = BernoulliRBM(n_components=n_hidden, random_state=seed)
    sk.fit((rng.rand(20, n_visible) < 0.5).astype(np.float64))  # fitted state, then random parameters
    sk.components_ = rng.normal(0, 1, (n_hidden, n_visible))
    sk.intercept_hidden_ = rng.normal(0, 1, n_hidden)
    sk.intercept_visible_ = rng.normal(0, 1, n_visible)
    return sk, rng


def test_sklearn_rbm_loads_with_the_same_free_energy_and_conditionals():
    sk, rng = random_sklearn_rbm()
    rbm = rbm_from_sklearn(sk, dtype=torch.float64)
    v = (rng.rand(30, 9) < 0.5).astype(np.float64)
    h = (rng.rand(30, 6) < 0.5).astype(np.float64)
    vt, ht = torch.from_numpy(v), torch.from_numpy(h)
    with torch.no_grad():
        np.testing.assert_allclose(rbm.free_energy(vt).numpy(), sk._free_energy(v), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(rbm.h_given_x(vt).numpy(), sk.transform(v), rtol=1e-10, atol=1e-12)
        p_v = torch.sigmoid(rbm.b + ht @ rbm.W.T).numpy()  # the field sample_x_given_h draws from
    from scipy.special import expit

    np.testing.assert_allclose(p_v, expit(h @ sk.components_ + sk.intercept_visible_), rtol=1e-10, atol=1e-12)


def test_sklearn_pseudo_likelihood_from_our_free_energy():
    """score_samples flips one random pixel per row; the same flips through our free energy give its value."""
    sk, rng = random_sklearn_rbm()
    rbm = rbm_from_sklearn(sk, dtype=torch.float64)
    v = (rng.rand(25, 9) < 0.5).astype(np.float64)
    flip = np.random.RandomState(sk.random_state).randint(0, v.shape[1], v.shape[0])
    v_ = v.copy()
    v_[np.arange(v.shape[0]), flip] = 1 - v_[np.arange(v.shape[0]), flip]
    with torch.no_grad():
        gap = rbm.free_energy(torch.from_numpy(v_)) - rbm.free_energy(torch.from_numpy(v))
        ours = (v.shape[1] * torch.nn.functional.logsigmoid(gap)).numpy()
    np.testing.assert_allclose(ours, sk.score_samples(v), rtol=1e-10, atol=1e-10)


def test_sklearn_rbm_log_z_by_brute_force():
    """Our exact log Z of the loaded RBM equals log sum_v exp(-F(v)) with scikit-learn's own free energy."""
    sk, _ = random_sklearn_rbm(n_visible=9, n_hidden=6)
    rbm = rbm_from_sklearn(sk, dtype=torch.float64)
    all_v = ((np.arange(2**9)[:, None] >> np.arange(9)) & 1).astype(np.float64)
    neg_f = -sk._free_energy(all_v)
    log_z_sk = neg_f.max() + np.log(np.exp(neg_f - neg_f.max()).sum())
    with torch.no_grad():
        assert rbm.log_z_exact().item() == pytest.approx(log_z_sk, abs=1e-9)


def test_sklearn_learning_rate_is_our_sgd_rate_on_the_free_energy_gap():
    """One BernoulliRBM._fit update equals one SGD step at the same rate on mean F(data) - mean F(negatives),
    with the negatives it drew (what bench/peer_sklearn.py relies on to give both sides the same --lr)."""
    sk, rng = random_sklearn_rbm(n_visible=9, n_hidden=6)
    batch, lr = 8, 0.05
    sk.learning_rate, sk.batch_size = lr, batch
    sk.h_samples_ = (rng.rand(batch, 6) < 0.5).astype(np.float64)
    v_pos = (rng.rand(batch, 9) < 0.5).astype(np.float64)
    rbm = rbm_from_sklearn(sk, dtype=torch.float64)
    state = np.random.RandomState(7)
    v_neg = sk._sample_visibles(sk.h_samples_, np.random.RandomState(7)).astype(np.float64)  # what _fit will draw
    sk._fit(v_pos, state)

    loss = rbm.free_energy(torch.from_numpy(v_pos)).mean() - rbm.free_energy(torch.from_numpy(v_neg)).mean()
    opt = torch.optim.SGD(rbm.parameters(), lr=lr)
    loss.backward()
    opt.step()
    np.testing.assert_allclose(rbm.W.detach().numpy(), sk.components_.T, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(rbm.c.detach().numpy(), sk.intercept_hidden_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(rbm.b.detach().numpy(), sk.intercept_visible_, rtol=1e-10, atol=1e-12)


# ---- bench/peer_pyro.py --isolate ------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["--isolate", "3", "--threads", "1", "--accel", "compile", "--updates", "77", "--skip-pyro"],
    ["--isolate=2", "--preset", "adam", "--plain", "bce", "--device", "cpu", "--val-examples", "9", "--warmup", "0"],
])
def test_isolate_children_get_every_option_but_isolate(argv):
    """Each ``--isolate`` child must run the parent's configuration: its command line parses back to the
    parent's options (a dropped flag, e.g. --skip-pyro or a zero --warmup, would change what the child times)."""
    from peer_pyro import child_argv, parse_args

    parent = parse_args(argv)
    child = parse_args([*child_argv(parent), "--only", "ours", "--result", "r.pt"])
    drop = ("isolate", "only", "result")
    assert {k: v for k, v in vars(child).items() if k not in drop} == \
        {k: v for k, v in vars(parent).items() if k not in drop}
    assert child.isolate == 0 and parent.isolate > 0
