"""Which config a run goes with: a new run's own, or, on ``trainer.resume``, the config stored in its checkpoint.

A resumed run is the run that wrote the checkpoint: its model, learner, data, seed and batch size come from
``checkpoints/last.pt``, whatever the command line says, so ``python train.py hydra.run.dir=RUN
trainer.resume=true`` continues a run started with any overrides. Overrides given at resume change only what
is safe to change mid-run (``SAFE_ON_RESUME``: the step budget, logging, devices, the final evaluation, the
DBM's mean-field stopping rule);
any other override must repeat the run's own value, or the resume is refused with one line. Every check here
runs before anything is written to the run directory, so a refused command leaves the old run as it was.

The training loop then restores the run's state from the checkpoint (``restore``): parameters, the learner's
state (each rank's, under torchrun), the random number generators and the divergence monitor's ranges.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from nvil.core import distributed
from nvil.core.checkpoint import load_checkpoint, load_module_state
from nvil.core.errors import CheckpointError, ConfigError
from nvil.core.files import append_line, writing

# Sections of the config a resumed run must share with the run that wrote the checkpoint.
RESUME_MUST_MATCH = ("model", "learner", "data", "seed")
# Config paths an override may change when a run resumes; everything else is the run's own.
SAFE_ON_RESUME = ("trainer.max_steps", "trainer.log_every", "trainer.val_every", "trainer.ckpt_every",
                  "trainer.sample_every", "trainer.progress", "trainer.tensorboard", "trainer.device",
                  "trainer.accel", "trainer.resume", "trainer.patience", "trainer.divergence", "trainer.divergence_floor",
                  "trainer.regression",
                  "trainer.detect_anomaly", "trainer.dist_timeout", "trainer.flush_denormal", "trainer.cpu_kernels", "trainer.threads", "final_eval",
                  "print_config",
                  # how closely the DBM's mean-field fixed point is computed: the objective is the same
                  "learner.mean_field_tol", "learner.mean_field_iters", "learner.mean_field_omega")
# Overrides that are not config paths: Hydra's own settings, and presets that set the run's sections.
NOT_CONFIG = ("hydra", "hydra/")
PRESET_SECTIONS = ("model", "learner", "data", "seed", "trainer.batch_size")


def resume_requested(cfg, last_path: Path) -> bool:
    """``trainer.resume``: true, false, or auto (continue when a checkpoint is there, as a requeued job does)."""
    resume = cfg.trainer.resume
    if resume not in (True, False, "auto"):
        raise ConfigError(f"trainer.resume must be true, false or auto (continue when a checkpoint is there), "
                          f"got {resume!r}")
    return last_path.exists() if resume == "auto" else resume


def resumes(cfg, run_dir: Path, last_path: Path) -> bool:
    """Whether the run in ``run_dir`` continues from ``last_path``: refused when a run is there and no resume
    was asked for (it would be overwritten), or a resume was asked for and there is nothing to continue."""
    resume = resume_requested(cfg, last_path)
    if last_path.exists() and not resume:
        raise ConfigError(f"{run_dir} already holds a run; pass trainer.resume=true to continue it, "
                          "or choose another hydra.run.dir")
    if resume and not last_path.exists():
        raise ConfigError(f"trainer.resume=true but there is no checkpoint at {last_path}")
    return resume


def run_config(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> tuple[DictConfig, bool]:
    """(the config to run with, whether it resumes). ``overrides`` are the command line's (Hydra's task
    overrides); a resumed run takes its checkpoint's config and applies only the safe ones."""
    last_path = Path(run_dir) / "checkpoints" / "last.pt"
    if not resumes(cfg, run_dir, last_path):
        return cfg, False
    payload = load_checkpoint(last_path)
    saved = payload["config"]
    current = OmegaConf.to_container(cfg, resolve=True)
    for key in override_keys(overrides):
        if key in NOT_CONFIG or key.startswith("hydra."):
            continue
        if key == "experiment":
            paths = PRESET_SECTIONS
        elif _safe(key):
            continue
        else:
            paths = (key,)
        for path in paths:
            was, now = _select(saved, path), _select(current, path)
            if was is not None and config_conflicts(was, now, path):
                raise ConfigError(f"cannot resume {run_dir} with {path}={_show(now)}: the run was written with "
                                  f"{path}={_show(was)}; resume without it (the run's own config is restored from "
                                  "its checkpoint) or start a new run in another hydra.run.dir")
    merged = _restore_sections(current, saved)
    for key in override_keys(overrides):
        value = _select(current, key, _MISSING)
        if _safe(key) and value is not _MISSING:  # a null too: trainer.patience=null
            _assign(merged, key, value)
    out = OmegaConf.create(merged)
    _check_budget(out, int(payload.get("step", 0)), cfg.trainer.resume, run_dir)
    return out, True


def override_keys(overrides: list[str]) -> list[str]:
    """The config path of each override: ``trainer.max_steps=5`` -> trainer.max_steps, ``+a.b=1`` -> a.b,
    ``model=rbm`` -> model, ``estimator@final_eval.estimator=iwae`` -> final_eval.estimator."""
    keys = []
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("~+")
        group, at, package = key.partition("@")
        keys.append(package if at else group)
    return keys


def _safe(key: str) -> bool:
    return any(key == s or key.startswith(s + ".") for s in SAFE_ON_RESUME)


def _restore_sections(current: dict, saved: dict) -> dict:
    """The saved config, with keys added to the code's config since the checkpoint was written filled in from
    the current defaults, wherever a section is of the same kind (the same ``name``, or neither has one)."""
    out = dict(current)
    for k, v in saved.items():
        now = current.get(k)
        same_kind = isinstance(v, dict) and isinstance(now, dict) and v.get("name") == now.get("name")
        out[k] = _restore_sections(now, v) if same_kind else v
    return out


_MISSING = object()  # _select's answer for a path that is not there (None is a value)


def _select(d, path: str, missing=None):
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return missing
        d = d[part]
    return d


def _assign(d: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    for part in parents:
        d = d.setdefault(part, {})
    d[last] = value


def _show(value) -> str:
    return str(value).replace("'", "")


def _check_budget(cfg, step: int, resume, run_dir: Path) -> None:
    """A resumed run below its step must be told, not silently do nothing."""
    max_steps = cfg.trainer.max_steps
    if step > max_steps:
        raise ConfigError(f"the run in {run_dir} is already at step {step}, beyond trainer.max_steps={max_steps}; "
                          f"pass a larger trainer.max_steps to continue it")
    if step == max_steps and resume is True:
        raise ConfigError(f"the run in {run_dir} already finished its trainer.max_steps={max_steps} steps; pass a "
                          f"larger trainer.max_steps to continue it")


def record_config(run_dir: Path, cfg, hydra_cfg, overrides: list[str], resumed: bool) -> None:
    """Hydra's record of the command (``.hydra/``), written only once the run is accepted: a new run's
    config.yaml, hydra.yaml and overrides.yaml; a resume appends its overrides to resumes.yaml and leaves the
    original record as it was."""
    record = Path(run_dir) / ".hydra"
    with writing(record, "the run's record"):
        record.mkdir(parents=True, exist_ok=True)
        if resumed:
            append_line(record / "resumes.yaml", f"- {json.dumps(list(overrides))}")  # a YAML list of each resume's overrides
            return
        OmegaConf.save(cfg, record / "config.yaml")
        OmegaConf.save(OmegaConf.create({"hydra": hydra_cfg}), record / "hydra.yaml")
        OmegaConf.save(OmegaConf.create(list(overrides)), record / "overrides.yaml")


def config_conflicts(saved, new, key: str) -> list[str]:
    """Where ``new`` disagrees with ``saved``. Keys the saved config lacks are not conflicts: they were
    added to the config after the checkpoint was written (a structural change still fails when the
    state dicts are loaded)."""
    if isinstance(saved, dict) and isinstance(new, dict):
        return [c for k in saved for c in config_conflicts(saved[k], new.get(k), f"{key}.{k}")]
    if saved != new and not _safe(key):
        return [f"it was written with {key}={saved}, but this run asks for {key}={new}"]
    return []


def restore(path: Path, resolved: dict, run, monitor, device, d: distributed.Dist) -> dict:
    """Load the checkpoint at ``path`` into ``run`` (a ``nvil.app.build.Run``) and ``monitor``, and set the random
    number generators as they were; returns the loop's state (``LoopState`` fields) at that step."""
    payload = load_checkpoint(path, map_location=device)
    needed = ("loop", "learner", "ranks" if d.enabled else "rng")
    missing = [k for k in needed if not isinstance(payload.get(k), (dict, list))]
    if missing:
        raise CheckpointError(f"cannot resume from {path}: it lacks {', '.join(missing)} (a damaged or hand-made "
                              "checkpoint; it can still be evaluated)")
    written = int(payload.get("world_size", 1))
    if written != d.world_size:
        raise CheckpointError(f"cannot resume from {path}: it was written by {written} process(es) and this run "
                              f"has {d.world_size}; resume with the same number (torchrun --nproc_per_node={written}"
                              f"{'' if written > 1 else ', or plain python train.py'})")
    conflicts = [c for key in RESUME_MUST_MATCH for c in config_conflicts(payload["config"].get(key),
                                                                             resolved.get(key), key)]
    if conflicts:
        raise CheckpointError(f"cannot resume from {path}: " + "; ".join(conflicts[:3]))
    load_module_state(run.model, payload["model"], "model", path)
    if run.inference is not None:
        load_module_state(run.inference, payload["inference"], "inference network", path)
    try:
        run.learner.load_learner_state(payload["learner"])
        if d.enabled:
            run.learner.load_rank_state(payload["ranks"][d.rank]["learner"])
    except (KeyError, IndexError, RuntimeError, ValueError) as e:
        raise CheckpointError(f"cannot restore the learner state from {path}: {str(e).splitlines()[0][:200]}") from None
    torch.set_rng_state((payload["ranks"][d.rank]["torch_rng"] if d.enabled else payload["rng"]["torch"]).cpu())
    monitor.load_state_dict(payload.get("divergence", {}))
    return resumed_loop(payload["loop"], resolved["trainer"].get("patience"))


def remove_orphans(checkpoints: Path, started: float) -> list[Path]:
    """The temporary files of checkpoint writes (``.NAME.PID.tmp``, ``nvil.core.checkpoint``) older than
    ``started`` (a time.time()), left by a writer that was killed; removed. Called under the run's lock, when no
    other writer can be at work in the directory."""
    removed = []
    for tmp in checkpoints.glob(".*.tmp"):
        try:
            if tmp.stat().st_mtime < started:
                tmp.unlink()
                removed.append(tmp)
        except OSError:
            pass
    return removed


def resumed_loop(loop: dict, patience: int | None) -> dict:
    """The loop state to go on from: a run that stopped early goes on when resumed with a patience it has not used
    up, or with none (``trainer.patience=null``: keep best.pt, the NVIL paper's early stopping, and train on)."""
    loop = dict(loop)
    if loop.get("stopped_early") and (patience is None or loop.get("evals_without_improvement", 0) < patience):
        loop["stopped_early"] = False
    return loop
