"""Per-example estimators that sum over one test case's latent units: what they share.

For a model with binary latent units h and an approximate posterior Q(h | v) (SBN / fDARN with their
inference network; a DBN with its greedy up-pass), ``LatentModel`` gives, for a batch of v:
log P*(v, h) and log Q(h | v) as ``BinaryDensity`` objects, exact samples from Q, and log P(v | h).
For a DBN, P* is unnormalised (Eq. 16) and every estimate subtracts the top RBM's log Z, one AIS estimate
shared by all DBN estimators and cached beside the checkpoint (``estimators.log_z``).

``PerExample`` runs an estimator batched over examples x runs (chains = examples x runs, example-major),
with a generator per batch seeded by (seed, first row) so sharding the test set does not change any
example's estimate, and reports the per-run spread.
"""

from __future__ import annotations

import time

import torch

from estimators.ais import PosteriorPath, ais, schedule
from estimators.base import Result, batch_generator, chunks, combine_runs
from estimators.exact import split_layers
from models.binary_density import require_bernoulli_visibles
from models.dbn import DBN
from models.rbm import BoltzmannMachine
from nvil.config import positive_int
from nvil.data import take_rows
from nvil.errors import ConfigError

BOLTZMANN_ESTIMATORS = "ais, raise, exact or classify"
CONTINUOUS_ESTIMATORS = "ais_hmc, chib_mh or iwae"


class LatentModel:
    """Binary latent units h of an SBN, fDARN or DBN, for estimators that sum over them."""

    def __init__(self, model, inference, estimator: str) -> None:
        if getattr(model, "is_continuous_latent", False):
            raise ConfigError(f"estimator={estimator} sums over binary latent units; this checkpoint holds a "
                              f"{type(model).__name__} with continuous latents: use {CONTINUOUS_ESTIMATORS}")
        if isinstance(model, BoltzmannMachine):
            raise ConfigError(f"estimator={estimator} sums over one test case's latent units, and an RBM's hidden "
                              f"units are summed exactly; for model=rbm or srbm use estimator={BOLTZMANN_ESTIMATORS}")
        self.model = model
        self.needs_log_z = isinstance(model, DBN)
        self.q = model.recognition() if self.needs_log_z else inference
        if self.q is None:
            raise ConfigError(f"estimator={estimator} needs an approximate posterior Q(h | v): a model with an "
                              "inference network (sbn, fdarn) or a DBN")
        require_bernoulli_visibles(model)

    def joint(self, x: torch.Tensor):
        return self.model.latent_density(x)

    def q_density(self, x: torch.Tensor):
        return self.q.latent_density(x)

    def sample_q(self, x: torch.Tensor, generator) -> torch.Tensor:
        hs, _ = self.q.sample(x, generator=generator)
        return torch.cat(hs, -1)

    def log_likelihood(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return self.model.log_likelihood(x, split_layers(h, self.model.layers))


class PerExample:
    """Base class: subclasses set ``name`` and define ``run_batch(lm, x_runs, generator) -> [chains]``
    (estimates of log P*(v), one per chain)."""

    name = "per_example"
    row_offset_aware = True  # evaluate_checkpoint passes the first row's index in the whole split
    uses_log_z = True  # False where the estimate needs no normalised prior (the harmonic mean)

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.num_runs = positive_int(cfg.get("num_runs", 1), "estimator.num_runs")
        self.batch_size = positive_int(cfg.get("batch_size", 100), "estimator.batch_size")

    def latent_model(self, model, inference):
        """What ``run_batch`` works with (``LatentModel``; continuous-latent estimators override this)."""
        return LatentModel(model, inference, self.name)

    def check(self, model, inference) -> None:
        self.latent_model(model, inference)

    def dataset_inputs(self, model, data, split, rows, checkpoint=None, **_) -> dict:
        wanted = isinstance(model, DBN) and self.uses_log_z
        return {"train": data.split("train"), "checkpoint": checkpoint} if wanted else {}

    def log_z(self, lm: LatentModel, train, checkpoint, progress) -> tuple[float, float, dict]:
        """(log Z, its standard error, JSON extras); 0 for normalised models."""
        if not (lm.needs_log_z and self.uses_log_z):
            return 0.0, 0.0, {}
        from estimators.log_z import top_log_z

        if self.cfg.get("log_z") is None:
            raise ConfigError(f"estimator={self.name} on a DBN needs an estimator.log_z block (configs/log_z/ais.yaml)")
        if train is None:
            raise ConfigError(f"estimator={self.name} on a DBN needs the training data for the base-rate model")
        est, cached = top_log_z(lm.model, train, self.cfg.log_z, checkpoint, progress)
        return est.log_z, est.stderr, {**est.extras(), "log_z_cached": cached, "log_z_seconds": round(est.seconds, 3)}

    @torch.no_grad()
    def estimate(self, model, data, *, inference=None, generator=None, seed: int, progress=None, train=None,
                 checkpoint=None, row_offset: int = 0) -> Result:
        lm = self.latent_model(model, inference)
        t0 = time.perf_counter()
        show = progress is not None and not progress.disable
        log_z, log_z_se, extras = self.log_z(lm, train, checkpoint, show)
        runs = []
        for s0, s1 in chunks(data.shape[0], self.batch_size):
            x = take_rows(data, s0, s1)
            g = batch_generator(seed, row_offset + s0, x.device)
            log_p = self.run_batch(lm, x.repeat_interleave(self.num_runs, 0), g)
            runs.append(log_p.double().view(-1, self.num_runs).cpu())
            if progress is not None:
                progress.update(s1 - s0)
        per_run = torch.cat(runs) - log_z  # [examples, runs]
        return Result(self.name, self.combine(per_run), time.perf_counter() - t0, seed,
                      {**self.settings(), **extras}, shared_stderr=log_z_se, run_log_p=per_run.T.contiguous())

    def combine(self, per_run: torch.Tensor) -> torch.Tensor:
        return combine_runs(per_run)

    def settings(self) -> dict:
        return {}

    def run_batch(self, lm: LatentModel, x: torch.Tensor, generator) -> torch.Tensor:
        raise NotImplementedError


class AISPosterior(PerExample):
    """``estimator=ais_posterior``: per test case, AIS from Q(h | v) to P(h | v) (Murray & Salakhutdinov 2009,
    Sec. 2.3) with sequential Gibbs at each beta. Each run's exp(log w) is unbiased for sum_h P*(v, h)."""

    name = "ais_posterior"

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.num_betas = positive_int(cfg.get("num_betas"), "estimator.num_betas")
        self.betas = schedule(cfg.get("schedule", "linear"), self.num_betas)

    def settings(self) -> dict:
        return {"num_betas": self.num_betas, "schedule": self.cfg.get("schedule", "linear")}

    def run_batch(self, lm: LatentModel, x: torch.Tensor, generator) -> torch.Tensor:
        path = PosteriorPath(lm.joint(x), lm.q_density(x))
        log_w, _ = ais(path, path.state(lm.sample_q(x, generator)), self.betas, generator)
        return log_w
