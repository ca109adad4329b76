"""The training loop: steps, validation with early stopping, atomic checkpoints, logging, resume.

Read ``fit`` top to bottom: build the run (``nvil.app.build``) or restore it (``nvil.app.resume``), then one flat loop over
steps, whose parts are the named helpers below it. Every learner plugs in through ``nvil.learners.base.Learner``:
``step(batch, diagnostics) -> metrics``, ``learner_state()`` / ``load_learner_state()`` and the hooks the loop
calls (``validate``, ``image_grids``, ``distribute``).

Under torchrun (``nvil.core.distributed``) every rank runs this same loop on its share of each minibatch; learners
that run data-parallel also have ``distribute`` and ``rank_state`` / ``load_rank_state``. Rank 0 alone
validates (and tells the others the outcome), logs, and writes checkpoints, which hold every rank's state.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from nvil.app.build import Run, build, set_threads
from nvil.app.divergence import DivergenceMonitor, kept, score_floor
from nvil.app.interrupt import StopRequest, stopped
from nvil.app.logging import NullLogger, RunLogger, storage_faults_reported
from nvil.app.resume import remove_orphans, restore, resumes
from nvil.app.snapshot import LoopState, write_checkpoint
from nvil.backend import gemm
from nvil.backend.cpu_kernels import capability
from nvil.backend.denormals import flushed_denormals
from nvil.backend.threads import restored_threads
from nvil.core import distributed
from nvil.core.config import positive_float, positive_int, resolve_device
from nvil.core.errors import ConfigError, TrainingDiverged
from nvil.core.files import writing
from nvil.core.ops import to_floats
from nvil.data import MinibatchStream, take_rows
from nvil.estimators.validation import score_tag, validate
from nvil.learners.diagnostics import log_gradient_diagnostics

# What the progress bar shows, the first that the learner reports.
PROGRESS_KEYS = ("train/elbo", "train/log_p_exact_batch", "train/free_energy_gap", "train/log_joint")
log = logging.getLogger("nvil")


def check_trainer_config(t) -> dict:
    for key in ("max_steps", "batch_size", "log_every", "val_every", "ckpt_every", "sample_every",
                "val_num_examples", "val_num_samples"):
        positive_int(t.get(key), f"trainer.{key}")
    positive_int(t.get("val_ais_betas", 100), "trainer.val_ais_betas")
    positive_int(t.get("patience"), "trainer.patience", allow_none=True)
    diag = {"every": positive_int(t.get("grad_diag_every"), "trainer.grad_diag_every", allow_none=True)}
    for key, default in (("repeats", 50), ("examples", 100)):  # runs saved before the settings existed: 50, 100
        n = diag[key] = positive_int(t.get(f"grad_diag_{key}", default), f"trainer.grad_diag_{key}")
        if n < 2:
            raise ConfigError(f"trainer.grad_diag_{key} must be at least 2 (a variance needs two draws), got {n}")
    for key in (k for k in ("divergence", "regression") if t.get(k) is not None):
        positive_float(t.get(key), f"trainer.{key}")
    return diag  # log_gradient_diagnostics' keywords, as plain values


def fit(cfg, run_dir: Path, check=None, accepted=None) -> dict:
    """Train the configured model and learner in ``run_dir``; return the final metrics. ``check(model,
    inference, data)``, if given, runs once the model is built and before any step (train.py: the final evaluation
    accepts this model); ``accepted()`` once every check has passed, before anything is written (train.py records
    the command in ``.hydra/``). Denormals are flushed from the start (``trainer.flush_denormal``,
    nvil/backend/denormals.py)."""
    with flushed_denormals(cfg.trainer.get("flush_denormal", True)), restored_threads():
        return _fit(cfg, run_dir, check, accepted)


def _fit(cfg, run_dir: Path, check, accepted) -> dict:
    t = cfg.trainer
    diag = check_trainer_config(t)
    d = distributed.setup()
    device = distributed.rank_device(resolve_device(t.device), d)
    rows = distributed.local_rows(t.batch_size, d, "trainer.batch_size")  # this rank's share of each minibatch
    run_dir = Path(run_dir)
    last_path = run_dir / "checkpoints" / "last.pt"
    resume = resumes(cfg, run_dir, last_path)
    run = build(cfg, device, check)
    set_threads(run, cfg, rows.stop - rows.start)
    distribute(run, cfg.learner.name, d, device)
    monitor = DivergenceMonitor(t.get("divergence", 20.0), t.get("regression", 10.0),
                                floor=score_floor(run.data, t.get("divergence_floor", 10.0)))
    resolved = OmegaConf.to_container(cfg, resolve=True)
    state = LoopState(**restore(last_path, resolved, run, monitor, device, d)) if resume else LoopState()
    tag = validation_tag(run, cfg)
    open_run_dir(cfg, run_dir, resume, state.step, d, accepted, started=time.time())
    with distributed.collective_timeout(positive_float(t.get("dist_timeout", 300), "trainer.dist_timeout"), d), \
            storage_faults_reported():
        return _train(cfg, run, state, monitor, resolved, tag, d, device, rows, diag, run_dir)


def _train(cfg, run: Run, state: LoopState, monitor: DivergenceMonitor, resolved: dict, tag: str | None,
           d: distributed.Dist, device, rows: slice, diag: dict, run_dir: Path) -> dict:
    t = cfg.trainer
    last_path, best_path = run_dir / "checkpoints" / "last.pt", run_dir / "checkpoints" / "best.pt"
    stream = MinibatchStream(run.data, t.batch_size, cfg.seed)
    valid = take_rows(run.data.split("valid"), 0, t.val_num_examples)
    train_subset = take_rows(run.data.split("train"), 0, t.val_num_examples)
    logger = RunLogger(run_dir, enabled=bool(t.tensorboard)) if d.is_main else NullLogger()
    checkpoint = partial(write_checkpoint, run=run, state=state, monitor=monitor, resolved=resolved, d=d,
                         last_path=last_path)
    bar = tqdm(total=t.max_steps, initial=state.step, disable=not (t.progress and d.is_main), dynamic_ncols=True,
               desc=f"{cfg.learner.name} {cfg.model.name}", unit="step")
    # plain ints: a DictConfig read is slow beside a fused NVIL step at batch 20
    max_steps, log_every, val_every, sample_every, ckpt_every = (
        int(t[k]) for k in ("max_steps", "log_every", "val_every", "sample_every", "ckpt_every"))
    started, first_step = time.perf_counter(), state.step
    latest: dict[str, float] = {}
    stop = StopRequest()
    try:
        with torch.autograd.detect_anomaly() if t.get("detect_anomaly", False) else nullcontext():
            while state.step < max_steps and not state.stopped_early:
                signum = stop.requested(state.step, d)
                if signum:
                    checkpoint(last_path)
                    stopped(stop, signum, state.step, last_path, run_dir, d)
                log_now = (state.step + 1) % log_every == 0 or state.step == 0  # step 1: the divergence reference
                metrics = train_step(run.learner, stream, state.step, rows, log_now)
                state.step += 1
                bar.update(1)
                done = state.step == max_steps
                if log_now:
                    latest = checked_scores(metrics, state.step, monitor, d, last_path)
                    log_training(logger, bar, state.step, latest, first_step, started)
                log_gradient_diagnostics(logger, run, state.step, seed=cfg.seed, device=device, **diag)
                if (state.step % val_every == 0 or done) and tag is None:  # e.g. greedy DBN: no single score
                    logger.scalars(state.step, run.learner.validate(valid, train_subset))
                elif state.step % val_every == 0 or done:
                    scores = validation_scores(run, valid, train_subset, t, cfg.seed, d)
                    if keep_best(state, tag, scores, t.patience, monitor, last_path, logger, bar):
                        checkpoint(best_path)
                last_step = done or state.stopped_early or stop.signum is not None
                if (state.step % sample_every == 0 or last_step) and run.data.image_shape is not None and d.is_main:
                    log_image_grids(logger, run, cfg.seed, device, state.step)
                if state.step % ckpt_every == 0 or done or state.stopped_early:
                    checkpoint(last_path)
            if stop.signum is not None and not d.enabled:  # a signal during the last step: its checkpoint is saved
                stopped(stop, stop.signum, state.step, last_path, run_dir, d, last=True)
    finally:
        stop.restore()
        bar.close()
        logger.close()
    if d.enabled:
        distributed.barrier()  # rank 0's last checkpoint is on disk before any rank reads it
    log.info("finished at step %d%s", state.step, " (stopped early)" if state.stopped_early else "")
    return final_metrics(state, tag, latest, first_step, started, best_path if best_path.exists() else last_path)


# ---- setting up ----------------------------------------------------------------------------------------
def distribute(run: Run, name: str, d: distributed.Dist, device: torch.device) -> None:
    """Under torchrun: the learner's gradients (and any state it shares) are averaged over the ranks."""
    if not d.enabled:
        return
    if not run.learner.supports_data_parallel:
        raise ConfigError(f"learner={name} does not run data-parallel; train it in one process "
                          "(python train.py, not torchrun)")
    run.learner.distribute(d, device)


def open_run_dir(cfg, run_dir: Path, resumed: bool, step: int, d: distributed.Dist, accepted=None,
                 started: float = 0.0) -> None:
    """Once the run is accepted (``accepted()``, rank 0): say what runs, remove the temporary checkpoint files older
    than ``started`` (left by a writer that was killed), and save the resolved config as ``config.yaml``."""
    if not d.is_main:
        return
    with writing(run_dir, "the run directory", "choose a writable hydra.run.dir"):
        if accepted is not None:
            accepted()
        if resumed:
            log.info("resumed %s from step %d", run_dir, step)
            for tmp in remove_orphans(run_dir / "checkpoints", started):
                log.info("removed %s, left by a writer that was stopped", tmp)
        else:
            log.info("new run in %s: model=%s learner=%s data=%s, %d steps", run_dir, cfg.model.name,
                     cfg.learner.name, cfg.data.name, cfg.trainer.max_steps)
        run_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)


def validation_tag(run: Run, cfg) -> str | None:
    """The validation score early stopping keeps the best of; None for a learner with its own ``validate``
    (greedy DBN training), which has no single score."""
    tag = None if run.learner.has_own_validation else score_tag(run.model, run.inference)
    if tag is None and cfg.trainer.patience is not None:
        raise ConfigError(f"trainer.patience needs a validation score, and learner={cfg.learner.name} has none "
                          "(set trainer.patience=null)")
    return tag


# ---- one step --------------------------------------------------------------------------------------------
def train_step(learner, stream: MinibatchStream, step: int, rows: slice, diagnostics: bool) -> dict:
    """One update on this rank's share of minibatch ``step``; a learner with per-example state (MCEM's
    persistent chains) is told which training rows it holds."""
    x = stream.batch(step)[rows]
    extra = {"indices": stream.indices(step)[rows]} if learner.per_example_state else {}
    return learner.step(x, diagnostics=diagnostics, **extra)


def checked_scores(metrics: dict, step: int, monitor: DivergenceMonitor, d: distributed.Dist,
                   last_path: Path) -> dict[str, float]:
    """A logging step's metrics as floats; refused (``TrainingDiverged``) when one is not finite or a score has
    fallen far below its range so far (``nvil.app.divergence``)."""
    latest = to_floats(metrics)
    if d.enabled:  # every rank then sees the same values, so every rank stops together on a NaN
        latest = distributed.average_metrics(latest)
    if not all(map(math.isfinite, latest.values())):
        bad = sorted(k for k, v in latest.items() if not math.isfinite(v))
        raise TrainingDiverged(f"training diverged at step {step}: {', '.join(bad[:3])} not "
                               f"finite; {kept(last_path)} (try a smaller learner.lr)")
    diverged = monitor.check(latest)
    if diverged:
        raise TrainingDiverged(f"training diverged at step {step}: {diverged}; {kept(last_path)} "
                               "(try a smaller learner.lr; trainer.divergence_floor=null and trainer.divergence=null "
                               "turn these checks off)")
    return latest


def log_training(logger, bar: tqdm, step: int, latest: dict[str, float], first_step: int, started: float) -> None:
    """Log a step's scalars (``latest`` gains ``train/steps_per_second`` since ``first_step``, timed from ``started``)
    and show one in the progress bar."""
    latest["train/steps_per_second"] = (step - first_step) / (time.perf_counter() - started)
    logger.scalars(step, latest)
    shown = next((k for k in PROGRESS_KEYS if k in latest), None)
    if shown:
        bar.set_postfix({shown.split("/")[1]: f"{latest[shown]:.2f}"})


# ---- validation and early stopping -------------------------------------------------------------------------
def validation_scores(run: Run, valid: torch.Tensor, train_subset: torch.Tensor, t, seed: int,
                      d: distributed.Dist) -> dict[str, float]:
    scores = validate(run.model, run.inference, valid, train_subset, t.val_num_samples, seed,
                      ais_betas=t.get("val_ais_betas", 100)) if d.is_main else None
    if d.enabled:  # rank 0's scores decide early stopping and best checkpoints on every rank
        scores = distributed.broadcast(scores)
    return scores


def keep_best(state: LoopState, tag: str, scores: dict[str, float], patience: int | None,
              monitor: DivergenceMonitor, last_path: Path, logger, bar: tqdm) -> bool:
    """Record a validation in ``state`` (best score, early stopping after ``patience`` validations without
    improvement) and in the logs; whether it is the best so far, so the caller saves it."""
    score = scores[tag]
    if not math.isfinite(score):
        raise TrainingDiverged(f"training diverged by step {state.step}: the validation score {tag} is {score}; "
                               f"{kept(last_path)} (try a smaller learner.lr, and check the data for non-finite values)")
    diverged = monitor.check(scores)
    if diverged:
        raise TrainingDiverged(f"training diverged by step {state.step}: {diverged}; "
                               f"{kept(last_path)} (try a smaller learner.lr)")
    log.info("step %d: %s = %.4f%s", state.step, tag, score, " (best)" if score > state.best_score else "")
    regression = monitor.regression(tag, score, state.best_score, state.best_step)
    if regression:
        state.regressions += 1
        log.warning("step %d: %s", state.step, regression)
    improved = score > state.best_score
    if improved:
        state.best_score, state.best_step, state.evals_without_improvement = score, state.step, 0
    else:
        state.evals_without_improvement += 1
        if patience is not None and state.evals_without_improvement >= patience:
            state.stopped_early = True
    logger.scalars(state.step, {**scores, f"{tag}_best": state.best_score})
    bar.set_postfix(val=f"{score:.2f}")
    return improved


# ---- images, checkpoints, the result ---------------------------------------------------------------------
@torch.no_grad()
def log_image_grids(logger, run: Run, seed: int, device, step: int) -> None:
    """The learner's grids: the model's ancestral samples, or a Boltzmann machine's particles, tempered-transition
    runs and filters."""
    for image_tag, images in run.learner.image_grids(seed, device).items():
        logger.image_grid(image_tag, images, step, run.data.image_shape)


def final_metrics(state: LoopState, tag: str | None, latest: dict[str, float], first_step: int, started: float,
                  checkpoint: Path) -> dict:
    return {
        "step": state.step, "best_step": state.best_step, "val/tag": tag, "val/best": state.best_score,
        "stopped_early": state.stopped_early, "val/regressions": state.regressions,
        # the last logged training scores, whatever the learner reports (train/elbo, train/log_joint, ...)
        **{k: v for k, v in latest.items() if k.startswith("train/") and k != "train/steps_per_second"},
        "steps_per_second": (state.step - first_step) / max(time.perf_counter() - started, 1e-9),
        "seconds": round(time.perf_counter() - started, 1),  # this process's training time (a resume counts its own)
        "cpu_kernels": capability(), "threads": torch.get_num_threads(),  # torch's CPU kernel set, intra-op threads
        "gemm": gemm.backend(),  # whose float32 products (nvil/backend/gemm.py)
        "checkpoint": str(checkpoint),
    }
