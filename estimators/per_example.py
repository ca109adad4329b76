"""Per-example estimators that sum over one test case's latent units: what they share.

For a model with binary latent units h and an approximate posterior Q(h | v) (SBN / fDARN with their
inference network; a DBN with its greedy up-pass), ``nvil.estimators.latent_model.LatentModel`` gives, for a batch of v:
log P*(v, h) and log Q(h | v) as ``BinaryDensity`` objects, exact samples from Q, and log P(v | h).
For a DBN, P* is unnormalised (Eq. 16) and every estimate subtracts the top RBM's log Z, one AIS estimate
shared by all DBN estimators and cached beside the checkpoint (``nvil.estimators.log_z``).

``PerExample`` runs an estimator batched over examples x runs (chains = examples x runs, example-major),
with a generator per batch seeded by (seed, first row) so sharding the test set does not change any
example's estimate, and reports the per-run spread. Every example of a batch is worked on at once, so each
``run_batch`` advances the progress bar in fractions of its batch (``BatchProgress``: after every sweep or AIS
step), and the log Z phase names itself on the bar's description.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

import torch

from nvil.backend.accel import check_mode
from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.data import take_rows
from nvil.estimators.base import (
    NO_PROGRESS,
    BatchProgress,
    Estimator,
    Result,
    batch_generator,
    check_rows,
    check_seed,
    chunks,
    combine_runs,
    phase_namer,
    shows_progress,
)
from nvil.estimators.reverse_starts import stored_particles
from nvil.estimators.latent_model import BOLTZMANN_ESTIMATORS, LatentModel  # noqa: F401 (used by importers)
from nvil.estimators.log_z import apply_log_z, has_top_log_z, top_log_z
from nvil.estimators.protocol_view import eval_mode
from nvil.estimators.settings import LogZSettings

def monte_carlo_band(mean_log_p: float, w: torch.Tensor, band: list | None = None) -> list:
    """The interval printed for the test mean of log p(v) from importance-weight runs w [examples, runs] (each row
    scaled by its largest weight): per example, the delta method gives log Z_hat_i's variance
    s_i^2 = var_r(w_ir) / (R mean_r(w_ir)^2) and its Jensen bias, about -s_i^2 / 2; the mean over n examples is
    within 3 sqrt(sum_i s_i^2) / n of its expectation, which is sum_i s_i^2 / (2 n) below the truth. So the band
    runs from 3 sigma below to 3 sigma plus the bias above ``mean_log_p``; with ``band`` (the log Z band's
    [low, high] for the mean), that band is widened by the same amounts. An open end (None) stays open."""
    w = w.double()
    runs = w.shape[1]
    mean = w.mean(1).clamp(min=1e-300)
    rel_var = (w.var(1) / runs / mean**2).nan_to_num(0.0)
    n = w.shape[0]
    sigma = math.sqrt(float(rel_var.sum())) / n
    bias = float(rel_var.sum()) / (2 * n)
    lo, hi = band if band is not None else (mean_log_p, mean_log_p)
    return [None if lo is None else round(lo - 3 * sigma, 4), None if hi is None else round(hi + 3 * sigma + bias, 4)]


def widen_band(result: Result, w: torch.Tensor) -> None:
    """``mean_log_p_band`` from the runs' Monte Carlo error (``monte_carlo_band``), over a log Z band already there."""
    if math.isfinite(result.mean_log_p):
        result.extras["mean_log_p_band"] = monte_carlo_band(result.mean_log_p, w,
                                                            result.extras.get("mean_log_p_band"))


class PerExample(Estimator):
    """Base class: subclasses set ``name`` and define ``run_batch(lm, x_runs, generator, progress) -> [chains]``
    (estimates of log P*(v), one per chain), advancing ``progress`` (the batch's ``BatchProgress``) as it works."""

    name = "per_example"
    row_offset_aware = True  # evaluate_checkpoint passes the first row's index in the whole split
    uses_log_z = True  # False where the estimate needs no normalised prior (the harmonic mean)
    importance_runs = False  # True where each run's exp(estimate) is an importance weight (AIS): per-example ESS
    runs_name = "num_runs"  # what the subclass's settings call its runs per example (errors and the JSON line)

    def __init__(self, *, num_runs: int = 1, batch_size: int = 100, accel: str = "none",
                 log_z: LogZSettings | Mapping | None = None, min_example_ess: float | None = None) -> None:
        """``num_runs``: independent runs per example (chains = batch_size x num_runs); ``batch_size``: examples
        per batch; ``accel``: the sequential-Gibbs sweeps (none | native | auto | compile,
        ``nvil.mcmc.sequential_gibbs``); ``log_z``: a DBN's top-RBM log Z (``LogZSettings`` or a mapping of its
        fields; None: the estimator takes none); ``min_example_ess``: importance-weight runs only, the per-example
        ESS below which the certificate fails (None: max(1.5, 0.2 num_runs))."""
        self.num_runs = positive_int(num_runs, f"estimator.{self.runs_name}")
        self.batch_size = positive_int(batch_size, "estimator.batch_size")
        self.accel = check_mode(accel, None, "estimator.accel")
        self.log_z_settings = None if log_z is None else LogZSettings.of(log_z)
        self.min_example_ess = (None if min_example_ess is None
                                else positive_float(min_example_ess, "estimator.min_example_ess"))

    def latent_model(self, model, inference):
        """What ``run_batch`` works with (``LatentModel``; continuous-latent estimators override this)."""
        return LatentModel(model, inference, self.name)

    def check(self, model, inference=None) -> None:
        self.latent_model(model, inference)

    def dataset_inputs(self, model, data, split, rows, checkpoint=None, payload=None, **_) -> dict:
        if not (has_top_log_z(model) and self.uses_log_z):
            return {}
        return {"train": data.split("train"), "checkpoint": checkpoint,
                "log_z_particles": stored_particles(payload, model.top.n_visible)}

    def log_z(self, lm: LatentModel, train, checkpoint, progress, particles=None, phase=None):
        """(the top RBM's ``CertifiedLogZ``, whether it was cached), or None for normalised models. ``progress``:
        inner bars for its AIS runs; ``phase(text)`` names each phase of it on the evaluation bar."""
        if not (lm.needs_log_z and self.uses_log_z):
            return None
        if self.log_z_settings is None:
            raise ConfigError(f"estimator={self.name} on a {type(lm.model).__name__} needs an estimator.log_z block (configs/log_z/ais.yaml)")
        if train is None:
            raise ConfigError(f"estimator={self.name} on a {type(lm.model).__name__} needs train= (the training rows): its log Z "
                              "starts from base rates of the training data passed up the net")
        return top_log_z(lm.model, train, self.log_z_settings, checkpoint, progress, particles, phase=phase)

    @torch.no_grad()
    def estimate(self, model, data, *, inference=None, seed: int = 0, generator=None, progress=None, train=None,
                 checkpoint=None, row_offset: int = 0, log_z_particles=None) -> Result:
        """log P(v) for each row of ``data`` [examples, model.n_visible]. ``inference``: Q(h | v) of an SBN or
        fDARN (a DBN uses its greedy up-pass). Each batch draws from a generator seeded by (``seed``, first row +
        ``row_offset``), so ``generator`` is not used. A DBN's top-RBM log Z needs ``train`` (training rows for its
        base rate), is cached beside ``checkpoint`` and starts its reverse run from ``log_z_particles``."""
        lm = self.latent_model(model, inference)
        check_rows(model, data)
        with eval_mode(model):
            return self._estimate(lm, model, data, seed, progress, train, checkpoint, row_offset, log_z_particles)

    def _estimate(self, lm, model, data, seed, progress, train, checkpoint, row_offset, log_z_particles) -> Result:
        check_seed(seed)
        t0 = time.perf_counter()
        certificate = self.log_z(lm, train, checkpoint, shows_progress(progress), log_z_particles,
                                 phase_namer(progress, self.name))
        if certificate is not None and shows_progress(progress) and hasattr(progress, "reset"):
            progress.reset()  # the rate and ETA from here on are the examples' own, not diluted by the log Z phase
        log_z, log_z_se = (0.0, 0.0) if certificate is None else (certificate[0].log_z, certificate[0].stderr)
        runs = []
        for s0, s1 in chunks(data.shape[0], self.batch_size):
            x = take_rows(data, s0, s1)
            g = batch_generator(seed, row_offset + s0, x.device)
            share = BatchProgress(progress, s1 - s0)
            log_p = self.run_batch(lm, x.repeat_interleave(self.num_runs, 0), g, share)
            runs.append(log_p.double().view(-1, self.num_runs).cpu())
            share.finish()
        per_run = torch.cat(runs) - log_z  # [examples, runs]
        result = Result(self.name, self.combine(per_run), time.perf_counter() - t0, seed, dict(self.settings()),
                        shared_stderr=log_z_se, run_log_p=per_run.T.contiguous(),
                        runs_name=self.runs_name)
        if certificate is not None:
            apply_log_z(result, *certificate)
        self.certify(result, per_run)
        return result

    def certify(self, result: Result, per_run: torch.Tensor) -> None:
        """The per-example checks: no example estimated at p(v) = 0; with importance-weight runs (AIS), each
        example's ESS over its runs, (sum w)^2 / sum w^2, at least ``min_example_ess``; and the spread of the
        test-set mean over runs no larger than the reported SE suggests (the Monte Carlo error of the mean of R
        runs is about run_spread / sqrt(R), which the standard error over examples already contains)."""
        n, runs = per_run.shape
        zero = torch.isneginf(result.log_p)
        result.check("nonzero_estimates", not bool(zero.any()),
                     f"{int(zero.sum())} of {n} examples were estimated at p(v) = 0 (every run of each, e.g. rejected "
                     f"back onto h*; first: example {int(zero.nonzero()[0]) if zero.any() else -1}): their log p is "
                     "-infinity, so the mean is not a number; use more runs, steps or an adapted step size")
        if runs < 2:
            return
        if self.importance_runs:
            w = torch.exp(per_run - per_run.max(1, keepdim=True).values).nan_to_num(0.0)
            ess = w.sum(1) ** 2 / (w**2).sum(1).clamp(min=1e-300)
            threshold = self.min_example_ess if self.min_example_ess is not None else max(1.5, 0.2 * runs)
            low = ess < threshold
            q = torch.quantile(ess, torch.tensor([0.1, 0.5], dtype=ess.dtype)).tolist()
            result.extras.update({"example_ess_min_q10_q50": [round(ess.min().item(), 2)] + [round(v, 2) for v in q],
                                  "low_ess_examples": int(low.sum())})
            result.check("example_ess", not bool(low.any()),
                         f"{int(low.sum())} of {n} examples have an ESS over their {runs} runs below {threshold:g} "
                         f"(lowest {ess.min().item():.2f}, example {int(ess.argmin())}): their estimates rest on one "
                         "run; use more betas or runs")
            widen_band(result, w)
        finite = torch.isfinite(per_run).all(0)
        if finite.sum() >= 2 and math.isfinite(result.stderr_examples):
            spread = per_run[:, finite].double().mean(0).std().item()
            result.check("run_spread", spread / math.sqrt(runs) <= max(result.stderr_examples, 1e-12),
                         f"the spread of the test-set mean over {runs} runs ({spread:.3f}) is larger than the "
                         f"reported standard error ({result.stderr_examples:.3f}) x sqrt({runs}) suggests: the Monte "
                         "Carlo error dominates and may be heavy-tailed; use more runs or steps")

    def combine(self, per_run: torch.Tensor) -> torch.Tensor:
        return combine_runs(per_run)

    def settings(self) -> dict:
        return {}

    def run_batch(self, lm: LatentModel, x: torch.Tensor, generator,
                  progress: BatchProgress = NO_PROGRESS) -> torch.Tensor:
        raise NotImplementedError
