"""What every estimator shares on a model seen through the protocol (``nvil.models.protocol``): the model checked
once (``protocol``), its module in eval mode for the estimate (``eval_mode``), the rows repeated per sample
(``expand_rows``), the seed of a sub-estimate (``stream``), the checks of ``x`` and ``start``, and whether its
``log_likelihood`` and ``sample_likelihood`` agree (``likelihood_consistency``). The bounds
themselves (IWAE, ELBO) are ``nvil.estimators.bounds``, one class for built-in and protocol models."""

from __future__ import annotations

import contextlib
import math
import zlib

import torch

from nvil.core.errors import ConfigError
from nvil.core.ops import mean_and_stderr
from nvil.models.protocol import ProtocolModel

STARTS = (None, "prior", "proposal", "laplace")


def protocol(model) -> ProtocolModel:
    """``model`` seen through the protocol (checked once, one line per problem)."""
    return model if isinstance(model, ProtocolModel) else ProtocolModel(model)


def stream(seed: int, name: str) -> int:
    """A seed for the sub-estimate ``name`` of an estimate seeded by ``seed`` (its random numbers apart from the
    main estimate's)."""
    return (seed + zlib.crc32(name.encode()) * 2**20) % 2**62


def expand_rows(x: torch.Tensor, k: int) -> torch.Tensor:
    """x [N, ...] repeated k times, k-major: [k N, ...] (row j of copy i at i N + j)."""
    return x.unsqueeze(0).expand(k, *x.shape).reshape(k * x.shape[0], *x.shape[1:])


@contextlib.contextmanager
def eval_mode(model):
    """The user's module in eval mode (dropout off, batch norm frozen) for the estimate, its mode put back after."""
    module = model.obj if isinstance(model, ProtocolModel) else model
    training = getattr(module, "training", None)
    if isinstance(module, torch.nn.Module):
        module.eval()
    try:
        yield
    finally:
        if isinstance(module, torch.nn.Module) and training:
            module.train()


def check_data(x) -> None:
    if not torch.is_tensor(x) or x.dim() < 1 or x.shape[0] == 0:
        shape = tuple(x.shape) if torch.is_tensor(x) else type(x).__name__
        raise ConfigError(f"x must be a tensor with the examples along its first dimension, got {shape}")


def check_start(start) -> None:
    if start not in STARTS:
        raise ConfigError("start must be prior, proposal or laplace (None: the proposal where the model has one, "
                          f"else laplace for continuous z), got {start!r}")


CONSISTENCY_PAIRS = 200  # simulated pairs of the likelihood_consistency check (at least)


def likelihood_consistency(pm: ProtocolModel, n: int, generator) -> dict:
    """Do ``log_likelihood`` and ``sample_likelihood`` agree on whether x depends on z?

    For z, z' from the prior and x ~ p(x | z), E[log p(x | z) - log p(x | z')] = E[KL(p(. | z) || p(. | z'))], which
    is positive wherever the sampler's draws depend on z. Two draws x, x2 from the same z lie closer together than
    draws from different z exactly when they do: dependence = ||x - x'||^2 - ||x - x2||^2, x' ~ p(x | z'). The
    check fails when the draws depend on z (dependence above 5 standard errors) while the log-likelihood ratio does
    not exceed 2 of its own (a ``log_likelihood`` that ignores z, or scores another model than the sampler draws)."""
    z = pm.sample_prior(n, generator)
    x = pm.sample_likelihood(z, generator)
    x2 = pm.sample_likelihood(z, generator)
    z_other, x_other = z.roll(1, 0), x.roll(1, 0)
    ratio = (pm.log_likelihood(x, z) - pm.log_likelihood(x, z_other)).double()
    flat = lambda t: t.reshape(t.shape[0], -1).double()  # noqa: E731
    dependence = (flat(x) - flat(x_other)).square().sum(1) - (flat(x) - flat(x2)).square().sum(1)

    def score(t):
        mean, se = mean_and_stderr(t)
        return mean / se if se > 0 else (math.inf if mean > 0 else 0.0)

    return {"log_likelihood_ratio_z": score(ratio), "sampler_dependence_z": score(dependence)}


def check_likelihood_consistency(pm: ProtocolModel, result, n: int, generator) -> None:
    """``likelihood_consistency`` on ``n`` of the model's own draws, recorded as a check of ``result``'s
    certificate, its two scores in the JSON extras."""
    scores = likelihood_consistency(pm, n, generator)
    dependent, ratio = scores["sampler_dependence_z"], scores["log_likelihood_ratio_z"]
    result.check("likelihood_consistency", not (dependent > 5 and ratio < 2),
                 f"likelihood_consistency: draws of sample_likelihood(z) depend on z ({dependent:.1f} standard "
                 f"errors) but log_likelihood(x, z) hardly does (its ratio at the drawing z over another z is "
                 f"{ratio:.1f} standard errors above 0): log_likelihood ignores z or scores a different model than "
                 "sample_likelihood draws from")
    result.extras.update({k: round(v, 2) if math.isfinite(v) else v for k, v in scores.items()})
