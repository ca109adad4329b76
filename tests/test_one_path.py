"""One code path: an estimator gives a built-in model and a user's own copy of it, written by hand against the model
protocol (``nvil.models.protocol``), the same numbers for the same seed. The copy shares the built-in's parameters
but none of its code: if the estimators reached the built-in through a path of its own (a family switch, a fast path
the copy cannot take, a second lineage), the draws or the arithmetic would differ and so would the numbers."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import nvil
from nvil.core.errors import ConfigError
from nvil.estimators import BDMC, ELBO, IWAE, AISPosterior, Chib, ChibMH, Harmonic, ModelAIS, ModelSMC
from nvil.models.gaussian import GaussianBeliefNet
from nvil.models.inference import LayeredInference
from nvil.models.protocol import Latent
from nvil.models.sbn import SBN


class HandWrittenGBN:
    """z ~ N(0, I), x | z ~ Bernoulli(sigmoid(V z + c)): a one-layer Gaussian belief net as a user writes it."""

    def __init__(self, net: GaussianBeliefNet) -> None:
        emission = net.emissions[0]
        self.V, self.c = emission.weight.detach().clone(), emission.bias.detach().clone()
        self.latent = Latent.continuous(self.V.shape[1])

    def log_prior(self, z):
        return -0.5 * (z.square().sum(-1) + z.shape[-1] * math.log(2 * math.pi))

    def log_likelihood(self, x, z):
        return -F.binary_cross_entropy_with_logits(z @ self.V.T + self.c, x, reduction="none").sum(-1)

    def sample_prior(self, n, generator):
        return torch.randn(n, self.V.shape[1], generator=generator, dtype=self.V.dtype)

    def sample_likelihood(self, z, generator):
        p = torch.sigmoid(z @ self.V.T + self.c)
        return (torch.rand(p.shape, generator=generator, dtype=p.dtype) < p).to(p.dtype)


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    net = GaussianBeliefNet(8, [3], visible="bernoulli", init_scale=1.0).double()
    x, _ = net.sample(12, torch.Generator().manual_seed(1))
    return net, HandWrittenGBN(net), x


AIS_SETTINGS = {"num_betas": 60, "num_chains": 4, "num_leapfrog": 3, "iwae_samples": 50, "num_simulated": 4}
CASES = [
    ("iwae", lambda: IWAE(num_samples=200, batch_size=5)),
    ("elbo", lambda: ELBO(num_samples=50, batch_size=5)),
    ("ais", lambda: ModelAIS(batch_size=5, **AIS_SETTINGS)),
    ("smc", lambda: ModelSMC(batch_size=5, num_particles=8, num_runs=4, num_leapfrog=3, iwae_samples=50,
                             num_simulated=4)),
    ("chib_mh", lambda: ChibMH(num_steps=10, num_runs=10, batch_size=5)),
]
# The built-in's and the copy's log p(x, z) differ in the last bits (the order of their sums); chib_mh's Adam climb
# to z* carries that to ~1e-7 nats. A different seed moves every estimate by ~0.1 or more.
ATOL = {"chib_mh": 1e-6}


@pytest.mark.parametrize("name, make", CASES, ids=[c[0] for c in CASES])
def test_the_same_numbers_for_a_built_in_model_and_a_hand_written_copy(pair, name, make):
    net, copy, x = pair
    ours, theirs = make().estimate(net, x, seed=7), make().estimate(copy, x, seed=7)
    assert torch.isfinite(ours.log_p).all()
    torch.testing.assert_close(ours.log_p, theirs.log_p, rtol=0, atol=ATOL.get(name, 1e-9))
    assert ours.certified == theirs.certified and ours.warnings == theirs.warnings
    other_seed = make().estimate(copy, x, seed=8)
    assert not torch.allclose(other_seed.log_p, theirs.log_p)  # the seed matters: the match above is not vacuous


def test_bdmc_the_same_for_a_built_in_model_and_a_hand_written_copy(pair):
    net, copy, _ = pair
    # The start named: BDMC on a Gaussian net certifies estimator=ais_hmc, which anneals from the prior (its sampler
    # form declares default_start), while a user's continuous model without a proposal starts from a Laplace fit.
    settings = {"num_simulated": 6, "num_betas": 60, "num_chains": 4, "num_leapfrog": 3, "start": "prior"}
    ours = BDMC(**settings).estimate(net, seed=3)
    theirs = BDMC(**settings).estimate(copy, seed=3)
    torch.testing.assert_close(ours.log_p, theirs.log_p, rtol=0, atol=1e-9)
    assert ours.extras["mean_log_p_upper"] == theirs.extras["mean_log_p_upper"]


def test_the_python_api_takes_the_same_path(pair):
    net, copy, x = pair
    ours = nvil.evaluate(net, x, estimator="iwae", num_samples=100, seed=2)
    theirs = nvil.evaluate(copy, x, estimator="iwae", num_samples=100, seed=2)
    torch.testing.assert_close(ours.log_p, theirs.log_p, rtol=0, atol=1e-9)


def test_a_copy_that_differs_gives_different_numbers(pair):
    """The broken variant: a copy whose decoder bias is off by 0.1 must not match (the comparison has power)."""
    net, copy, x = pair
    broken = HandWrittenGBN(net)
    broken.c = broken.c + 0.1
    ours, theirs = IWAE(num_samples=200).estimate(net, x, seed=7), IWAE(num_samples=200).estimate(broken, x, seed=7)
    assert (ours.log_p - theirs.log_p).abs().max() > 1e-3


def test_the_bound_says_what_it_sampled_from(pair):
    """A Gaussian net has no inference network: the one bound samples a Laplace fit of each posterior
    (continuous z), says so, and is tighter than from the prior it samples when asked; a proposal it does not
    have is refused in one line."""
    net, _, x = pair
    fitted = IWAE(num_samples=30).estimate(net, x, seed=4)
    prior = IWAE(num_samples=30, start="prior").estimate(net, x, seed=4)
    assert fitted.extras["proposal"] == "laplace" and prior.extras["proposal"] == "prior"
    assert fitted.mean_log_p > prior.mean_log_p
    with pytest.raises(ConfigError, match="proposal"):
        IWAE(num_samples=30, start="proposal").estimate(net, x, seed=4)


class HandWrittenSBN:
    """h ~ Bernoulli(sigmoid(b)), x | h ~ Bernoulli(sigmoid(W h + c)): a one-layer SBN as a user writes it."""

    def __init__(self, sbn) -> None:
        self.W, self.c = sbn.decoders[0].weight.detach().double(), sbn.decoders[0].bias.detach().double()
        self.b = sbn.prior_logits.detach().double()
        self.latent = Latent.binary(self.W.shape[1])

    def log_prior(self, z):
        return -F.binary_cross_entropy_with_logits(self.b.expand_as(z), z.double(), reduction="none").sum(-1)

    def log_likelihood(self, x, z):
        return -F.binary_cross_entropy_with_logits(z.double() @ self.W.T + self.c, x.double(),
                                                   reduction="none").sum(-1)


def test_exact_is_one_enumeration_for_a_built_in_sbn_and_a_hand_written_copy():
    from nvil.estimators import Exact
    from nvil.models.sbn import SBN

    torch.manual_seed(3)
    sbn = SBN(7, [5])
    with torch.no_grad():
        for p in sbn.parameters():
            p.normal_(0, 1.0)
    x = (torch.rand(20, 7, generator=torch.Generator().manual_seed(2)) < 0.5).float()
    ours, theirs = Exact().estimate(sbn, x), Exact().estimate(HandWrittenSBN(sbn), x)
    torch.testing.assert_close(ours.log_p.double(), theirs.log_p.double(), rtol=0, atol=1e-4)  # float32 vs float64
    assert ours.certified and theirs.certified
    broken = HandWrittenSBN(sbn)
    broken.b = broken.b + 0.2
    assert (Exact().estimate(broken, x).log_p.double() - ours.log_p.double()).abs().max() > 1e-2


def test_nvil_evaluate_gives_a_gaussian_net_the_protocol_ais(pair):
    """``estimator="ais"`` on a built-in Gaussian net (which the Boltzmann machines' AIS refuses) is the protocol's
    AIS, with its IWAE and BDMC checks, draw for draw the hand-written copy's."""
    net, copy, x = pair
    ours = nvil.evaluate(net, x, estimator="ais", seed=5, **AIS_SETTINGS)
    theirs = nvil.evaluate(copy, x, estimator="ais", seed=5, **AIS_SETTINGS)
    torch.testing.assert_close(ours.log_p, theirs.log_p, rtol=0, atol=1e-9)
    assert "bdmc_gap" in ours.checks and "above_iwae" in ours.checks


class HandWrittenSBNWithProposal(HandWrittenSBN):
    """The SBN copy with q(h | x) = Bernoulli(sigmoid(logits of the inference network)) as its ``proposal``."""

    def __init__(self, sbn, inference) -> None:
        super().__init__(sbn)
        self.R, self.d = inference.encoders[0].weight.detach().double(), inference.encoders[0].bias.detach().double()

    def proposal(self, x):
        return torch.distributions.Bernoulli(logits=x.double() @ self.R.T + self.d)


@pytest.fixture(scope="module")
def sbn_pair():
    torch.manual_seed(3)
    sbn, q = SBN(7, [5]).double(), LayeredInference(7, [5]).double()
    with torch.no_grad():
        for p in [*sbn.parameters(), *q.parameters()]:
            p.normal_(0, 1.0)
    x = (torch.rand(20, 7, generator=torch.Generator().manual_seed(2)) < 0.5).double()
    return sbn, q, HandWrittenSBNWithProposal(sbn, q), x


SUMMING_CASES = [
    ("iwae", lambda: IWAE(num_samples=50, batch_size=5)),
    ("elbo", lambda: ELBO(num_samples=20, batch_size=5)),
    ("chib", lambda: Chib(num_steps=10, num_runs=3, accel="none")),
    ("ais_posterior", lambda: AISPosterior(num_betas=20, num_runs=3, accel="none")),
    ("harmonic", lambda: Harmonic(num_samples=20, num_runs=3, accel="none")),
]


@pytest.mark.parametrize("name, make", SUMMING_CASES, ids=[c[0] for c in SUMMING_CASES])
def test_the_estimators_that_sum_over_h_are_one_path_for_an_sbn_and_a_hand_written_copy(sbn_pair, name, make):
    """Chib, AIS from Q and the harmonic mean on a built-in SBN with its inference network, and on a user's copy
    whose ``proposal`` is that network's q: the same draws of Q (``generator_sample``), the same Gibbs moves
    (structured ``SequentialGibbs`` for the SBN, ``FlipGibbs`` on the copy's log p(x, h)), the same numbers."""
    sbn, q, copy, x = sbn_pair
    ours, theirs = make().estimate(sbn, x, inference=q, seed=7), make().estimate(copy, x, seed=7)
    assert torch.isfinite(ours.log_p).all()
    torch.testing.assert_close(ours.log_p, theirs.log_p, rtol=0, atol=1e-9)
    assert ours.certified == theirs.certified
    assert not torch.allclose(make().estimate(copy, x, seed=8).log_p, theirs.log_p)
    broken = HandWrittenSBNWithProposal(sbn, q)
    broken.b = broken.b + 0.2  # a different prior: the same draws must give different numbers
    assert (make().estimate(broken, x, seed=7).log_p - ours.log_p).abs().max() > 1e-6
