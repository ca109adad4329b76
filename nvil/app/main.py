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
    """The final evaluation plan: (estimator config, number of examples) for each estimator of ``final_eval``.

    The model family's plan (configs/final_eval/, chosen by configs/model/*.yaml) or the user's ``final_eval=...`` /
    ``final_eval.*``: ``final_eval.estimator`` and, where the plan has one, ``final_eval.then``.

    Parameters
    ----------
    cfg : DictConfig
        The training config (``train.yaml`` composed with the run's overrides).

    Returns
    -------
    list of tuple of (DictConfig, int or None)
        The estimator's config and ``final_eval.num_examples`` (``then_num_examples`` for the second; None: the whole
        split); empty when ``final_eval.enabled=false``.

    Raises
    ------
    ConfigError
        If ``final_eval.checkpoint`` is neither ``best`` nor ``last``.

    Examples
    --------
    >>> from nvil.app.api import compose_config
    >>> from nvil.app.main import final_plan
    >>> [(est.name, n) for est, n in final_plan(compose_config("train", ["model=dbn"]))]
    [('dbn_bound', None), ('chib', 50)]
    >>> final_plan(compose_config("train", ["final_eval.enabled=false"]))
    []
    """
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
    """Train, then (if ``final_eval.enabled``) evaluate the scored checkpoint with each estimator of the final plan.

    The best checkpoint is scored (``final_eval.checkpoint=last``: the last) with each estimator of the final
    evaluation plan (``final_plan``); every estimator's settings, and its fit to the model and the split's size, are
    checked before the first step. The ``{"train": ...}`` summary is printed on stdout as one strict JSON line (a
    non-finite score as null), the job's duration on stderr.

    Parameters
    ----------
    cfg : DictConfig
        The run's training config (``train.yaml`` composed with its overrides).
    run_dir : str or Path
        The run directory: checkpoints, ``metrics.jsonl`` and the TensorBoard logs go there.
    accepted : callable or None, default None
        ``accepted()`` runs once every check has passed, before the run writes anything (``nvil.app.loop.fit``).

    Returns
    -------
    dict
        The run's metrics (``step``, ``checkpoint``, ``train/*``, ``val/*``, ...), with ``final_eval`` (and
        ``final_eval_then``) holding the estimators' summary lines.

    Raises
    ------
    ConfigError
        If a final estimator's setting is refused, it cannot score the model, or ``final_eval.num_examples`` (or
        ``then_num_examples``) exceeds the split's examples.

    Examples
    --------
    >>> import tempfile
    >>> from nvil.app.api import compose_config
    >>> from nvil.app.main import train
    >>> cfg = compose_config("train", ["data=synthetic", "model.layers=[4,3]", "trainer.max_steps=20",
    ...                                "trainer.device=cpu", "trainer.progress=false", "trainer.tensorboard=false",
    ...                                "final_eval.enabled=false"])
    >>> with tempfile.TemporaryDirectory() as run_dir:
    ...     metrics = train(cfg, run_dir)
    {"train": {"step": 20, ...}}
    >>> metrics["step"], "final_eval" in metrics
    (20, False)
    """
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
    """One training job, the only writer in ``run_dir`` while it lasts (``nvil.core.runlock``).

    Settle the run's config (a resume restores the checkpoint's), record it in ``.hydra/`` only once every check has
    passed, then train (``train``). A command refused before that leaves the directory as it was. Under torchrun
    every rank stops on rank 0's refusal.

    Parameters
    ----------
    cfg : DictConfig
        The training config composed from ``overrides``.
    run_dir : str or Path
        The run directory (Hydra's ``hydra.run.dir``).
    overrides : list of str
        The command line's overrides, recorded in ``.hydra/overrides.yaml`` (a resume applies only the safe ones
        to the checkpoint's config and appends them to ``.hydra/resumes.yaml``).
    hydra_record : dict or None, default None
        Hydra's own config, recorded as ``.hydra/hydra.yaml`` (None: an empty record, as from ``nvil.train``).

    Returns
    -------
    dict
        The run's metrics, as ``train`` returns them.

    Raises
    ------
    UserError
        If another job holds ``run_dir`` (its lock), or any refusal of the run's config, data, model or learner
        (``ConfigError``, ``CheckpointError``, ``DataError``).

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from nvil.app.api import compose_config
    >>> from nvil.app.main import train_job
    >>> overrides = ["data=synthetic", "model.layers=[4,3]", "trainer.max_steps=20", "trainer.device=cpu",
    ...              "trainer.progress=false", "trainer.tensorboard=false", "print_config=false",
    ...              "final_eval.enabled=false"]
    >>> with tempfile.TemporaryDirectory() as run_dir:
    ...     metrics = train_job(compose_config("train", overrides), run_dir, overrides)
    ...     recorded = sorted(p.name for p in (Path(run_dir) / ".hydra").iterdir())
    {"train": {"step": 20, ...}}
    >>> recorded
    ['config.yaml', 'hydra.yaml', 'overrides.yaml']
    """
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
    """One ``evaluate.py`` job: the checkpoint's model, the split, the estimator; one JSON line.

    The JSON line is printed on stdout and appended to ``eval.output`` (default ``<checkpoint>.eval.jsonl``). With
    ``model_module=``, a model of the user's own (``nvil.app.user_model``), whose estimator settings are the
    ``estimator.KEY=`` entries of ``overrides``.

    Parameters
    ----------
    cfg : DictConfig
        The evaluation config (``evaluate.yaml`` composed with ``overrides``).
    overrides : list of str or tuple of str, default ()
        The command line's overrides: their ``estimator.KEY=`` entries name the settings the user set, the ones a
        routed estimator (``nvil.estimators.resolve``) or a user's model takes.

    Returns
    -------
    Result
        The estimator's ``Result`` (``nvil.estimators.base.Result``): per-example log p(v), its mean, standard error
        and certificate.

    Raises
    ------
    ConfigError
        If neither ``checkpoint=`` nor ``model_module=`` is given.

    Examples
    --------
    >>> import tempfile
    >>> import nvil
    >>> from nvil.app.api import compose_config
    >>> from nvil.app.main import evaluate
    >>> with tempfile.TemporaryDirectory() as run_dir:
    ...     run = nvil.train("data=synthetic", "model.layers=[4,3]", "trainer.max_steps=20", "trainer.device=cpu",
    ...                      "trainer.progress=false", "trainer.tensorboard=false", "final_eval.enabled=false",
    ...                      run_dir=run_dir)
    ...     overrides = [f"checkpoint={run.checkpoint}", "estimator=exact", "eval.progress=false"]
    ...     result = evaluate(compose_config("evaluate", overrides), overrides)
    {"train": {"step": 20, ...}}
    {"estimator": "exact", "mean_log_p": ..., "certified": true, ...}
    >>> result.estimator, result.log_p.shape, result.certified
    ('exact', torch.Size([500]), True)
    """
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
