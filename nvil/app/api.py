"""``nvil.train``, ``nvil.evaluate``, ``nvil.load`` and ``nvil.compare``: what ``train.py`` and ``evaluate.py`` do,
from Python (a notebook, a script of one's own), with the same config and the same files in the run directory.

    run = nvil.train(model="rbm", learner="sap", data="synthetic", **{"trainer.max_steps": 1000})
    run.metrics["steps"], run.checkpoint, run.run_dir
    result = nvil.evaluate(run.checkpoint, estimator="ais", num_chains=200)   # or "estimator=ais" strings
    result.mean_log_p, result.stderr, result.certified, result.warnings
    model = nvil.load(run.checkpoint); x, h = model.sample(64)
    nvil.evaluate(model, x_test, estimator="ais")                              # on rows the caller holds
    nvil.compare("a.pt", "b.pt", estimator="iwae")                             # paired on the same examples

Keywords are config groups (``model="rbm"``) and dotted keys (``**{"trainer.max_steps": 1000}``); for
``evaluate`` a bare keyword is a setting of the estimator (``num_chains=1000`` is ``estimator.num_chains=1000``).
Each becomes the override the command line would take, with its value written in Hydra's grammar (strings quoted,
lists and booleans as YAML), so that the run records what the user set.

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

from nvil.app import objects
from nvil.app.cli import explain, estimator_overrides
from nvil.app.main import evaluate as evaluate_job
from nvil.app.main import train_job
from nvil.core.config import CONFIG_DIR
from nvil.core.errors import ConfigError
from nvil.estimators.base import Result

RUN_DIR_KEY = "hydra.run.dir="


@dataclass
class Run:
    """A finished training run: its directory, the summary ``train.py`` prints, and the checkpoint scored.

    ``nvil.train`` returns one; ``checkpoint`` and ``last_checkpoint`` are the paths to hand ``nvil.evaluate`` or
    ``nvil.load``.

    Parameters
    ----------
    run_dir : Path
        The run directory (``config.yaml``, ``metrics.jsonl``, ``train.log``, ``checkpoints/``).
    metrics : dict
        The run's summary, the ``{"train": ...}`` line ``train.py`` prints (``step``, ``checkpoint``, ``val/*``,
        ``final_eval``, ...).

    Examples
    --------
    >>> from pathlib import Path
    >>> from nvil.app.api import Run
    >>> run = Run(Path("outputs/run"), {"step": 100, "checkpoint": "outputs/run/checkpoints/best.pt"})
    >>> run.checkpoint.name, run.last_checkpoint.as_posix()
    ('best.pt', 'outputs/run/checkpoints/last.pt')
    """

    run_dir: Path
    metrics: dict = field(repr=False)

    @property
    def checkpoint(self) -> Path:
        """The checkpoint the final evaluation scores: ``best.pt``.

        ``last.pt`` with ``final_eval.checkpoint=last`` or where no validation ran.
        """
        return Path(self.metrics["checkpoint"])

    @property
    def last_checkpoint(self) -> Path:
        """The run's last checkpoint, ``checkpoints/last.pt`` (the one ``trainer.resume=true`` continues from)."""
        return self.run_dir / "checkpoints" / "last.pt"


def compose_config(config_name: str, overrides: list[str]) -> DictConfig:
    """The config ``train.py`` / ``evaluate.py`` would run with these overrides; Hydra's errors as one line.

    A Hydra context the caller holds is set aside and restored.

    Parameters
    ----------
    config_name : str
        ``train`` or ``evaluate`` (configs/train.yaml, configs/evaluate.yaml).
    overrides : list of str
        Hydra overrides, as on the command line (``model=rbm``, ``trainer.max_steps=1000``).

    Returns
    -------
    DictConfig
        The composed config.

    Raises
    ------
    ConfigError
        If Hydra or OmegaConf refuses an override (an unknown key or group, a bad value), in one line.

    Examples
    --------
    >>> from nvil.app.api import compose_config
    >>> cfg = compose_config("train", ["model=rbm", "trainer.max_steps=10"])
    >>> cfg.model.name, cfg.trainer.max_steps
    ('rbm', 10)
    >>> compose_config("train", ["trainer.max_step=5"])
    Traceback (most recent call last):
    ...
    nvil.core.errors.ConfigError: unknown config key trainer.max_step (did you mean trainer.max_steps?); ...
    """
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


def hydra_value(value) -> str:
    """``value`` in Hydra's override grammar: booleans and None as YAML, lists and mappings element by element, a
    string quoted where it holds characters the grammar reads (spaces, commas, brackets, quotes, ``=``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        if value and all(c.isalnum() or c in "._-/+~:@" for c in value) and value not in ("true", "false", "null"):
            return value
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    raise ConfigError(f"a setting's value must be a number, string, boolean, None, list or dict, got "
                      f"{type(value).__name__}")


def as_overrides(args, keywords: dict, bare_prefix: str = "") -> list[str]:
    """The overrides ``args`` (strings, or one list of them) and ``keywords`` stand for: ``key=value`` for each
    keyword, ``bare_prefix`` before a key without a dot."""
    out = []
    for a in args:
        items = a if isinstance(a, (list, tuple)) else [a]
        for o in items:
            if not isinstance(o, str):
                raise ConfigError(f"an override must be a string such as 'trainer.max_steps=100', got {o!r}; give "
                                  "settings as keywords: nvil.train(model='rbm', **{'trainer.max_steps': 100})")
            out.append(o)
    for key, value in keywords.items():
        name = key if "." in key or not bare_prefix else bare_prefix + key
        out.append(f"{name}={hydra_value(value)}")
    return out


def train(*overrides, run_dir: str | Path | None = None, **settings) -> Run:
    """Train as ``python train.py *overrides`` would, in this process (and run the family's final evaluation).

    The final evaluation runs unless ``final_eval.enabled=false``. ``overrides``: strings (or one list of strings);
    ``settings``: config groups and dotted keys as keywords (``model="rbm"``, ``**{"trainer.max_steps": 1000}``),
    each written as the override the command line would take. The run's log goes to ``train.log`` in the run
    directory.

    Parameters
    ----------
    *overrides : str or list of str
        Hydra overrides (``"model=rbm"``, ``"trainer.max_steps=1000"``), or one list of them.
    run_dir : str or Path or None, default None
        The run directory; None: the override ``hydra.run.dir=DIR`` if given, else ``outputs/DATE/TIME`` under the
        working directory, as Hydra's. ``trainer.resume=true`` continues the run there.
    **settings : object
        Config groups and dotted keys with their values (numbers, strings, booleans, None, lists, dicts).

    Returns
    -------
    Run
        The finished run: its directory, its summary ``metrics`` and its ``checkpoint``.

    Raises
    ------
    ConfigError
        One line, for a bad setting or override (``UserError`` subclasses for other refusals: a held run directory,
        a bad checkpoint on resume, bad data).

    Examples
    --------
    >>> import tempfile
    >>> import nvil
    >>> with tempfile.TemporaryDirectory() as run_dir:
    ...     run = nvil.train(data="synthetic", run_dir=run_dir,
    ...                      **{"model.layers": [4, 3], "trainer.max_steps": 20, "trainer.device": "cpu",
    ...                         "trainer.progress": False, "trainer.tensorboard": False, "final_eval.enabled": False})
    ...     files = sorted(p.name for p in run.run_dir.iterdir())
    {"train": {"step": 20, ...}}
    >>> run.metrics["step"], run.checkpoint.name, files
    (20, 'best.pt', ['.hydra', 'checkpoints', 'config.yaml', 'metrics.jsonl', 'train.log'])
    """
    overrides = as_overrides(overrides, settings)
    rest = [o for o in overrides if not o.startswith(RUN_DIR_KEY)]
    given = [o[len(RUN_DIR_KEY):] for o in overrides if o.startswith(RUN_DIR_KEY)]
    run_dir = Path(run_dir or (given[-1] if given else Path("outputs") / time.strftime("%Y-%m-%d/%H-%M-%S")))
    cfg = compose_config("train", rest)
    with _log_to(run_dir / "train.log"):
        metrics = train_job(cfg, run_dir, rest)
    return Run(run_dir=run_dir, metrics=metrics)


SCRIPT_KEYS = ("seed",)  # keywords of evaluate that are evaluate.py's own keys, not the estimator's


def evaluate(source, x=None, *overrides, estimator=None, **settings) -> Result:
    """log p(v) with its certificate: the estimator's ``Result``.

    - ``evaluate(checkpoint, *overrides, estimator=NAME, **settings)``: as ``python evaluate.py checkpoint=PATH``
      would, on the checkpoint's own data split (printed as one JSON line and appended to
      ``<checkpoint>.eval.jsonl``); ``settings`` are the estimator's (``num_chains=1000``) or dotted keys
      (``**{"eval.num_examples": 100}``), ``seed=`` evaluate.py's seed;
    - ``evaluate(model_or_checkpoint, x, estimator=NAME_OR_OBJECT, **settings)``: on the rows ``x`` (a tensor or
      a numpy array, checked by ``nvil.estimators.door``), for a loaded model (``nvil.load``), any built-in
      model or a user's protocol model; ``seed=``, ``train=``, ``inference=`` and ``budget=`` (seconds: an annealing
      estimator grows from small until its certificate holds, ``nvil.estimators.budget``) as ``objects.estimate``.

    Parameters
    ----------
    source : str or Path or nn.Module
        A checkpoint's path, or a model (loaded, built-in or a user's protocol model).
    x : torch.Tensor or numpy.ndarray or str or None, default None
        The rows ``[N, ...]`` to score; None: the checkpoint's own split. A string here is taken as the first
        override (``evaluate(checkpoint, "estimator=exact")``).
    *overrides : str
        Overrides of evaluate.py (``"estimator=ais"``, ``"eval.num_examples=100"``); only for a checkpoint scored on
        its own split.
    estimator : str or Estimator or None, default None
        The estimator's registry name (``"ais"``, ``"iwae"``, ``"exact"``, ...) or, with rows ``x``, an estimator
        object; None with a checkpoint: evaluate.yaml's default (iwae); with rows it must be given.
    **settings : object
        The estimator's keyword settings (``num_chains=1000``), dotted keys, and ``seed=`` (and, with rows,
        ``train=``, ``inference=``, ``budget=``).

    Returns
    -------
    Result
        The estimate: per-example ``log_p``, ``mean_log_p``, ``stderr``, ``certified`` and ``warnings``.

    Raises
    ------
    ConfigError
        If an estimator object is given with a checkpoint but no rows, override strings are given with rows, a model
        is given without rows, or a setting is refused (``CheckpointError`` or ``DataError`` for a bad checkpoint or
        bad rows), each in one line naming the problem.

    Examples
    --------
    >>> import nvil
    >>> from nvil.models import SBN
    >>> model = SBN(6, [3])
    >>> x, _ = model.sample(10)
    >>> result = nvil.evaluate(model, x, estimator="exact")
    >>> result.estimator, result.log_p.shape, result.certified
    ('exact', torch.Size([10]), True)
    """
    if isinstance(x, str):  # evaluate(checkpoint, "estimator=exact", ...): overrides, no rows
        overrides, x = (x, *overrides), None
    if x is None and isinstance(source, (str, Path)):
        given = as_overrides(overrides, {k: v for k, v in settings.items() if k not in SCRIPT_KEYS}, "estimator.")
        given = [*([f"estimator={estimator}"] if estimator is not None else []), *given,
                 *(f"{k}={hydra_value(settings[k])}" for k in SCRIPT_KEYS if k in settings)]
        if any(not isinstance(e, str) for e in ([estimator] if estimator is not None else [])):
            raise ConfigError("evaluating a checkpoint from its path takes an estimator's name; for an estimator "
                              "object give the rows too: nvil.evaluate(nvil.load(path), x, estimator=AIS(...))")
        given = estimator_overrides([f"checkpoint={source}", *given])
        return evaluate_job(compose_config("evaluate", given), given)
    if overrides:
        raise ConfigError(f"override strings {list(overrides)} apply to a checkpoint evaluated on its own split; "
                          "with rows x give settings as keywords (num_chains=1000)")
    if x is None:
        raise ConfigError(f"evaluating a {type(source).__name__} needs the rows to score: nvil.evaluate(model, x, "
                          "estimator=...)")
    model = objects.load(source) if isinstance(source, (str, Path)) else source
    return objects.estimate(model, x, estimator, **settings)


def compare(a, b, x=None, *overrides, estimator="iwae", seed: int = 0, **settings) -> objects.Comparison:
    """The paired difference log p_a(v) - log p_b(v) of two checkpoints (or models, with rows ``x``).

    Both are estimated with the same estimator, settings and seed, on the same examples, so each example's random
    draws are the same for both and the noise they share cancels.

    Parameters
    ----------
    a : str or Path or nn.Module
        The first checkpoint's path, or a model (with ``x``).
    b : str or Path or nn.Module
        The second, as ``a``.
    x : torch.Tensor or numpy.ndarray or str or None, default None
        The rows to score; None: each checkpoint's own split (as ``evaluate``).
    *overrides : str
        Overrides of evaluate.py, for checkpoints scored on their own split.
    estimator : str or Estimator, default "iwae"
        The estimator both are scored with.
    seed : int, default 0
        The seed both estimates draw from.
    **settings : object
        The estimator's keyword settings and dotted keys, as ``evaluate`` takes them.

    Returns
    -------
    Comparison
        ``mean_difference``, ``stderr``, ``unpaired_stderr`` and both ``Result`` objects.

    Raises
    ------
    ConfigError
        If the two estimates cover different examples, or as ``evaluate`` raises.

    Examples
    --------
    >>> import nvil
    >>> from nvil.models import SBN
    >>> a, b = SBN(6, [3]), SBN(6, [3])
    >>> x, _ = a.sample(10)
    >>> d = nvil.compare(a, b, x, estimator="exact")
    >>> d.log_p_difference.shape, d.a.estimator
    (torch.Size([10]), 'exact')
    >>> print(d)
    exact: log p_a - log p_b = ... ± ... nats over 10 paired examples (unpaired ± ...)
    """
    results = [evaluate(m, x, *overrides, estimator=estimator, seed=seed, **settings) for m in (a, b)]
    return objects.paired(*results)


load = objects.load


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
