"""The one door for data (``nvil.estimators.door``): every estimator's ``estimate`` admits its rows first. NaN,
grey levels given to Bernoulli visibles, the wrong width and objects that are not tensors are one line each; float64
and numpy rows are converted and give the same estimate; a non-finite estimate is never certified. Each check has a
broken variant: the same call past the door (the undecorated method) certifies or crashes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import nvil
from nvil.core.errors import DataError
from nvil.estimators import AIS, IWAE, Exact, evaluate_model
from nvil.estimators.base import Result
from nvil.estimators.door import certify_finite
from nvil.models import RBM
from nvil.models.protocol import Latent, gaussian_log_prob


def rbm_and_rows(n: int = 40):
    torch.manual_seed(0)
    rbm = RBM(8, 4)
    with torch.no_grad():
        rbm.W.normal_(0, 0.5)
    return rbm, torch.bernoulli(torch.full((n, 8), 0.4))


class GaussianBernoulli(torch.nn.Module):
    """A user's model: z ~ N(0, I_2), x_i | z ~ Bernoulli(sigmoid(W z + b)), 8 pixels."""

    latent = Latent.continuous(2)

    def __init__(self) -> None:
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(8, 2, generator=torch.Generator().manual_seed(1)))

    def log_prior(self, z):
        return gaussian_log_prob(z)

    def log_likelihood(self, x, z):
        return -torch.nn.functional.binary_cross_entropy_with_logits(z @ self.W.T, x, reduction="none").sum(-1)

    def sample_prior(self, n, generator):
        return torch.randn(n, 2, generator=generator)

    def sample_likelihood(self, z, generator):
        return torch.bernoulli(torch.sigmoid(z @ self.W.T), generator=generator)


def test_nan_is_one_line_and_past_the_door_it_would_be_certified():
    rbm, x = rbm_and_rows()
    x[3, 5] = float("nan")
    with pytest.raises(DataError, match=r"^data has 1 non-finite value\(s\).*row 3, column 5") as e:
        AIS(num_chains=10, num_betas=100).estimate(rbm, x, train=x.nan_to_num())
    assert "\n" not in str(e.value)
    broken = AIS.estimate.__wrapped__(AIS(num_chains=10, num_betas=100), rbm, x, train=x.nan_to_num())
    assert math.isnan(broken.mean) and broken.certified is True  # what the door prevents


def test_grey_levels_are_refused_with_the_binarisation_to_use():
    rbm, x = rbm_and_rows()
    x[0, 0] = 0.25
    with pytest.raises(DataError, match=r"outside \{0, 1\}.*Bernoulli visibles: binarise it first: torch.bernoulli"):
        Exact().estimate(rbm, x)
    assert math.isfinite(Exact.estimate.__wrapped__(Exact(), rbm, x).mean)  # past the door: a number for nonsense


def test_float64_and_numpy_rows_are_converted_and_give_the_same_estimate():
    rbm, x = rbm_and_rows()
    exact = Exact().estimate(rbm, x).log_p
    assert torch.equal(Exact().estimate(rbm, x.double()).log_p, exact)
    assert torch.equal(Exact().estimate(rbm, x.numpy()).log_p, exact)
    assert torch.equal(Exact().estimate(rbm, x.to(torch.uint8)).log_p, exact)


def test_wrong_shapes_and_types_are_one_line():
    rbm, x = rbm_and_rows()
    for rows, message in ((x[:, :5], "data has 5 columns but the model has 8 visible units"),
                          (x[0], r"data must be a 2-D tensor"),
                          (x.tolist(), "data must be a torch.Tensor or a numpy array, got list"),
                          (x[:0], "data must hold examples")):
        with pytest.raises(DataError, match=message):
            Exact().estimate(rbm, rows)
    with pytest.raises(DataError, match="train has 3 columns"):
        AIS(num_chains=10, num_betas=50).estimate(rbm, x, train=x[:, :3])


def test_a_users_model_gets_the_same_door():
    model, x = GaussianBernoulli(), torch.bernoulli(torch.full((20, 8), 0.5))
    bad = x.clone()
    bad[2, 1] = float("inf")
    with pytest.raises(DataError, match="non-finite value"):
        evaluate_model(model, bad, estimator="iwae", num_samples=10)
    with pytest.raises(DataError, match=r"GaussianBernoulli.log_likelihood\(x, z\) cannot take data of shape \(20, 5\)"):
        evaluate_model(model, x[:, :5], estimator="iwae", num_samples=10)
    with pytest.raises(ValueError, match="Target size"):  # past the door: a traceback from deep inside torch
        IWAE.estimate.__wrapped__(IWAE(num_samples=10), model, x[:, :5])
    model.data_support = "binary"
    with pytest.raises(DataError, match=r"outside \{0, 1\}"):
        evaluate_model(model, x * 0.5, estimator="iwae", num_samples=10)
    numpy = evaluate_model(model, x.numpy(), estimator="iwae", num_samples=10).log_p
    assert torch.equal(numpy, evaluate_model(model, x, estimator="iwae", num_samples=10).log_p)


def test_a_non_finite_estimate_is_never_certified():
    result = Result("ais", torch.tensor([-1.0, float("-inf")]), 0.0, 0, checks=["ess"])
    assert result.certified is True  # the broken variant: a certificate that never looks at the number
    certify_finite(result)
    assert result.certified is False and "finite" in result.failed and "not finite" in result.warnings[0]
    fine = Result("ais", torch.tensor([-1.0, -2.0]), 0.0, 0, checks=["ess"])
    certify_finite(fine)
    assert fine.certified is True


def test_every_estimator_class_goes_through_the_door():
    from nvil.estimators import ESTIMATORS, ROUTES
    for cls in {*ESTIMATORS.values(), *(target for routes in ROUTES.values() for target, _, _ in routes)}:
        assert getattr(cls.estimate, "through_the_door", False), cls.__name__


def test_the_python_face_uses_the_door_too():
    rbm, x = rbm_and_rows()
    with pytest.raises(DataError, match="outside"):
        nvil.evaluate(rbm, x * 0.5, estimator="exact")
    with pytest.raises(DataError, match="non-finite"):
        nvil.evaluate(rbm, np.full((3, 8), np.nan), estimator="exact")
    assert IWAE  # the bound's class is in the registry above
