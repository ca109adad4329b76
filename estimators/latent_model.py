"""The latent units an estimator sums over, one test case at a time: ``LatentModel``.

For a model with binary latent units h and an approximate posterior Q(h | v) (SBN / fDARN with their inference
network; a DBN with its greedy up-pass; a DBM; a user's model of ``nvil.models.protocol`` with ``Latent.binary``):
log P*(v, h) and log Q(h | v) as densities over h for sequential Gibbs, exact samples from Q, and log P(v | h).
For a DBN, P* is unnormalised (Eq. 16) and every estimate subtracts the top RBM's log Z
(``nvil.estimators.log_z``).
"""

from __future__ import annotations

import torch

from nvil.core.errors import ConfigError
from nvil.estimators.exact import split_layers
from nvil.estimators.log_z import has_top_log_z
from nvil.mcmc.flip_gibbs import LogDensity
from nvil.models.binary_density import require_bernoulli_visibles
from nvil.models.protocol import (
    BINARY_LATENTS,
    CONTINUOUS_LATENTS,
    FREE_ENERGY,
    ProtocolModel,
    capable,
    follows_protocol,
    protocol_only,
)

BOLTZMANN_ESTIMATORS = "ais, smc, raise, exact or classify"
CONTINUOUS_ESTIMATORS = "ais_hmc, chib_mh or iwae"


class LatentModel:
    """Binary latent units h of an SBN, fDARN, DBN or DBM (its even hidden layers, the odd ones summed out), or of
    a user's model (``nvil.models.protocol``, ``Latent.binary``), for estimators that sum over them: log P*(v, h)
    and log Q(h | v) as densities over h for sequential Gibbs (``nvil.mcmc.flip_gibbs.site_gibbs``: structured
    ``BinaryDensity`` objects for the built-in families, the user's functions otherwise), exact draws of Q and
    log P(v | h). A user's model has Q = its ``proposal(x)``, or its prior where it gives none."""

    def __init__(self, model, inference, estimator: str) -> None:
        self.model = model
        self.protocol = None
        if protocol_only(model) and follows_protocol(model):
            self.protocol = ProtocolModel(model)
            if not self.protocol.binary:
                raise ConfigError(f"estimator={estimator} sums over binary latent units; this model's latents are "
                                  "continuous (Latent.continuous): use estimator=ais, iwae, bdmc or chib_mh")
            if not (self.protocol.has_proposal or callable(getattr(model, "sample_prior", None))):
                raise ConfigError(f"estimator={estimator} starts each chain from q(h | x) or the prior: define "
                                  "proposal(x) or sample_prior(n, generator) on the model")
            self.needs_log_z = False
            self.q = None
            return
        if capable(model, CONTINUOUS_LATENTS):
            raise ConfigError(f"estimator={estimator} sums over binary latent units; this checkpoint holds a "
                              f"{type(model).__name__} with continuous latents: use {CONTINUOUS_ESTIMATORS}")
        if capable(model, FREE_ENERGY) or not capable(model, BINARY_LATENTS):
            raise ConfigError(f"estimator={estimator} sums over one test case's latent units, and an RBM's hidden "
                              f"units are summed exactly; for model=rbm or srbm use estimator={BOLTZMANN_ESTIMATORS}")
        self.needs_log_z = has_top_log_z(model)
        self.q = model.recognition() if self.needs_log_z else inference
        if self.q is None:
            raise ConfigError(f"estimator={estimator} needs an approximate posterior Q(h | v): a model with an "
                              "inference network (sbn, fdarn), a DBN or a DBM")
        require_bernoulli_visibles(model)

    def joint(self, x: torch.Tensor):
        if self.protocol is not None:
            pm = self.protocol
            return LogDensity(lambda h: pm.log_joint(x, h), pm.n_latent)
        return self.model.latent_density(x)

    def q_density(self, x: torch.Tensor):
        if self.protocol is not None:
            return LogDensity(self._base(x).log_prob, self.protocol.n_latent)
        return self.q.latent_density(x)

    def sample_q(self, x: torch.Tensor, generator) -> torch.Tensor:
        if self.protocol is not None:
            return self._base(x).sample(1, generator)[0]
        hs, _ = self.q.sample(x, generator=generator)
        return torch.cat(hs, -1)

    def log_likelihood(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        if self.protocol is not None:
            return self.protocol.log_likelihood(x, h)
        return self.model.log_likelihood(x, split_layers(h, self.model.layers))

    def _base(self, x: torch.Tensor):
        return self.protocol.base(self.protocol.default_base(), x)
