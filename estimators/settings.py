"""Typed, validated settings that several estimators share: the AIS run for a Boltzmann machine's log Z
(Salakhutdinov & Murray 2008, Sec. 4.2), its certificate (``nvil.estimators.certify``) and the DBN estimators'
top-RBM log Z block (``estimator.log_z``, configs/log_z/ais.yaml).

Each is a frozen dataclass whose defaults are the config files' values; a bad value raises a one-line
``ConfigError`` naming the key (``estimator.KEY``, or ``estimator.log_z.KEY`` inside the log Z block). ``of``
turns a mapping (a config block, a dict from a notebook) into one, so mappings stop at this door."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from nvil.backend.accel import check_mode
from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.core.registry import Settings
from nvil.estimators.annealing import check_schedule


def _validate_ais(s, prefix: str) -> None:
    s._set("num_chains", positive_int(s.num_chains, f"{prefix}num_chains"))
    s._set("num_betas", positive_int(s.num_betas, f"{prefix}num_betas"))
    check_schedule(s.schedule, s.num_betas, prefix)
    s._set("base_smoothing", positive_float(s.base_smoothing, f"{prefix}base_smoothing"))


def _validate_certify(s, prefix: str) -> None:
    s._set("certify", bool(s.certify))
    s._set("max_gap", positive_float(s.max_gap, f"{prefix}max_gap"))
    s._set("pilot_fraction", positive_float(s.pilot_fraction, f"{prefix}pilot_fraction"))
    s._set("reverse_fraction", positive_float(s.reverse_fraction, f"{prefix}reverse_fraction"))
    s._set("num_climb", positive_int(s.num_climb, f"{prefix}num_climb"))
    s._set("num_data_probes", positive_int(s.num_data_probes, f"{prefix}num_data_probes"))
    if s.pilot_fraction > 0.1:
        raise ConfigError(f"{prefix}pilot_fraction must be at most 0.1 (the pilot costs that share of the main "
                          f"run), got {s.pilot_fraction}")
    if s.reverse_fraction > 1:
        raise ConfigError(f"{prefix}reverse_fraction must be in (0, 1], got {s.reverse_fraction}")
    try:
        s._set("min_ess_fraction", float(s.min_ess_fraction))
    except (TypeError, ValueError):
        raise ConfigError(f"{prefix}min_ess_fraction must be in [0, 1], got {s.min_ess_fraction!r}") from None
    if not 0 <= s.min_ess_fraction <= 1:
        raise ConfigError(f"{prefix}min_ess_fraction must be in [0, 1], got {s.min_ess_fraction}")
    if s.reverse_burn_in is not None:
        s._set("reverse_burn_in", positive_int(s.reverse_burn_in, f"{prefix}reverse_burn_in"))


@dataclass(frozen=True)
class AISSettings(Settings):
    """Forward AIS for log Z from the base-rate model: chains, ladder and base-rate smoothing.

    ``num_chains`` chains on a ladder of ``num_betas`` steps (``schedule``: adaptive | paper | linear | sigmoid,
    ``nvil.estimators.annealing``); the base rate's marginals are p = (mean + s) / (1 + 2 s) with s =
    ``base_smoothing`` (Salakhutdinov & Murray 2008, Sec. 4.2). The values are validated and normalised on
    construction; ``AISSettings.of(mapping)`` builds one from a config block.

    Parameters
    ----------
    num_chains : int, default 100
        AIS chains (M).
    schedule : str, default "adaptive"
        The ladder of betas: adaptive | paper | linear | sigmoid.
    num_betas : int, default 14500
        The ladder's steps (K); paper needs at least 3.
    base_smoothing : float, default 0.05
        s in the base-rate marginals p = (mean + s) / (1 + 2 s); positive.

    Raises
    ------
    nvil.core.errors.ConfigError
        If a count or ``base_smoothing`` is not positive or the schedule is unknown, in one line naming the key
        (``estimator.KEY``).

    Examples
    --------
    >>> from nvil.estimators import AISSettings
    >>> AISSettings(num_chains=50)
    AISSettings(num_chains=50, schedule='adaptive', num_betas=14500, base_smoothing=0.05)
    >>> AISSettings.of({"num_betas": 100, "schedule": "linear"}).num_betas
    100
    >>> AISSettings(num_chains=0)
    Traceback (most recent call last):
    ...
    nvil.core.errors.ConfigError: estimator.num_chains must be a positive integer, got 0
    """

    num_chains: int = 100
    schedule: str = "adaptive"
    num_betas: int = 14500
    base_smoothing: float = 0.05

    def __post_init__(self) -> None:
        _validate_ais(self, self.PREFIX)


@dataclass(frozen=True)
class CertifySettings(Settings):
    """The certificate of an AIS log Z (``nvil.estimators.certify``): pilot, reverse run, probes and thresholds.

    The values are validated and normalised on construction; ``CertifySettings.of(mapping)`` builds one from a
    config block (a null ``reverse_burn_in`` stays null).

    Parameters
    ----------
    certify : bool, default True
        False runs the forward estimate alone.
    pilot_fraction : float, default 0.05
        The adaptive ladder's pilot steps as a share of num_betas (at most 0.1).
    reverse_fraction : float, default 0.5
        Reverse AIS runs on this share of the betas, in (0, 1].
    reverse_burn_in : int or None, default None
        Block-Gibbs sweeps at beta = 1 before the reverse run (None: num_betas / 100 from resampled forward end
        states, num_betas / 4 from data rows, none from stored particles).
    max_gap : float, default 1.0
        Nats; a larger forward-reverse gap fails.
    min_ess_fraction : float, default 0.1
        A forward ESS below this share of the chains fails; in [0, 1].
    num_climb : int, default 256
        Random starts of the hill-climbed probes.
    num_data_probes : int, default 1000
        Data rows used as probes (and as reverse-chain starts without particles).

    Raises
    ------
    nvil.core.errors.ConfigError
        If a value is out of range (``pilot_fraction`` above 0.1, ``reverse_fraction`` above 1,
        ``min_ess_fraction`` outside [0, 1], a count or gap not positive), in one line naming the key.

    Examples
    --------
    >>> from nvil.estimators import CertifySettings
    >>> CertifySettings(max_gap=0.5).max_gap
    0.5
    >>> CertifySettings.of({"reverse_burn_in": None, "num_climb": 16}).num_climb
    16
    >>> CertifySettings(pilot_fraction=0.2)
    Traceback (most recent call last):
    ...
    nvil.core.errors.ConfigError: estimator.pilot_fraction must be at most 0.1 (the pilot costs ...), got 0.2
    """

    NULLABLE: ClassVar[tuple] = ("reverse_burn_in",)

    certify: bool = True
    pilot_fraction: float = 0.05
    reverse_fraction: float = 0.5
    reverse_burn_in: int | None = None
    max_gap: float = 1.0
    min_ess_fraction: float = 0.1
    num_climb: int = 256
    num_data_probes: int = 1000

    def __post_init__(self) -> None:
        _validate_certify(self, self.PREFIX)


@dataclass(frozen=True)
class LogZSettings(Settings):
    """The top RBM's log Z for the DBN estimators (configs/log_z/ais.yaml), the ``estimator.log_z`` block.

    The fields of ``AISSettings`` and ``CertifySettings`` (there the base rate comes from the training data passed
    up to the top RBM), with ``seed``, ``cache``, ``accel`` and ``sampler``; an error names the key as
    ``estimator.log_z.KEY``. ``ais`` and ``cert`` give the two shared groups.

    Parameters
    ----------
    num_chains : int, default 100
        AIS chains (M).
    schedule : str, default "adaptive"
        The ladder of betas: adaptive | paper | linear | sigmoid.
    num_betas : int, default 14500
        The ladder's steps (K).
    pilot_fraction : float, default 0.05
        The adaptive ladder's pilot steps as a share of num_betas (at most 0.1).
    base_smoothing : float, default 0.05
        s in the base-rate marginals p = (mean + s) / (1 + 2 s).
    certify : bool, default True
        False runs the forward estimate alone.
    reverse_fraction : float, default 0.5
        Reverse AIS runs on this share of the betas, in (0, 1].
    reverse_burn_in : int or None, default None
        Block-Gibbs sweeps at beta = 1 before the reverse run (None: by source, as in ``CertifySettings``).
    max_gap : float, default 1.0
        Nats; a larger forward-reverse gap fails.
    min_ess_fraction : float, default 0.1
        A forward ESS below this share of the chains fails; in [0, 1].
    num_climb : int, default 256
        Random starts of the hill-climbed probes.
    num_data_probes : int, default 1000
        Data rows used as probes (and as reverse-chain starts without particles).
    seed : int, default 0
        Seed of the AIS runs' generator.
    cache : bool, default True
        Keep the certified value in ``<checkpoint>.log_z.json``.
    accel : str, default "none"
        none | compile | cudagraphs: the fused AIS step.
    sampler : str, default "ais"
        ais, or smc (adaptive tempered SMC, ``nvil.estimators.smc``, in place of the forward AIS run; the
        certificate is the same).
    num_particles : int, default 100
        SMC only: particles per run.
    num_runs : int, default 10
        SMC only: independent runs (``num_particles`` x ``num_runs`` in all).
    cess : float, default 0.9
        SMC only: the conditional ESS share each new temperature is chosen to keep.

    Raises
    ------
    nvil.core.errors.ConfigError
        If ``sampler`` is not ais or smc, ``seed`` is not an integer, ``accel`` is not a known mode, or a field
        of ``AISSettings`` or ``CertifySettings`` is out of range.

    Examples
    --------
    >>> from nvil.estimators import AISSettings, LogZSettings
    >>> s = LogZSettings.of({"num_chains": 10, "sampler": "smc"})
    >>> s.sampler, s.ais == AISSettings(num_chains=10)
    ('smc', True)
    >>> s.cert.max_gap
    1.0
    >>> LogZSettings(sampler="mcmc")
    Traceback (most recent call last):
    ...
    nvil.core.errors.ConfigError: estimator.log_z.sampler must be ais or smc, got 'mcmc'
    """

    PREFIX: ClassVar[str] = "estimator.log_z."
    NULLABLE: ClassVar[tuple] = ("reverse_burn_in",)

    num_chains: int = 100
    schedule: str = "adaptive"
    num_betas: int = 14500
    pilot_fraction: float = 0.05
    base_smoothing: float = 0.05
    certify: bool = True
    reverse_fraction: float = 0.5
    reverse_burn_in: int | None = None
    max_gap: float = 1.0
    min_ess_fraction: float = 0.1
    num_climb: int = 256
    num_data_probes: int = 1000
    seed: int = 0
    cache: bool = True
    accel: str = "none"
    sampler: str = "ais"
    num_particles: int = 100
    num_runs: int = 10
    cess: float = 0.9

    def __post_init__(self) -> None:
        _validate_ais(self, self.PREFIX)
        _validate_certify(self, self.PREFIX)
        if self.sampler not in ("ais", "smc"):
            raise ConfigError(f"{self.PREFIX}sampler must be ais or smc, got {self.sampler!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"{self.PREFIX}seed must be an integer, got {self.seed!r}")
        self._set("cache", bool(self.cache))
        check_mode(self.accel, what=f"{self.PREFIX}accel")

    @property
    def ais(self) -> AISSettings:
        """The forward AIS run's settings: ``num_chains``, ``schedule``, ``num_betas`` and ``base_smoothing``."""
        return AISSettings(self.num_chains, self.schedule, self.num_betas, self.base_smoothing)

    @property
    def cert(self) -> CertifySettings:
        """The certificate's settings: the fields of ``CertifySettings``, read from this block."""
        return CertifySettings(**{f.name: getattr(self, f.name) for f in fields(CertifySettings)})


LOG_Z = LogZSettings()  # the estimators' default ``log_z`` block: configs/log_z/ais.yaml
