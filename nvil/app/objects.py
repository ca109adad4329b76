"""The Python API on objects: a checkpoint loaded as its model, an estimate of a model on rows the caller holds, and
the paired difference of two models on the same examples and random draws.

    model = nvil.load("run/checkpoints/best.pt")                # the model, on the CPU (device= to move it)
    x, h = model.sample(64)                                     # every family samples
    r = nvil.evaluate(model, x_test, estimator="ais", num_chains=1000)
    d = nvil.compare("a.pt", "b.pt", x_test, estimator="iwae")  # d.mean_difference, d.stderr

Settings are the estimator's constructor keywords (``nvil.estimators``), named as the user names them: a setting
the estimator does not take is refused in one line that lists those it does.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from nvil.app.evaluation import load_model
from nvil.core.config import resolve_device
from nvil.core.errors import ConfigError
from nvil.core.ops import mean_and_stderr
from nvil.estimators import resolve
from nvil.estimators.base import Estimator, Result
from nvil.estimators.budget import resolve_budget, within_budget
from nvil.models.protocol import protocol_only


def load(path: str | Path, device: str | torch.device = "cpu") -> torch.nn.Module:
    """The model a checkpoint holds, rebuilt from the model registry, in eval mode on ``device``.

    The checkpoint is read with ``torch.load(weights_only=True)``. Two plain attributes (not submodules, so
    ``state_dict`` is the checkpoint's) travel with it: ``inference_network`` (q(h | v), or None for families that
    need none) and ``checkpoint`` (the path it came from).

    Parameters
    ----------
    path : str or Path
        The checkpoint (``best.pt``, ``last.pt``, ...).
    device : str or torch.device, default "cpu"
        Where the model goes; ``auto``: CUDA where there is one.

    Returns
    -------
    torch.nn.Module
        The model, with ``inference_network`` and ``checkpoint`` set.

    Raises
    ------
    CheckpointError
        One line, for a missing, corrupt or foreign file.

    Examples
    --------
    >>> import tempfile
    >>> import nvil
    >>> with tempfile.TemporaryDirectory() as run_dir:
    ...     run = nvil.train("data=synthetic", "model.layers=[4,3]", "trainer.max_steps=20", "trainer.device=cpu",
    ...                      "trainer.progress=false", "trainer.tensorboard=false", "final_eval.enabled=false",
    ...                      run_dir=run_dir)
    ...     model = nvil.load(run.checkpoint)
    {"train": {"step": 20, ...}}
    >>> type(model).__name__, type(model.inference_network).__name__, model.training, model.checkpoint.name
    ('SBN', 'LayeredInference', False, 'best.pt')
    >>> model.sample(3)[0].shape
    torch.Size([3, 12])
    """
    path = Path(path)
    model, inference, _ = load_model(path, resolve_device(str(device)))
    object.__setattr__(model, "inference_network", inference)
    object.__setattr__(model, "checkpoint", path)
    return model


def builtin(model) -> bool:
    """Whether ``model`` declares capabilities of the built-in families (``nvil.models.protocol``)."""
    return not protocol_only(model)


def estimator_object(name_or_estimator, settings: dict, model) -> tuple[Estimator, tuple[type, dict] | None]:
    """The estimator ``name_or_estimator`` (a name of the registry, or an estimator object, which takes no further
    settings) with ``settings`` as its keywords, for ``model`` (``nvil.estimators.resolve``), and the (class,
    keywords) it was built from (None for an object)."""
    if isinstance(name_or_estimator, Estimator):
        if settings:
            raise ConfigError(f"settings {sorted(settings)} were given beside an estimator object; set them on "
                              f"{type(name_or_estimator).__name__}(...) itself")
        return name_or_estimator, None
    if name_or_estimator is None:
        raise ConfigError("name the estimator: estimator='ais', 'iwae', 'exact', ... (or an estimator object)")
    if not isinstance(name_or_estimator, str):
        raise ConfigError(f"estimator must be a name or an estimator object, got {type(name_or_estimator).__name__}")
    cls, kwargs = resolve({"name": name_or_estimator, **settings}, model, given=set(settings),
                          inference=getattr(model, "inference_network", None))
    return cls(**kwargs), (cls, kwargs)


def estimate(model, x, estimator, *, seed: int = 0, train=None, inference=None, progress=None,
             budget: float | str | None = "auto", **settings) -> Result:
    """``estimator`` (a name and its keyword ``settings``, or an object) on the rows ``x`` of ``model``: the
    ``Result``. ``train``: the training rows where the estimator needs them (an RBM's base rates, a DBN's log Z;
    default ``x``); ``inference``: q(h | v) (default the loaded model's ``inference_network``); ``budget``: seconds,
    within which an annealing estimator named here grows from small until its certificate holds
    (``nvil.estimators.budget``); ``"auto"``, the default: ``AUTO_SECONDS`` where no schedule is given; None: the
    schedule given or the estimator's defaults."""
    est, built = estimator_object(estimator, settings, model)
    accepted = inspect.signature(est.estimate).parameters
    inputs = {"seed": seed, "progress": progress}
    if "inference" in accepted:
        inputs["inference"] = inference if inference is not None else getattr(model, "inference_network", None)
    if "train" in accepted and x is not None:
        inputs["train"] = x if train is None else train
    check = getattr(est, "check", None)
    if callable(check):
        check(model, inputs.get("inference")) if builtin(model) else check(model)
    if built is None:
        if budget is not None and budget != "auto":
            raise ConfigError("budget= grows an estimator named by its settings (estimator='ais', num_chains=...), "
                              "not an estimator object")
        budget = None
    else:
        budget = resolve_budget(*built, budget)
    if budget is None:
        return est.estimate(model, x, **inputs)

    return within_budget(*built, budget,
                         lambda est, round_seed: est.estimate(model, x, **{**inputs, "seed": round_seed}), seed)


@dataclass
class Comparison:
    """log p_a(x) - log p_b(x), paired on the same examples and random draws.

    ``mean_difference`` and ``stderr``: the mean of the per-example differences and its standard error (the
    estimates' shared terms, such as each model's log Z, added in quadrature); ``unpaired_stderr``: the standard
    error the two means would have as independent estimates, for comparison; ``a`` and ``b``: both ``Result``
    objects. ``nvil.compare`` returns one; ``str`` gives it in one line.

    Parameters
    ----------
    a : Result
        The first model's estimate.
    b : Result
        The second model's, on the same examples with the same estimator, settings and seed.
    log_p_difference : torch.Tensor
        ``a.log_p - b.log_p`` per example, float64, ``[N]``.

    Examples
    --------
    >>> import nvil
    >>> from nvil.models import SBN
    >>> a, b = SBN(6, [3]), SBN(6, [3])
    >>> x, _ = a.sample(10)
    >>> d = nvil.compare(a, b, x, estimator="exact")
    >>> type(d).__name__, d.log_p_difference.dtype
    ('Comparison', torch.float64)
    >>> abs(d.mean_difference - (d.a.mean_log_p - d.b.mean_log_p)) < 1e-9
    True
    """

    a: Result
    b: Result
    log_p_difference: torch.Tensor

    @property
    def mean_difference(self) -> float:
        """The mean over examples of log p_a(x) - log p_b(x), in nats."""
        return mean_and_stderr(self.log_p_difference)[0]

    @property
    def stderr(self) -> float:
        """The paired difference's standard error: over examples, and both estimates' shared terms in quadrature."""
        se = mean_and_stderr(self.log_p_difference)[1]
        return math.sqrt(se**2 + self.a.shared_stderr**2 + self.b.shared_stderr**2)

    @property
    def unpaired_stderr(self) -> float:
        """The standard error the difference of the two means would have as independent estimates."""
        return math.sqrt(self.a.stderr**2 + self.b.stderr**2)

    def __str__(self) -> str:
        return (f"{self.a.estimator}: log p_a - log p_b = {self.mean_difference:.4f} ± {self.stderr:.4f} nats over "
                f"{self.log_p_difference.numel():,} paired examples (unpaired ± {self.unpaired_stderr:.4f})")


def paired(a: Result, b: Result) -> Comparison:
    if a.log_p.shape != b.log_p.shape:
        raise ConfigError(f"the two estimates cover different examples ({a.log_p.numel()} and {b.log_p.numel()}); "
                          "a paired comparison needs the same rows")
    return Comparison(a, b, a.log_p.double() - b.log_p.double())
