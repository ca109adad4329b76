"""The estimators on a user's model (``nvil.models.protocol``) that need no Markov chain, and what every estimator on
such a model shares:

- ``ModelIWAE``: Burda et al. 2016's L_K = log (1/K) sum_k p(x, z_k) / q(z_k | x), z_k from the proposal or the
  prior, a stochastic lower bound on log p(x) (``bound="elbo"``: the mean of the K log weights instead, the ELBO);
  ``estimator=iwae`` and ``elbo`` hand every model that follows the protocol and has no inference network of its
  own (a user's model, the VAE, the Gaussian nets) to it; batched over examples x samples, each batch drawing from
  a generator seeded by (seed, first row).

(Exact enumeration of a protocol model's binary latent is ``estimator=exact`` itself, ``nvil.estimators.exact``.)
"""

from __future__ import annotations

import contextlib
import time
import zlib

import torch

from nvil.core.config import positive_int
from nvil.core.errors import ConfigError
from nvil.core.ops import StreamingLogMeanExp, StreamingMean, chunks
from nvil.estimators.base import BatchProgress, Estimator, Result, batch_generator, check_seed
from nvil.models.protocol import ProtocolModel

MAX_PAIRS = 2**15  # (x, z) pairs per call of the user's functions in iwae
STARTS = (None, "prior", "proposal")


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
        raise ConfigError(f"start must be prior or proposal (None: the proposal where the model has one), got {start!r}")


# ---- iwae ------------------------------------------------------------------------------------------------------


class ModelIWAE(Estimator):
    """``estimator=iwae`` on a model seen through the protocol: L_K with K = ``num_samples`` draws from ``start``
    (prior | proposal; None: the proposal where the model defines one); ``bound="elbo"``: the mean of the K log
    weights (``estimator=elbo``)."""

    name = "iwae"
    row_offset_aware = True
    WORDING = {"iwae": "stochastic lower bound: E[estimate] <= log p(x), tight as num_samples grows",
               "elbo": "stochastic lower bound: E[estimate] = ELBO = log p(x) - KL(q(z | x) || p(z | x)); more "
                       "samples lower its variance, not its gap"}

    def __init__(self, *, num_samples: int = 1000, start: str | None = None, batch_size: int = 100,
                 max_pairs: int = MAX_PAIRS, bound: str = "iwae") -> None:
        if bound not in self.WORDING:
            raise ConfigError(f"unknown bound {bound!r}; known bounds: {', '.join(self.WORDING)}")
        self.name = bound
        self.num_samples = positive_int(num_samples, "estimator.num_samples")
        check_start(start)
        self.start = start
        self.batch_size = positive_int(batch_size, "estimator.batch_size")
        self.max_pairs = positive_int(max_pairs, "estimator.max_pairs")

    def check(self, model, inference=None) -> None:
        protocol(model)

    @torch.no_grad()
    def estimate(self, model, x, *, seed: int = 0, progress=None, row_offset: int = 0, **_) -> Result:
        pm = protocol(model)
        check_data(x)
        check_seed(seed)
        start = self.start or pm.default_base()
        t0 = time.perf_counter()
        out = []
        with eval_mode(pm):
            for s0, s1 in chunks(x.shape[0], self.batch_size):
                xb = x[s0:s1]
                g = batch_generator(seed, row_offset + s0, x.device)
                base = pm.base(start, xb)
                share = BatchProgress(progress, s1 - s0, self.num_samples)
                acc = StreamingLogMeanExp() if self.name == "iwae" else StreamingMean()
                for k0, k1 in chunks(self.num_samples, max(1, self.max_pairs // xb.shape[0])):
                    k = k1 - k0
                    z = base.sample(k, g)  # [k, B, D]
                    log_joint = pm.log_joint(expand_rows(xb, k), z.reshape(k * xb.shape[0], -1)).view(k, -1)
                    acc.update(log_joint.double() - base.log_prob(z).double(), dim=0)
                    share.advance(k)
                out.append(acc.result().cpu())
                share.finish()
        return Result(self.name, torch.cat(out), time.perf_counter() - t0, seed,
                      {"num_samples": self.num_samples, "proposal": start, "bound": self.WORDING[self.name]})
