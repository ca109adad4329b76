"""What the loop validates on, per model family, and the score early stopping keeps the best of.

- directed models with an inference network: ``val/elbo``, the ELBO with ``num_samples`` from q;
- Boltzmann machines small enough to enumerate (<= 20 hidden units, or pixels for a semi-RBM):
  ``val/log_p_exact`` and ``train/log_p_exact`` (on a training subset), exact log-likelihoods;
- Gaussian belief nets (continuous latents): ``val/log_likelihood``, log p(x) by AIS with HMC transitions
  (``estimators.ais_hmc``, ``trainer.val_ais_betas`` temperatures, ``num_samples`` chains per example);
- larger Boltzmann machines: ``val/pseudo_log_likelihood``, the stochastic pseudo-likelihood
  (D x log p(x_i | x_-i) for one random pixel i per example); Gaussian visibles:
  ``val/neg_reconstruction_error``.

Every estimate uses a generator with a fixed seed, so successive validations share their random numbers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from estimators.bounds import elbo
from models.rbm import BoltzmannMachine
from nvil.errors import ConfigError


def score_tag(model, inference) -> str:
    if inference is not None:
        return "val/elbo"
    if getattr(model, "is_continuous_latent", False):
        return "val/log_likelihood"
    if _exact_feasible(model):
        return "val/log_p_exact"
    return "val/pseudo_log_likelihood" if model.visible == "binary" else "val/neg_reconstruction_error"


def _exact_feasible(model) -> bool:
    try:
        model.check_exact()
        return True
    except ConfigError:
        return False


@torch.no_grad()
def validate(model, inference, valid: torch.Tensor, train_subset: torch.Tensor, num_samples: int, seed: int,
             ais_betas: int = 100) -> dict:
    g = torch.Generator(device=valid.device).manual_seed(seed + 1_000_003)
    tag = score_tag(model, inference)
    if tag == "val/elbo":
        return {tag: elbo(model, inference, valid, num_samples, generator=g).mean().item()}
    if tag == "val/log_likelihood":
        return {tag: continuous_log_likelihood(model, valid, num_samples, ais_betas, g).mean().item()}
    if tag == "val/log_p_exact":
        log_z = model.log_z_exact()
        return {tag: model.exact_log_prob(valid, log_z).mean().item(),
                "train/log_p_exact": model.exact_log_prob(train_subset, log_z).mean().item()}
    if tag == "val/pseudo_log_likelihood":
        return {tag: stochastic_pseudo_log_likelihood(model, valid, g).mean().item()}
    recon = model.sample_x_given_h(model.h_given_x(valid), 1.0, g, x=valid)
    return {tag: -((recon - valid) ** 2).sum(-1).mean().item()}


def continuous_log_likelihood(model, x: torch.Tensor, num_chains: int, num_betas: int, generator) -> torch.Tensor:
    """Per-example log p(x) by AIS-HMC (sigmoid schedule, auxiliary form), ``num_chains`` chains per example."""
    from estimators.ais import schedule
    from estimators.ais_hmc import ContinuousLatent, ais_hmc_log_w
    from estimators.base import combine_runs

    lm = ContinuousLatent(model, "validation", "auxiliary")
    log_w, _ = ais_hmc_log_w(lm, x.repeat_interleave(num_chains, 0), schedule("sigmoid", num_betas), generator=generator)
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
