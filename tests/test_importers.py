"""RBMs trained elsewhere (scikit-learn's BernoulliRBM, plain (W, b, c) arrays) scored by this package's estimators:
the imported energy is the source's (free energies equal to rounding), the exact log Z agrees with brute force, and
certified AIS on an imported RBM agrees with enumeration within its standard errors. Broken variants: W read in the
wrong layout gives another energy; bad shapes and non-finite values are one-line refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nvil.core.errors import ConfigError
from nvil.estimators import AIS
from nvil.models.importers import rbm_from_params, rbm_from_rbms, rbm_from_sklearn, rbm_from_state


def free_energy(W: np.ndarray, b: np.ndarray, c: np.ndarray, v: np.ndarray) -> np.ndarray:
    """F(v) = -b'v - sum_j log(1 + exp(c_j + v'W_j)), W [n_visible, n_hidden] (Salakhutdinov & Murray 2008, Eq. 3)."""
    return -v @ b - np.logaddexp(0.0, v @ W + c).sum(1)


def random_params(n_visible=9, n_hidden=6, seed=0, scale=1.0):
    rng = np.random.RandomState(seed)
    return rng.normal(0, scale, (n_visible, n_hidden)), rng.normal(0, 1, n_visible), rng.normal(0, 1, n_hidden), rng


def test_params_import_with_the_same_energy_and_the_wrong_layout_differs():
    W, b, c, rng = random_params()
    v = (rng.rand(40, 9) < 0.5).astype(np.float64)
    rbm = rbm_from_params(W, b, c, dtype=torch.float64)
    assert rbm_from_state({"W": W, "b": b, "c": c}, dtype=torch.float64).W.equal(rbm.W)
    with torch.no_grad():
        np.testing.assert_allclose(rbm.free_energy(torch.from_numpy(v)).numpy(), free_energy(W, b, c, v), rtol=1e-12)
    square = random_params(n_visible=6, n_hidden=6, seed=1)[:3]  # a layout mistake that shapes cannot catch
    wrong = rbm_from_params(*square, weights="hidden_by_visible", dtype=torch.float64)
    v6 = torch.from_numpy((rng.rand(40, 6) < 0.5).astype(np.float64))
    with torch.no_grad():
        assert not np.allclose(wrong.free_energy(v6).numpy(), free_energy(*square, v6.numpy()))


@pytest.mark.parametrize("args, fragment", [
    ((np.zeros(5), np.zeros(5), np.zeros(3)), "W must be a matrix"),
    ((np.zeros((5, 3)), np.zeros(4), np.zeros(3)), "b must hold one bias per visible unit (5"),
    ((np.zeros((5, 3)), np.zeros(5), np.zeros(5)), "c must hold one bias per hidden unit (3"),
    ((np.full((5, 3), np.nan), np.zeros(5), np.zeros(3)), "W holds non-finite values"),
])
def test_bad_parameters_are_one_line_refusals(args, fragment):
    with pytest.raises(ConfigError) as e:
        rbm_from_params(*args)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_a_state_without_its_keys_and_an_unfitted_sklearn_model_are_refused():
    with pytest.raises(ConfigError, match="missing c"):
        rbm_from_state({"W": np.zeros((2, 2)), "b": np.zeros(2)})
    sklearn = pytest.importorskip("sklearn.neural_network")
    with pytest.raises(ConfigError, match="pass a fitted BernoulliRBM"):
        rbm_from_sklearn(sklearn.BernoulliRBM(n_components=3))


def test_a_fitted_sklearn_rbm_keeps_its_free_energy_and_exact_log_z():
    sklearn = pytest.importorskip("sklearn.neural_network")
    rng = np.random.RandomState(0)
    data = (rng.rand(200, 10) < np.linspace(0.1, 0.9, 10)).astype(np.float64)
    sk = sklearn.BernoulliRBM(n_components=7, learning_rate=0.05, n_iter=20, random_state=0).fit(data)
    rbm = rbm_from_sklearn(sk, dtype=torch.float64)
    all_v = ((np.arange(2**10)[:, None] >> np.arange(10)) & 1).astype(np.float64)
    neg_f = -sk._free_energy(all_v)
    with torch.no_grad():
        np.testing.assert_allclose(-rbm.free_energy(torch.from_numpy(all_v)).numpy(), neg_f, rtol=1e-12)
        assert rbm.log_z_exact().item() == pytest.approx(np.logaddexp.reduce(neg_f), abs=1e-9)


def test_certified_ais_on_an_imported_rbm_agrees_with_enumeration():
    """log p(v) of held-out rows by certified AIS within 3 SE of the exact value, and certified."""
    W, b, c, rng = random_params(n_visible=12, n_hidden=10, seed=3, scale=0.5)
    rbm = rbm_from_params(W, b, c)
    x = torch.from_numpy((rng.rand(300, 12) < 0.5).astype(np.float32))
    result = AIS(num_chains=500, num_betas=2000).estimate(rbm, x[:100], train=x[100:], seed=0)
    rbm64 = rbm_from_params(W, b, c, dtype=torch.float64)
    with torch.no_grad():
        exact = (-rbm64.free_energy(x[:100].double()) - rbm64.log_z_exact()).mean().item()
    assert result.certified is True, result.warnings
    tolerance = 3 * result.extras["log_z_stderr"] + 1e-3
    assert abs(result.mean_log_p - exact) < tolerance
    assert math.isfinite(result.stderr)
    # the broken variant: the same comparison against another RBM's exact value (one weight moved by 0.3) fails
    moved = W.copy()
    moved[0, 0] += 0.3
    other = rbm_from_params(moved, b, c, dtype=torch.float64)
    with torch.no_grad():
        wrong = (-other.free_energy(x[:100].double()) - other.log_z_exact()).mean().item()
    assert abs(result.mean_log_p - wrong) > tolerance


def test_an_rbms_package_rbm_keeps_its_energy_and_exact_log_z():
    """The rbms package's BBRBM: the same free energy on every state, and its own exact log Z equals ours."""
    rbms = pytest.importorskip("rbms.bernoulli_bernoulli.classes")
    exact = pytest.importorskip("rbms.partition_function.exact")
    W, b, c, _ = random_params(n_visible=10, n_hidden=8, seed=5, scale=0.7)
    theirs = rbms.BBRBM(torch.from_numpy(W), torch.from_numpy(b), torch.from_numpy(c), dtype=torch.float64)
    ours = rbm_from_rbms(theirs, dtype=torch.float64)
    all_v = torch.from_numpy(((np.arange(2**10)[:, None] >> np.arange(10)) & 1).astype(np.float64))
    with torch.no_grad():
        torch.testing.assert_close(ours.free_energy(all_v), theirs.compute_energy_visibles(all_v), rtol=1e-12, atol=1e-9)
        assert ours.log_z_exact().item() == pytest.approx(exact.compute_partition_function(theirs, all_v), abs=1e-9)
    assert rbm_from_rbms(theirs.named_parameters(), dtype=torch.float64).log_z_exact().item() == pytest.approx(
        ours.log_z_exact().item(), abs=1e-12)
    # the broken variant: reading weight_matrix as [n_hidden, n_visible] changes the energy
    with pytest.raises(ConfigError):
        rbm_from_params(W, b, c, weights="hidden_by_visible")
    with pytest.raises(ConfigError, match="weight_matrix"):
        rbm_from_rbms({"vbias": b, "hbias": c})
