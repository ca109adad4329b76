"""``nvil.train`` and ``nvil.evaluate``: what ``train.py`` and ``evaluate.py`` do, from Python (a notebook, a
script of one's own), with the same Hydra overrides and the same files in the run directory.

    run = nvil.train("model=rbm", "learner=sap", "data=synthetic", "trainer.max_steps=1000")
    run.metrics["steps"], run.checkpoint, run.run_dir
    result = nvil.evaluate(run.checkpoint, "estimator=ais")
    result.mean_log_p, result.stderr, result.certified, result.warnings

Errors raise ``nvil.core.errors.UserError`` (``ConfigError`` for the overrides, ``CheckpointError`` for a checkpoint)
with the one-line message the scripts print. Nothing process-wide is changed beyond what the run itself sets (torch's thread count while it runs,
the random seed); the CPU kernel set stays what torch picked (``nvil.backend.cpu_kernels.choose_kernels`` before
torch's first operation changes it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from hydra.initialize import get_gh_backup, restore_gh_from_backup
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from nvil.app.cli import explain, user_model_overrides
from nvil.app.main import evaluate as evaluate_job
from nvil.app.main import train_job
from nvil.core.config import CONFIG_DIR
from nvil.core.errors import ConfigError
from nvil.estimators.base import Result

RUN_DIR_KEY = "hydra.run.dir="


@dataclass
class Run:
    """A finished training run: its directory, the summary ``train.py`` prints, and the checkpoint scored."""

    run_dir: Path
    metrics: dict = field(repr=False)

    @property
    def checkpoint(self) -> Path:
        """The checkpoint the final evaluation scores: ``best.pt`` (``last.pt`` with ``final_eval.checkpoint=last``
        or where no validation ran)."""
        return Path(self.metrics["checkpoint"])

    @property
    def last_checkpoint(self) -> Path:
        return self.run_dir / "checkpoints" / "last.pt"


def compose_config(config_name: str, overrides: list[str]) -> DictConfig:
    """The config ``train.py`` / ``evaluate.py`` would run with these overrides; Hydra's errors as one line. A
    Hydra context the caller holds is set aside and restored."""
    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            try:
                return compose(config_name, overrides=overrides)
            except (HydraException, OmegaConfBaseException) as e:
                raise ConfigError(explain(e, compose, config_name, overrides)) from None
    finally:
        restore_gh_from_backup(backup)


def train(*overrides: str, run_dir: str | Path | None = None) -> Run:
    """Train (and run the family's final evaluation, unless ``final_eval.enabled=false``) as
    ``python train.py *overrides`` would, in this process. ``run_dir`` (or the override ``hydra.run.dir=DIR``)
    defaults to ``outputs/DATE/TIME`` under the working directory, as Hydra's; ``trainer.resume=true`` continues
    the run there. The run's log goes to ``train.log`` in it."""
    rest = [o for o in overrides if not o.startswith(RUN_DIR_KEY)]
    given = [o[len(RUN_DIR_KEY):] for o in overrides if o.startswith(RUN_DIR_KEY)]
    run_dir = Path(run_dir or (given[-1] if given else Path("outputs") / time.strftime("%Y-%m-%d/%H-%M-%S")))
    cfg = compose_config("train", rest)
    with _log_to(run_dir / "train.log"):
        metrics = train_job(cfg, run_dir, rest)
    return Run(run_dir=run_dir, metrics=metrics)


def evaluate(checkpoint: str | Path, *overrides: str) -> Result:
    """Evaluate ``checkpoint`` as ``python evaluate.py checkpoint=PATH *overrides`` would: the estimator's
    ``Result`` (also printed as one JSON line on stdout and appended to ``<checkpoint>.eval.jsonl``)."""
    overrides = user_model_overrides([f"checkpoint={checkpoint}", *overrides])
    return evaluate_job(compose_config("evaluate", overrides), overrides)


class _log_to:
    """The run's log messages (logger ``nvil``) also to ``path`` while the run lasts, as Hydra's job logging does
    for the scripts; the file is opened at the first message."""

    def __init__(self, path: Path) -> None:
        self.handler = logging.FileHandler(path, delay=True)
        self.handler.setFormatter(logging.Formatter("[%(asctime)s][%(levelname)s] %(message)s"))
        self.logger = logging.getLogger("nvil")

    def __enter__(self) -> None:
        self.level = self.logger.level
        self.logger.addHandler(self.handler)
        if self.logger.getEffectiveLevel() > logging.INFO:
            self.logger.setLevel(logging.INFO)

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.level)
        self.handler.close()
