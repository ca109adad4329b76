"""The estimator result every evaluator returns: per-example log p(v), its mean and standard error, and its
certificate: the checks that ran (``checks``), what failed in words (``warnings``) and ``certified``.

``certified`` is true when at least one check ran and none failed, false when one failed, and null (JSON) when
the estimator has no check of its own (a stochastic bound such as IWAE says what it is in ``bound``). Numbers
that are not finite are written as JSON null with a reason beside them (``<key>_null_reason``), never as the
NaN / Infinity tokens that strict JSON parsers reject."""

from __future__ import annotations

import functools
import json
import math
import sys
from dataclasses import dataclass, field

import torch

from nvil.core.ops import chunks, log_mean_exp, mean_and_stderr  # noqa: F401  (chunks: re-exported, its old home)
from nvil.estimators.door import admit, certify_finite


class Certificate:
    """The certificate protocol shared by ``Result`` and ``nvil.estimators.certify.CertifiedLogZ``.

    A dataclass mixing it in carries three lists: ``checks`` (names of the checks that ran), ``failed`` (names of
    those that failed) and ``warnings`` (one sentence per failure). ``certified`` is read from them: true when at
    least one check ran and none failed, false when one failed, None when no check ran.

    Examples
    --------
    >>> import torch
    >>> from nvil.estimators import Result
    >>> r = Result("demo", torch.zeros(3), seconds=0.0, seed=0)
    >>> r.certified is None
    True
    >>> r.check("ess", True, "ess: never shown")
    True
    >>> r.certified
    True
    >>> r.check("gap", False, "gap: the forward-reverse gap is too wide")
    False
    >>> r.certified, r.failed, r.warnings
    (False, ['gap'], ['gap: the forward-reverse gap is too wide'])
    """

    @property
    def certified(self) -> bool | None:
        """Whether the certificate holds: True when checks ran and none failed, False when one failed, else None.

        None (JSON null) means no check ran: the estimator has no check of its own."""
        return (not self.failed) if self.checks else None

    def check(self, name: str, passed: bool, warning: str) -> bool:
        """Record that check ``name`` ran; where it failed, ``warning`` (one sentence naming the reason).

        A name or a warning already recorded is not repeated.

        Parameters
        ----------
        name : str
            The check's name, appended to ``checks`` (and to ``failed`` when it did not pass).
        passed : bool
            Whether the check passed.
        warning : str
            One sentence naming the reason for a failure, appended to ``warnings`` only when ``passed`` is false.

        Returns
        -------
        bool
            ``passed``, so a caller can branch on the check's outcome.
        """
        if name not in self.checks:
            self.checks.append(name)
        if not passed:
            if name not in self.failed:
                self.failed.append(name)
            if warning not in self.warnings:
                self.warnings.append(warning)
        return passed

    def carry(self, other: "Certificate") -> None:
        """Add ``other``'s checks, failures and warnings to this certificate (a DBN estimate carries its log Z's).

        Entries this certificate already has are not repeated.

        Parameters
        ----------
        other : Certificate
            The certificate whose ``checks``, ``failed`` and ``warnings`` are appended (a log Z's, a BDMC run's).
        """
        for mine, theirs in ((self.checks, other.checks), (self.failed, other.failed), (self.warnings, other.warnings)):
            mine += [x for x in theirs if x not in mine]


# Which of a per-example estimator's two means to report (Murray & Salakhutdinov 2009, Sec. 3: each run's exp(estimate)
# is unbiased for p(v); the log of one run's, or of their mean, is biased low, and the mean of the logs more so).
RUNS_COMBINED = ("the mean over runs of each run's own log p(v) estimate, kept for run_spread; it is never above "
                 "mean_log_p, which takes the log of each example's mean p(v) estimate over its runs (each run's p(v) "
                 "estimate is unbiased, its log biased low by Jensen's inequality): report mean_log_p")


@dataclass
class Result(Certificate):
    """The estimate of one estimator run: per-example log p(v), its mean and standard error, and its certificate.

    Every estimator's ``estimate`` returns one. ``mean_log_p`` is the mean of ``log_p`` over the examples;
    ``stderr`` adds ``shared_stderr`` (the standard error of a term every example shares, such as an estimated
    log Z) in quadrature to the standard error over examples. ``summary`` gives the JSON line's mapping and
    ``to_json`` the line itself; numbers that are not finite are written as null with a ``<key>_null_reason``
    beside them. The certificate (``Certificate``): the checks that ran, those that failed, one sentence per
    failure.

    Parameters
    ----------
    estimator : str
        The estimator's name (``estimator=NAME``), the JSON line's ``estimator``.
    log_p : torch.Tensor
        ``[num_examples]``, one estimate of log p(v) per example (nats).
    seconds : float
        Wall-clock seconds the estimate took.
    seed : int
        The seed the estimate was drawn with.
    extras : dict, default {}
        Further keys of the JSON line (settings, diagnostics, bounds), added after the standard ones.
    shared_stderr : float, default 0.0
        Standard error of a term every example shares (an estimated log Z), added in quadrature to
        ``stderr_examples`` to give ``stderr``.
    run_log_p : torch.Tensor or None, default None
        ``[runs, num_examples]``: each independent run's own estimate, for the per-run spread (``run_spread``,
        ``mean_log_p_per_run`` in the summary); None where the estimator has no separate runs.
    runs_name : str, default "num_runs"
        What the estimator's settings call its runs (``num_chains`` for AIS on a user's model), the JSON line's key
        for their number.
    checks : list of str, default []
        Names of the certificate's checks that ran.
    failed : list of str, default []
        Names of the checks that failed.
    warnings : list of str, default []
        One sentence per failed check, naming the reason.

    Examples
    --------
    >>> import torch
    >>> from nvil.estimators import Result
    >>> r = Result("demo", torch.tensor([-1.0, -3.0]), seconds=0.5, seed=0)
    >>> r.mean_log_p, r.stderr
    (-2.0, 1.0)
    >>> r.check("finite", True, "finite: never shown")
    True
    >>> r.summary()["certified"], r.summary()["num_examples"]
    (True, 2)
    >>> r.to_json()
    '{"estimator": "demo", "mean_log_p": -2.0, "stderr": 1.0, ... "certified": true, "checks": ["finite"], ...}'
    """

    estimator: str
    log_p: torch.Tensor  # [num_examples], one estimate per example
    seconds: float
    seed: int
    extras: dict = field(default_factory=dict)
    # Standard error of a term every example shares (an estimated log Z), added in quadrature.
    shared_stderr: float = 0.0
    # [runs, num_examples]: each independent run's own estimate, for the per-run spread.
    run_log_p: torch.Tensor | None = None
    # What the estimator's settings call its runs (``num_chains`` for AIS on a user's model), for the JSON line.
    runs_name: str = "num_runs"
    # The certificate (``Certificate``): the checks that ran, those that failed, one sentence per failure.
    checks: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def mean(self) -> float:
        """The mean of ``log_p`` over the examples (nats), the same number as ``mean_log_p``."""
        return mean_and_stderr(self.log_p)[0]

    @property
    def mean_log_p(self) -> float:
        """The estimate: the mean of ``log_p`` over the examples (``mean``, the JSON line's ``mean_log_p``)."""
        return self.mean

    @property
    def stderr_examples(self) -> float:
        """Standard error of the mean over examples (covers both test-set and Monte Carlo noise)."""
        return mean_and_stderr(self.log_p)[1]

    @property
    def stderr(self) -> float:
        """The reported standard error: sqrt(``stderr_examples``^2 + ``shared_stderr``^2)."""
        return math.sqrt(self.stderr_examples**2 + self.shared_stderr**2)

    def summary(self) -> dict:
        """The JSON line's mapping: the estimate, its error and size, the run keys, ``extras`` and the certificate.

        The keys come in this order: estimator, mean_log_p, stderr, num_examples, seconds, seed. With a
        ``shared_stderr`` it also gives ``stderr_examples``; with ``run_log_p``, the number of runs (under
        ``runs_name``), ``run_spread`` (the standard deviation of the runs' means), ``mean_log_p_per_run`` and, for
        several runs, ``mean_log_p_per_run_is`` saying why that mean is not the one to report. Means and errors are
        rounded to 4 decimals, seconds to 3.

        Returns
        -------
        dict
            JSON-ready keys and values; a non-finite float is None with a ``<key>_null_reason`` beside it
            (``finite_json``). The certificate is under ``certified``, ``checks``, ``failed_checks`` and
            ``warnings``.
        """
        out = {
            "estimator": self.estimator,
            "mean_log_p": round(self.mean, 4),
            "stderr": round(self.stderr, 4),
            "num_examples": int(self.log_p.numel()),
            "seconds": round(self.seconds, 3),
            "seed": self.seed,
        }
        if self.shared_stderr:
            out["stderr_examples"] = round(self.stderr_examples, 4)
        if self.run_log_p is not None:
            run_means = self.run_log_p.double().mean(1)
            out[self.runs_name] = int(run_means.numel())
            out["run_spread"] = round(run_means.std().item(), 4) if run_means.numel() > 1 else 0.0
            out["mean_log_p_per_run"] = round(run_means.mean().item(), 4)
            if run_means.numel() > 1:  # an estimator whose runs combine otherwise (harmonic) says so in its extras
                out["mean_log_p_per_run_is"] = RUNS_COMBINED
        out.update(self.extras)
        out["certified"] = self.certified
        out["checks"] = list(self.checks)
        out["failed_checks"] = list(self.failed)
        out["warnings"] = list(self.warnings)
        return finite_json(out)

    def to_json(self) -> str:
        """The result as one line of strict JSON (``summary``; never a NaN or Infinity token).

        Returns
        -------
        str
            ``json.dumps(self.summary(), allow_nan=False)``.
        """
        return json.dumps(self.summary(), allow_nan=False)


def _null_reason(v: float) -> str:
    if math.isnan(v):
        return "not a number (for example a standard error from one value, or a spread of infinite estimates)"
    return "+infinity" if v > 0 else "-infinity (an estimate of probability 0, e.g. every run of an example rejected)"


def finite_json(d: dict) -> dict:
    """``d`` with every non-finite float (also inside lists) replaced by None and a ``<key>_null_reason`` beside it."""
    out = {}
    for k, v in d.items():
        if isinstance(v, float) and not math.isfinite(v):
            out[k], out[f"{k}_null_reason"] = None, _null_reason(v)
        elif isinstance(v, (list, tuple)) and any(isinstance(e, float) and not math.isfinite(e) for e in v):
            out[k] = [None if isinstance(e, float) and not math.isfinite(e) else e for e in v]
            out[f"{k}_null_reason"] = "; ".join(sorted({_null_reason(e) for e in v
                                                       if isinstance(e, float) and not math.isfinite(e)}))
        else:
            out[k] = v
    return out


def batch_generator(seed: int, start: int, device) -> torch.Generator:
    """The generator for the batch of examples that starts at row ``start``: seeded by (seed, start), so an
    example's random numbers do not depend on how the test set is sharded, only on its batch."""
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + start) % (2**63))


def combine_runs(log_p_runs: torch.Tensor) -> torch.Tensor:
    """[examples, runs] estimates of log P(v), each exp() unbiased for P(v) -> the log of their mean, which is
    unbiased in P(v) too."""
    return log_mean_exp(log_p_runs.double(), 1)


def check_rows(model, rows, what: str = "data") -> None:
    """Refuse, in one line, rows that are not a 2-D tensor [examples, model.n_visible]."""
    if not torch.is_tensor(rows) or rows.dim() != 2:
        shape = tuple(rows.shape) if torch.is_tensor(rows) else type(rows).__name__
        raise ValueError(f"{what} must be a 2-D tensor [examples, visible units], got {shape}")
    n = getattr(model, "n_visible", None)
    if n is not None and rows.shape[1] != n:
        raise ValueError(f"{what} has {rows.shape[1]} columns but the model has {n} visible units (model.n_visible)")


def check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    return seed


def default_generator(generator, seed, model, data=None) -> torch.Generator:
    """``generator``, or when it is None one seeded by ``seed`` on the model's device (else the data's): a call
    from Python needs neither, and the same seed gives the same estimate."""
    check_seed(seed)
    if generator is not None:
        return generator
    params = getattr(model, "parameters", None)
    first = next(iter(params()), None) if callable(params) else None
    device = first.device if first is not None else (data.device if torch.is_tensor(data) else "cpu")
    return torch.Generator(device=device).manual_seed(seed)


class Estimator:
    """What ``nvil.app.evaluation.evaluate_checkpoint`` asks of every estimator: ``name``, ``check(model, inference)``
    (refuse a model before any work starts), ``estimate(model, x, ...) -> Result``, and these, whose defaults say
    "nothing special":

    - ``simulates_own_data``: it draws its own examples (BDMC), so sharding it would repeat them on every shard;
    - ``row_offset_aware``: ``estimate`` takes ``row_offset=``, the index of the first row in the whole split, so
      each example draws the same random numbers however the split is sharded;
    - ``dataset_inputs(model, data, split, rows, checkpoint=, payload=)``: the keywords ``estimate`` needs beyond
      the rows (classify: labels; AIS: training marginals; DBNs: the log Z cache);
    - ``config_only``: keys its config file carries (inherited from another file) that the constructor does not
      take; ``nvil.estimators.build_estimator`` drops them.

    Each subclass's constructor takes its settings as typed keywords whose defaults are
    configs/estimator/<name>.yaml's; ``build_estimator(cfg)`` calls it with the config's keys.
    """

    name: str
    simulates_own_data: bool = False
    row_offset_aware: bool = False
    config_only: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs) -> None:
        """Every subclass's ``estimate`` goes through the one door (``nvil.estimators.door``): its rows (and
        ``train=`` / ``init=`` rows) are admitted first, and a non-finite result fails its certificate."""
        super().__init_subclass__(**kwargs)
        if "estimate" in cls.__dict__:
            cls.estimate = _through_the_door(cls.__dict__["estimate"])

    def dataset_inputs(self, model, data, split: str, rows: tuple[int, int], **_) -> dict:
        return {}


def _through_the_door(estimate):
    @functools.wraps(estimate)
    def admitted(self, model, data=None, *args, **kwargs):
        if data is not None:
            data = admit(model, data, "data")
        for key in ("train", "init"):
            if kwargs.get(key) is not None and not isinstance(kwargs[key], tuple):
                kwargs[key] = admit(model, kwargs[key], key)
        result = estimate(self, model, data, *args, **kwargs)
        if isinstance(result, Certificate) and hasattr(result, "log_p"):
            certify_finite(result)
        return result

    admitted.through_the_door = True
    return admitted


# ---- progress ----------------------------------------------------------------------------------------------


def progress_interval() -> float:
    """Seconds between redraws of a progress bar: a tenth of a second on a terminal, ten seconds where stderr is a
    file (a SLURM log), which then gains a line of rate and ETA every ten seconds rather than a flood of them."""
    return 0.1 if sys.stderr.isatty() else 10.0


def shows_progress(bar) -> bool:
    """Whether ``bar`` (the evaluation's tqdm, or None) is drawn: inner bars and phase names only then."""
    return bar is not None and not getattr(bar, "disable", False)


def phase_namer(bar, name: str):
    """A function ``phase(text)`` that names, on ``bar``'s description, work that is not per example
    (``chib: log Z (forward AIS, 2/4)``); ``phase(None)`` puts back the estimator's ``name``."""
    if not shows_progress(bar) or not hasattr(bar, "set_description"):
        return lambda text: None
    return lambda text: bar.set_description(f"{name}: {text}" if text else name)


class BatchProgress:
    """One batch's share of the evaluation bar: ``rows`` examples, advanced in fractions of the batch as its work
    is done (``units`` of it: Gibbs sweeps, AIS steps, sample chunks), so that a batch whose examples all run at
    once, vectorised, still moves the bar smoothly and gives an ETA from its first seconds.

    The bar never goes past the batch (a fraction above 1 is held at 1, a fraction that falls, after ``plan`` raises
    the units, waits until the work catches up), and ``finish`` brings it to exactly its count at the start plus
    ``rows``: update(target - n) is exact where n is within a factor of two of the integer target (Sterbenz), so a
    whole evaluation ends at 10/10, not 9.9999/10. With ``bar`` None every call does nothing. It only counts: it
    draws no random numbers and changes no estimate."""

    def __init__(self, bar, rows: int, units: float = 1.0) -> None:
        self.bar = bar if shows_progress(bar) else None
        self.rows = rows
        self.start = getattr(self.bar, "n", None)
        self.units, self.done, self.shown = max(float(units), 1e-12), 0.0, 0.0

    def plan(self, units: float) -> None:
        """The batch's work is ``units`` in all (a revised count, e.g. once a hill-climb has stopped early)."""
        self.units = max(float(units), 1e-12)
        self._show()

    def advance(self, units: float = 1.0) -> None:
        if self.bar is None:
            return
        self.done += units
        self._show()

    def _show(self) -> None:
        if self.bar is None:
            return
        fraction = min(1.0, self.done / self.units)
        if fraction > self.shown:
            self.bar.update(self.rows * (fraction - self.shown))
            self.shown = fraction

    def finish(self) -> None:
        """The batch is done: the bar stands at exactly its start + ``rows``."""
        if self.bar is None:
            return
        rest = (self.start + self.rows - self.bar.n) if self.start is not None else self.rows * (1.0 - self.shown)
        if rest:
            self.bar.update(rest)
        self.shown = 1.0


NO_PROGRESS = BatchProgress(None, 0)  # the default of ``run_batch(..., progress=)``: counts nothing
