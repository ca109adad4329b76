"""The training loop: steps, validation with early stopping, atomic checkpoints, logging, resume.

Read top to bottom: set up (or restore) the run, then one flat loop over steps. Every learner plugs in
through ``step(batch, diagnostics) -> metrics`` and ``learner_state()`` / ``load_learner_state()``.

Under torchrun (``nvil.distributed``) every rank runs this same loop on its share of each minibatch; learners
that run data-parallel also have ``distribute`` and ``rank_state`` / ``load_rank_state``. Rank 0 alone
validates (and tells the others the outcome), logs, and writes checkpoints, which hold every rank's state.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from models import build_model
from nvil import distributed
from nvil.accel import accelerate_learner
from nvil.checkpoint import load_checkpoint, load_module_state, save_checkpoint
from nvil.config import positive_float, positive_int, resolve_device
from nvil.data import MinibatchStream, build_model_data, check_model_fits_data, take_rows
from nvil.divergence import DivergenceMonitor
from nvil.errors import CheckpointError, ConfigError, Interrupted, TrainingDiverged
from nvil.learners import build_learner
from nvil.logging import NullLogger, RunLogger, to_floats
from nvil.resume import resume_requested
from nvil.validation import score_tag, validate

# What the progress bar shows, the first that the learner reports.
PROGRESS_KEYS = ("train/elbo", "train/log_p_exact_batch", "train/free_energy_gap", "train/log_joint")
# Sections of the config a resumed run must share with the run that wrote the checkpoint.
RESUME_MUST_MATCH = ("model", "learner", "data", "seed")
log = logging.getLogger("nvil")


@dataclass
class LoopState:
    step: int = 0
    best_score: float = -math.inf
    best_step: int = -1
    evals_without_improvement: int = 0
    stopped_early: bool = False


def check_trainer_config(t) -> None:
    for key in ("max_steps", "batch_size", "log_every", "val_every", "ckpt_every", "sample_every",
                "val_num_examples", "val_num_samples"):
        positive_int(t.get(key), f"trainer.{key}")
    positive_int(t.get("val_ais_betas", 100), "trainer.val_ais_betas")
    positive_int(t.get("patience"), "trainer.patience", allow_none=True)
    if t.get("divergence") is not None:
        positive_float(t.get("divergence"), "trainer.divergence")


def fit(cfg, run_dir: Path, check=None) -> dict:
    """Train the configured model and learner in ``run_dir``; return the final metrics. ``check(model,
    inference, data)``, if given, runs once the model is built and before any step (train.py: the final evaluation
    accepts this model)."""
    t = cfg.trainer
    check_trainer_config(t)
    d = distributed.setup()
    device = distributed.rank_device(resolve_device(t.device), d)
    rows = distributed.local_rows(t.batch_size, d, "trainer.batch_size")  # this rank's share of each minibatch
    run_dir = Path(run_dir)
    ckpt_dir = run_dir / "checkpoints"
    last_path, best_path = ckpt_dir / "last.pt", ckpt_dir / "best.pt"
    resume = resume_requested(cfg, last_path)
    if last_path.exists() and not resume:
        raise ConfigError(f"{run_dir} already holds a run; pass trainer.resume=true to continue it, "
                          "or choose another hydra.run.dir")
    if resume and not last_path.exists():
        raise ConfigError(f"trainer.resume=true but there is no checkpoint at {last_path}")

    # ---- build everything -----------------------------------------------------------------------
    torch.manual_seed(cfg.seed)
    data = build_model_data(cfg.data, cfg.model, device)
    model, inference = build_model(cfg.model, data.dim)
    check_model_fits_data(model, data)
    if check is not None:
        check(model, inference, data)
    model.to(device)
    model.init_visible_bias(data.train_mean())
    if inference is not None:
        inference.to(device)
        inference.set_input_mean(data.train_mean())
    learner = build_learner(cfg.learner, model, inference, device, distributed.rank_seed(cfg.seed, d))
    accelerate_learner(learner, t.get("accel", "none"), device)
    if hasattr(learner, "bind_data"):  # per-example state (MCEM's persistent chains), sized before a resume
        learner.bind_data(data.split("train"))
    if d.enabled:
        if not hasattr(learner, "distribute"):
            raise ConfigError(f"learner={cfg.learner.name} does not run data-parallel; train it in one process "
                              "(python train.py, not torchrun)")
        learner.distribute(d, device)
    state = LoopState()
    monitor = DivergenceMonitor(t.get("divergence", 20.0))
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if resume:
        state = _restore(last_path, resolved, model, inference, learner, monitor, device, d)
        log.info("resumed %s from step %d", run_dir, state.step)
    else:
        log.info("new run in %s: model=%s learner=%s data=%s, %d steps", run_dir, cfg.model.name,
                 cfg.learner.name, cfg.data.name, t.max_steps)
    if d.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)

    stream = MinibatchStream(data, t.batch_size, cfg.seed)
    valid = take_rows(data.split("valid"), 0, t.val_num_examples)
    train_subset = take_rows(data.split("train"), 0, t.val_num_examples)
    # A learner with its own ``validate`` (greedy DBN training) has no score to keep the best of.
    tag = None if hasattr(learner, "validate") else score_tag(model, inference)
    if tag is None and t.patience is not None:
        raise ConfigError(f"trainer.patience needs a validation score, and learner={cfg.learner.name} has none "
                          "(set trainer.patience=null)")
    logger = RunLogger(run_dir, enabled=bool(t.tensorboard)) if d.is_main else NullLogger()

    def checkpoint(path: Path) -> None:
        _check_finite(model, inference, state.step, last_path)
        payload = {"divergence": monitor.state_dict(),
            "config": resolved, "model_name": cfg.model.name, "n_visible": data.dim,
            "model": model.state_dict(), "inference": None if inference is None else inference.state_dict(),
            "learner": learner.learner_state(), "step": state.step, "best_score": state.best_score,
            "loop": asdict(state), "rng": {"torch": torch.get_rng_state()},
        }
        if d.enabled:  # every rank's own generators and particles; a collective, so every rank comes here
            payload["world_size"] = d.world_size
            payload["ranks"] = distributed.gather_objects(
                {"learner": learner.rank_state(), "torch_rng": torch.get_rng_state()})
        if d.is_main:
            save_checkpoint(path, payload)
            log.info("step %d: saved %s", state.step, path)

    # ---- the loop ---------------------------------------------------------------------------------
    bar = tqdm(total=t.max_steps, initial=state.step, disable=not (t.progress and d.is_main), dynamic_ncols=True,
               desc=f"{cfg.learner.name} {cfg.model.name}", unit="step")
    started, first_step = time.perf_counter(), state.step
    latest: dict[str, float] = {}
    interrupt = InterruptFlag(enabled=not d.enabled)
    try:
        while state.step < t.max_steps and not state.stopped_early:
            if interrupt.requested:
                checkpoint(last_path)
                raise Interrupted(f"interrupted at step {state.step}; saved {last_path}; continue with: python "
                                  f"train.py hydra.run.dir={run_dir} trainer.resume=true")
            x = stream.batch(state.step)[rows]
            log_now = (state.step + 1) % t.log_every == 0 or state.step == 0  # step 1: the reference for divergence
            per_example = getattr(learner, "per_example_state", False)
            extra = {"indices": stream.indices(state.step)[rows]} if per_example else {}
            metrics = learner.step(x, diagnostics=log_now, **extra)
            state.step += 1
            bar.update(1)
            done = state.step == t.max_steps

            if log_now:
                latest = to_floats(metrics)
                if d.enabled:  # every rank then sees the same values, so every rank stops together on a NaN
                    latest = distributed.average_metrics(latest)
                if not all(map(math.isfinite, latest.values())):
                    bad = sorted(k for k, v in latest.items() if not math.isfinite(v))
                    raise TrainingDiverged(f"training diverged at step {state.step}: {', '.join(bad[:3])} not "
                                           f"finite; {_kept(last_path)} (try a smaller learner.lr)")
                diverged = monitor.check(latest)
                if diverged:
                    raise TrainingDiverged(f"training diverged at step {state.step}: {diverged}; {_kept(last_path)} "
                                           "(try a smaller learner.lr; trainer.divergence=null turns this check off)")
                latest["train/steps_per_second"] = (state.step - first_step) / (time.perf_counter() - started)
                logger.scalars(state.step, latest)
                shown = next((k for k in PROGRESS_KEYS if k in latest), None)
                if shown:
                    bar.set_postfix({shown.split("/")[1]: f"{latest[shown]:.2f}"})

            if (state.step % t.val_every == 0 or done) and tag is None:  # e.g. greedy DBN: no single score
                logger.scalars(state.step, learner.validate(valid, train_subset))
            elif state.step % t.val_every == 0 or done:
                val_metrics = validate(model, inference, valid, train_subset, t.val_num_samples, cfg.seed,
                                       ais_betas=t.get("val_ais_betas", 100)) if d.is_main else None
                if d.enabled:  # rank 0's scores decide early stopping and best checkpoints on every rank
                    val_metrics = distributed.broadcast(val_metrics)
                score = val_metrics[tag]
                diverged = monitor.check(val_metrics)
                if diverged:
                    raise TrainingDiverged(f"training diverged by step {state.step}: {diverged}; "
                                           f"{_kept(last_path)} (try a smaller learner.lr)")
                log.info("step %d: %s = %.4f%s", state.step, tag, score, " (best)" if score > state.best_score else "")
                improved = score > state.best_score
                if improved:
                    state.best_score, state.best_step, state.evals_without_improvement = score, state.step, 0
                else:
                    state.evals_without_improvement += 1
                    if t.patience is not None and state.evals_without_improvement >= t.patience:
                        state.stopped_early = True
                logger.scalars(state.step, {**val_metrics, f"{tag}_best": state.best_score})
                bar.set_postfix(val=f"{score:.2f}")
                if improved:
                    checkpoint(best_path)

            last_step = done or state.stopped_early or interrupt.requested
            if (state.step % t.sample_every == 0 or last_step) and data.image_shape is not None and d.is_main:
                for image_tag, images in _image_grids(model, learner, cfg.seed, device).items():
                    logger.image_grid(image_tag, images, state.step, data.image_shape)

            if state.step % t.ckpt_every == 0 or done or state.stopped_early:
                checkpoint(last_path)
        if interrupt.requested:  # Ctrl-C during the last step: the checkpoint above is the run's end
            raise Interrupted(f"interrupted at step {state.step}, the run's last; saved {last_path}")
    finally:
        interrupt.restore()
        bar.close()
        logger.close()
    if d.enabled:
        distributed.barrier()  # rank 0's last checkpoint is on disk before any rank reads it
    log.info("finished at step %d%s", state.step, " (stopped early)" if state.stopped_early else "")
    return {
        "step": state.step, "best_step": state.best_step, "val/tag": tag, "val/best": state.best_score,
        "stopped_early": state.stopped_early,
        # the last logged training scores, whatever the learner reports (train/elbo, train/log_joint, ...)
        **{k: v for k, v in latest.items() if k.startswith("train/") and k != "train/steps_per_second"},
        "steps_per_second": (state.step - first_step) / max(time.perf_counter() - started, 1e-9),
        "checkpoint": str(best_path if best_path.exists() else last_path),
    }


class InterruptFlag:
    """Ctrl-C (SIGINT) during training sets a flag that the loop reads between steps, so the checkpoint it then
    writes is of a whole step; a second Ctrl-C interrupts at once. Off under torchrun, where the ranks could read
    the flag at different steps, and off the main thread, where Python allows no signal handlers."""

    def __init__(self, enabled: bool = True) -> None:
        self.requested = False
        self.previous = None
        if enabled and threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None


def _kept(last_path: Path) -> str:
    if last_path.exists():
        return f"the last good checkpoint is kept at {last_path}"
    return "no checkpoint was written before that (none is kept)"


@torch.no_grad()
def _image_grids(model, learner, seed: int, device) -> dict[str, torch.Tensor]:
    """Directed models: a grid of ancestral samples; Boltzmann machines: the learner's particles,
    tempered-transition runs and filters."""
    if hasattr(learner, "image_grids"):
        return learner.image_grids()
    g = torch.Generator(device=device).manual_seed(seed)
    _, hs = model.sample(64, generator=g)
    return {"samples/model": model.visible_probs(hs)}


def config_conflicts(saved, new, key: str) -> list[str]:
    """Where ``new`` disagrees with ``saved``. Keys the saved config lacks are not conflicts: they were
    added to the config after the checkpoint was written (a structural change still fails when the
    state dicts are loaded)."""
    if isinstance(saved, dict) and isinstance(new, dict):
        return [c for k in saved for c in config_conflicts(saved[k], new.get(k), f"{key}.{k}")]
    if saved != new:
        return [f"it was written with {key}={saved}, but this run asks for {key}={new}"]
    return []


def _check_finite(model, inference, step: int, last_path: Path) -> None:
    params = list(model.parameters()) + (list(inference.parameters()) if inference is not None else [])
    if not bool(torch.stack([torch.isfinite(p).all() for p in params]).all()):
        raise TrainingDiverged(f"parameters became NaN or infinite by step {step}; {_kept(last_path)} "
                               "(try a smaller learner.lr)")


def _restore(path: Path, resolved: dict, model, inference, learner, monitor, device, d: distributed.Dist) -> LoopState:
    payload = load_checkpoint(path, map_location=device)
    written = int(payload.get("world_size", 1))
    if written != d.world_size:
        raise CheckpointError(f"cannot resume from {path}: it was written by {written} process(es) and this run "
                              f"has {d.world_size}; resume with the same number (torchrun --nproc_per_node={written}"
                              f"{'' if written > 1 else ', or plain python train.py'})")
    conflicts = [c for key in RESUME_MUST_MATCH for c in config_conflicts(payload["config"].get(key),
                                                                             resolved.get(key), key)]
    if conflicts:
        raise CheckpointError(f"cannot resume from {path}: " + "; ".join(conflicts[:3]))
    load_module_state(model, payload["model"], "model", path)
    if inference is not None:
        load_module_state(inference, payload["inference"], "inference network", path)
    try:
        learner.load_learner_state(payload["learner"])
        if d.enabled:
            learner.load_rank_state(payload["ranks"][d.rank]["learner"])
    except (KeyError, IndexError, RuntimeError, ValueError) as e:
        raise CheckpointError(f"cannot restore the learner state from {path}: {str(e).splitlines()[0][:200]}") from None
    torch.set_rng_state((payload["ranks"][d.rank]["torch_rng"] if d.enabled else payload["rng"]["torch"]).cpu())
    monitor.load_state_dict(payload.get("divergence", {}))
    return LoopState(**payload["loop"])
