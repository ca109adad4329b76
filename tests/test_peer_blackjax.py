"""bench/jax_gbn.py, the JAX port of a Gaussian net's log joint that bench/peer_blackjax.py hands to BlackJAX:
its value and gradient equal the torch model's (models/gaussian.py) at random points, in both forms."""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("jax")
pytest.importorskip("blackjax")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import jax_gbn  # noqa: E402

from nvil.models.gaussian import DynamicBayesNet, GaussianBeliefNet  # noqa: E402

TOL = 1e-5  # float32; a wrong term is off by far more (see test_compare_catches_a_wrong_parameter)


def _random_point(model, n, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():  # away from the initial draw, sigmas included
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    x = (torch.rand(n, model.n_visible, generator=g) < 0.4).float()
    if model.visible == "gaussian":
        x = torch.randn(n, model.n_visible, generator=g)
    states = torch.randn(n, model.n_latent, generator=g)
    return x, states


@pytest.mark.parametrize("form", ["centred", "auxiliary"])
@pytest.mark.parametrize("visible,nonlinearity", [("bernoulli", "tanh"), ("bernoulli", "sigmoid"),
                                                  ("gaussian", "hard_tanh"), ("gaussian", "identity")])
def test_port_matches_torch_belief_net(form, visible, nonlinearity):
    torch.manual_seed(0)
    model = GaussianBeliefNet(20, [6, 5, 4], form=form, visible=visible, nonlinearity=nonlinearity, sigma=0.3)
    x, states = _random_point(model, 7, 1)
    err = jax_gbn.compare(model, x, states, form)
    assert err["value"] < TOL and err["grad"] < TOL, err
    assert err["max_abs_grad"] > 1.0  # the gradient is not trivially zero


@pytest.mark.parametrize("form", ["centred", "auxiliary"])
def test_port_matches_torch_dynamic_net(form):
    torch.manual_seed(0)
    model = DynamicBayesNet(4, 3, 2, form=form)
    x, states = _random_point(model, 5, 2)
    err = jax_gbn.compare(model, x, states, form)
    assert err["value"] < TOL and err["grad"] < TOL, err


def test_port_evaluates_the_other_form():
    """The benchmark may run a net in the form it was not built for: both sides take the form per call."""
    torch.manual_seed(0)
    model = GaussianBeliefNet(20, [6, 4], form="auxiliary")
    x, states = _random_point(model, 5, 3)
    err = jax_gbn.compare(model, x, states, "centred")
    assert err["value"] < TOL and err["grad"] < TOL, err


def test_compare_catches_a_wrong_parameter(monkeypatch):
    """The check has teeth: a port that reads a slightly wrong sigma is caught, in value and gradient."""
    torch.manual_seed(0)
    model = GaussianBeliefNet(20, [6, 4], form="centred")
    x, states = _random_point(model, 5, 4)
    export = jax_gbn.export

    def wrong_export(m, dtype):
        spec, params = export(m, dtype)
        params["log_sigmas"][0] = params["log_sigmas"][0] + 0.01
        return spec, params

    monkeypatch.setattr(jax_gbn, "export", wrong_export)
    err = jax_gbn.compare(model, x, states, "centred")
    assert err["value"] > 100 * TOL and err["grad"] > 100 * TOL, err
