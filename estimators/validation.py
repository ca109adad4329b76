"""What the loop validates on, per model family, and the score early stopping keeps the best of.

- directed models with an inference network: ``val/elbo``, the ELBO with ``num_samples`` from q;
- models seen through the protocol alone with a proposal (the VAE): ``val/iwae``, Burda et al.'s L_K with
  K = ``num_samples`` draws of q(z | x);
- Boltzmann machines small enough to enumerate (<= 20 hidden units, or pixels for a semi-RBM):
  ``val/log_p_exact`` and ``train/log_p_exact`` (on a training subset), exact log-likelihoods;
- Gaussian belief nets (continuous latents): ``val/log_likelihood``, log p(x) by AIS with HMC transitions
  (``nvil.estimators.ais_hmc``, ``trainer.val_ais_betas`` temperatures, ``num_samples`` chains per example);
- larger Boltzmann machines: ``val/pseudo_log_likelihood``, the stochastic pseudo-likelihood
  (D x log p(x_i | x_-i) for one random pixel i per example); Gaussian visibles:
  ``val/neg_reconstruction_error``.

Every estimate uses a generator with a fixed seed, so successive validations share their random numbers.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from nvil.core.errors import ConfigError
from nvil.estimators.annealing import schedule
from nvil.estimators.base import combine_runs
from nvil.estimators.bounds import IWAE, elbo
from nvil.estimators.model_paths import ContinuousLatent, ais_hmc_log_w
from nvil.models.protocol import CONTINUOUS_LATENTS, FREE_ENERGY, capable, draw_seed, protocol_only
from nvil.models.rbm import BoltzmannMachine


def score_tag(model, inference) -> str:
    """The ELBO for a model trained with an inference network, else what its family can score (by its capabilities)."""
    if inference is not None:
        return "val/elbo"
    if capable(model, CONTINUOUS_LATENTS):
        return "val/log_likelihood"
    if capable(model, FREE_ENERGY):
        return _boltzmann_tag(model)
    if protocol_only(model) and callable(getattr(model, "proposal", None)):
        return "val/iwae"
    raise ConfigError(f"a {type(model).__name__} trained without an inference network has no validation score")


def _boltzmann_tag(model) -> str:
    """Exact log p while log Z can be enumerated, else the cheap score of the pixel type (``PIXEL_TAG``)."""
    return "val/log_p_exact" if _exact_feasible(model) else PIXEL_TAG[model.visible_layer.name]


def _exact_feasible(model) -> bool:
    try:
        model.check_exact()
        return True
    except ConfigError:
        return False


PIXEL_TAG = {"bernoulli": "val/pseudo_log_likelihood", "gaussian": "val/neg_reconstruction_error"}


class Job(NamedTuple):
    """What one validation scores: the model (and its inference network) on ``valid`` and, for exact
    scores, a training subset, with the fixed-seed generator ``g``."""

    model: object
    inference: object
    valid: torch.Tensor
    train_subset: torch.Tensor
    num_samples: int
    ais_betas: int
    g: torch.Generator


def _exact(j: Job) -> dict:
    log_z = j.model.log_z_exact()
    return {"val/log_p_exact": j.model.exact_log_prob(j.valid, log_z).mean().item(),
            "train/log_p_exact": j.model.exact_log_prob(j.train_subset, log_z).mean().item()}


def _neg_reconstruction_error(j: Job) -> dict:
    recon = j.model.sample_x_given_h(j.model.h_given_x(j.valid), 1.0, j.g, x=j.valid)
    return {"val/neg_reconstruction_error": -((recon - j.valid) ** 2).sum(-1).mean().item()}


SCORE = {  # tag -> the scores logged under it
    "val/elbo": lambda j: {"val/elbo": elbo(j.model, j.inference, j.valid, j.num_samples, generator=j.g).mean().item()},
    "val/log_likelihood": lambda j: {"val/log_likelihood": continuous_log_likelihood(
        j.model, j.valid, j.num_samples, j.ais_betas, j.g).mean().item()},
    "val/iwae": lambda j: {"val/iwae": IWAE(num_samples=j.num_samples).estimate(
        j.model, j.valid, seed=draw_seed(j.g)).mean},
    "val/log_p_exact": _exact,
    "val/pseudo_log_likelihood": lambda j: {"val/pseudo_log_likelihood": stochastic_pseudo_log_likelihood(
        j.model, j.valid, j.g).mean().item()},
    "val/neg_reconstruction_error": _neg_reconstruction_error,
}


@torch.no_grad()
def validate(model, inference, valid: torch.Tensor, train_subset: torch.Tensor, num_samples: int, seed: int,
             ais_betas: int = 100) -> dict:
    """The scores ``score_tag`` names, on the rows ``valid`` (and ``train_subset``, for exact scores) with
    ``num_samples`` samples (or AIS-HMC chains) per example and ``ais_betas`` temperatures, drawn from a generator
    seeded by ``seed``; plain values, so the caller (``nvil.app.loop``) reads the trainer config."""
    g = torch.Generator(device=valid.device).manual_seed(seed + 1_000_003)
    return SCORE[score_tag(model, inference)](Job(model, inference, valid, train_subset, num_samples, ais_betas, g))


def continuous_log_likelihood(model, x: torch.Tensor, num_chains: int, num_betas: int, generator) -> torch.Tensor:
    """Per-example log p(x) by AIS-HMC (sigmoid schedule, auxiliary form), ``num_chains`` chains per example."""
    lm = ContinuousLatent(model, "validation", "auxiliary")
    log_w, _ = ais_hmc_log_w(lm, x.repeat_interleave(num_chains, 0), schedule("sigmoid", num_betas), chains=num_chains,
                             generator=generator)
    return combine_runs(log_w.view(-1, num_chains))


def stochastic_pseudo_log_likelihood(model: BoltzmannMachine, x: torch.Tensor, generator) -> torch.Tensor:
    """Per-example D log p(x_i | x_-i) for one random pixel i each: an unbiased estimate of the
    pseudo-log-likelihood sum_i log p(x_i | x_-i) (Besag 1975), from two free energies."""
    i = torch.randint(0, model.n_pixels, (x.shape[0],), generator=generator, device=x.device)
    flipped = x.clone()
    rows = torch.arange(x.shape[0], device=x.device)
    flipped[rows, i] = 1 - flipped[rows, i]
    # log p(x_i | x_-i) = log sigmoid(F(x_flipped) - F(x))
    return model.n_pixels * F.logsigmoid(model.free_energy(flipped) - model.free_energy(x))
