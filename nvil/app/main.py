"""What ``train.py`` and ``evaluate.py`` do, importable: the console scripts ``nvil-train`` / ``nvil-evaluate``
and the checkout's two scripts all land here, with the same arguments.

    nvil-train model=rbm learner=sap trainer.max_steps=1000        # = python train.py ...
    nvil-evaluate checkpoint=outputs/run/checkpoints/best.pt estimator=ais

stdout carries only JSON lines: ``{"train": ...}`` and one line per final estimator; stderr, after each estimator's
line, the estimate in words (``nvil.app.report``). The resolved config is saved as ``config.yaml`` in the run
directory (and printed on stderr with ``print_config=true``); with ``trainer.tensorboard`` it also goes to
TensorBoard's hparams view with the final scores.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from nvil.app.cli import guarded, run_task
from nvil.app.evaluation import EvalSpec, evaluate_checkpoint
from nvil.app.user_model import evaluate_user_model, given_keys
from nvil.app.logging import log_hparams
from nvil.app.loop import fit
from nvil.app.resume import record_config, run_config
from nvil.core import distributed
from nvil.core.config import CONFIG_DIR, estimator_config
from nvil.core.errors import ConfigError, StorageError, UserError
from nvil.core.runlock import RunLock
from nvil.estimators import build_estimator
from nvil.estimators.base import Result

log = logging.getLogger("nvil")


def final_plan(cfg: DictConfig) -> list[tuple[DictConfig, int | None]]:
    """(estimator config, number of examples) for each estimator of ``final_eval``: the model family's plan
    (configs/final_eval/, chosen by configs/model/*.yaml) or the user's ``final_eval=...`` / ``final_eval.*``."""
    fe = cfg.final_eval
    if not fe.enabled:
        return []
    if fe.get("checkpoint", "best") not in ("best", "last"):
        raise ConfigError(f"final_eval.checkpoint must be best or last, got {fe.checkpoint!r}")
    plan = [(estimator_config(fe.estimator), fe.get("num_examples"))]
    if fe.get("then"):
        plan.append((estimator_config(fe.then), fe.get("then_num_examples")))
    return plan


def train(cfg: DictConfig, run_dir: str | Path, accepted=None) -> dict:
    """Train, then (if ``final_eval.enabled``) evaluate the best checkpoint (``final_eval.checkpoint=last``: the
    last) with each estimator of the final evaluation plan. Returns the metrics, with ``final_eval`` (and
    ``final_eval_then``) holding their lines. ``accepted()`` runs once every check has passed, before the run
    writes anything (``nvil.app.loop.fit``)."""
    started = time.perf_counter()
    plan = final_plan(cfg)
    for est, _ in plan:
        build_estimator(est)  # a bad setting is refused before the data is read

    def check(model, inference, data):  # refused before the first step, not after the last
        for (est, num_examples), key in zip(plan, ("num_examples", "then_num_examples")):
            build_estimator(est, model).check(model, inference)
            available = data.split(cfg.final_eval.split).shape[0]
            if num_examples is not None and num_examples > available:
                raise ConfigError(f"final_eval.{key}={num_examples} but the {cfg.final_eval.split} split has "
                                  f"{available} examples; set final_eval.{key}=null for all of them")

    metrics = fit(cfg, Path(run_dir), check=check, accepted=accepted)
    if distributed.current().is_main:
        shown = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in metrics.items()}
        print(json.dumps({"train": shown}, allow_nan=False), flush=True)  # strict JSON: a run with no score, null
    scored = metrics["checkpoint"]
    if cfg.final_eval.get("checkpoint", "best") == "last":
        scored = str(Path(run_dir) / "checkpoints" / "last.pt")
    for i, (est, num_examples) in enumerate(plan):
        result = evaluate_checkpoint(scored, est, EvalSpec(
            split=cfg.final_eval.split, num_examples=num_examples, seed=cfg.seed, device=cfg.trainer.device,
            progress=cfg.trainer.progress))
        metrics["final_eval" if i == 0 else "final_eval_then"] = result.summary()
        log.info("final evaluation: %s", result.to_json())
    if distributed.current().is_main:
        if cfg.trainer.tensorboard:
            hparams_view(cfg, Path(run_dir), metrics)
        report_duration(time.perf_counter() - started, metrics)
    return metrics


def hparams_view(cfg: DictConfig, run_dir: Path, metrics: dict) -> None:
    """The run's config and final scores in TensorBoard's hparams view (``nvil.app.logging.log_hparams``); a write
    the storage refuses is one warning line, the run and its printed results standing."""
    try:
        log_hparams(run_dir, OmegaConf.to_container(cfg, resolve=True), metrics)
    except StorageError as e:
        print(f"warning: {e}; the run and its results (the JSON lines on stdout) stand", file=sys.stderr, flush=True)


def duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def report_duration(total: float, metrics: dict) -> None:
    """One line on stderr (stdout carries only the JSON lines): how long the job took and where the time went."""
    parts = [f"training {duration(metrics['seconds'])} ({metrics['steps_per_second']:.0f} steps/s)"]
    for key in ("final_eval", "final_eval_then"):
        if key in metrics:
            parts.append(f"{metrics[key]['estimator']} {duration(metrics[key]['seconds'])}")
    line = f"done in {duration(total)}: " + ", ".join(parts)
    log.info(line)
    print(line, file=sys.stderr, flush=True)


def train_job(cfg: DictConfig, run_dir: str | Path, overrides: list[str], hydra_record: dict | None = None) -> dict:
    """One training job, the only writer in ``run_dir`` while it lasts (``nvil.core.runlock``): settle the run's
    config (a resume restores the checkpoint's), record it in ``.hydra/`` only once every check has passed, then
    train. A command refused before that leaves the directory as it was."""
    run_dir = Path(run_dir)
    d = distributed.current()
    lock = RunLock(run_dir)
    refusal = None
    if d.is_main:
        try:
            lock.acquire()
        except UserError as e:
            refusal = e
    if d.enabled:  # every rank stops on rank 0's refusal
        refusal = distributed.broadcast(refusal)
    if refusal is not None:
        raise refusal
    written = []
    try:
        cfg, resumed = run_config(cfg, run_dir, overrides)

        def accepted() -> None:
            written.append(True)
            record_config(run_dir, cfg, hydra_record or {}, overrides, resumed)
            if cfg.get("print_config", False):
                print(OmegaConf.to_yaml(cfg, resolve=True), file=sys.stderr)

        return train(cfg, run_dir, accepted)
    finally:
        lock.release(remove_dir=not written)


def evaluate(cfg: DictConfig, overrides: list[str] | tuple[str, ...] = ()) -> Result:
    """One ``evaluate.py`` job: the checkpoint's model, the split, the estimator; one JSON line. With
    ``model_module=``, a model of the user's own (``nvil.app.user_model``), whose estimator settings are the
    ``estimator.KEY=`` entries of ``overrides``."""
    if cfg.get("model_module"):  # the user's module is imported only now, because it is named
        return evaluate_user_model(cfg, list(overrides))
    if not cfg.get("checkpoint"):
        raise ConfigError("evaluate.py needs checkpoint=PATH")
    given = tuple(given_keys(overrides))
    data_overrides = {k: v for k, v in OmegaConf.to_container(cfg.data, resolve=True).items()
                      if k != "split" and not (k == "name" and v is None)}
    return evaluate_checkpoint(cfg.checkpoint, cfg.estimator, EvalSpec(
        split=cfg.data.split, num_examples=cfg.eval.num_examples, seed=cfg.seed, device=cfg.eval.device,
        progress=cfg.eval.progress, data_overrides=data_overrides, output=cfg.eval.output, shard=cfg.eval.get("shard"),
        num_shards=cfg.eval.get("num_shards"), per_class=cfg.eval.get("per_class"),
        strict=bool(cfg.estimator.get("strict", False)), flush_denormal=cfg.eval.get("flush_denormal", True),
        threads=cfg.eval.get("threads", "auto"), given=given))


def _train_hydra_job(cfg: DictConfig) -> dict:
    hc = HydraConfig.get()
    return train_job(cfg, hc.runtime.output_dir, list(hc.overrides.task),
                     OmegaConf.to_container(hc, resolve=False))


@hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")
def _train_hydra(cfg: DictConfig) -> None:
    guarded(_train_hydra_job, cfg)


@hydra.main(config_path=str(CONFIG_DIR), config_name="evaluate", version_base="1.3")
def _evaluate_hydra(cfg: DictConfig) -> None:
    guarded(evaluate, cfg, list(HydraConfig.get().overrides.task))


def train_main() -> None:
    """``nvil-train`` and ``python train.py``."""
    run_task(_train_hydra, config_name="train", run_dir_root="outputs")


def evaluate_main() -> None:
    """``nvil-evaluate`` and ``python evaluate.py``."""
    run_task(_evaluate_hydra, config_name="evaluate")
