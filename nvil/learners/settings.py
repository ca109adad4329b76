"""Typed, validated settings of the learners: the groups a config nests (``learner.schedule``, ``learner.tt``,
``learner.pt``) and the Boltzmann-machine learners' settings (``SAPSettings``, which greedy DBN training hands to each
RBM's learner). Each is a frozen dataclass whose defaults are configs/learner/*.yaml's; a bad value raises a one-line
``ConfigError`` naming the key (``learner.KEY``, ``learner.tt.KEY``, ...). ``of`` turns a mapping (a config block, a
dict from a notebook) into one, so mappings stop at this door."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import ClassVar

from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.core.registry import Settings as _Settings
from nvil.mcmc import uniform_betas


class Settings(_Settings):
    """``of`` and ``_set`` of the one settings base (``nvil.core.registry.Settings``), with the learners' prefix."""

    PREFIX: ClassVar[str] = "learner."

    def keywords(self) -> dict:
        """{field: value}, nested settings kept as they are (the keywords they came from)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class ScheduleSettings(Settings):
    """SAP's learning-rate schedule (``learner.schedule``): ``lr`` for ``t0`` updates, then a / (b + t - t0).

    The schedule is Salakhutdinov 2009's (Sec. 4): 0.01 for 10,000 updates, then 10 / (1000 + t), t counted from
    the switch; the rate is a / b at the switch, so it is continuous there when a / b = lr. ``t0`` None keeps
    ``lr`` fixed (and ``a``, ``b`` are then not read).

    Parameters
    ----------
    t0 : int or None, default None
        Updates at the fixed rate ``lr`` before the decay starts; a non-negative integer, or None for no schedule.
    a : float or None, default None
        Numerator of the decayed rate a / (b + t - t0); > 0 when ``t0`` is set.
    b : float or None, default None
        Offset of the decayed rate's denominator; > 0 when ``t0`` is set.

    Raises
    ------
    nvil.core.errors.ConfigError
        If ``t0`` is set and is not a non-negative integer, or if ``t0`` is set without ``a > 0`` and ``b > 0``.

    Examples
    --------
    >>> from nvil.learners import ScheduleSettings
    >>> s = ScheduleSettings(t0=10000, a=10.0, b=1000.0)
    >>> s.a / s.b
    0.01
    >>> ScheduleSettings.of({"t0": 5, "a": 1.0, "b": 100.0})
    ScheduleSettings(t0=5, a=1.0, b=100.0)
    >>> ScheduleSettings(t0=5)
    Traceback (most recent call last):
    ...
    nvil.core.errors.ConfigError: learner.schedule needs a > 0 and b > 0 when t0 is set (the rate is a / b at ...)
    """

    PREFIX: ClassVar[str] = "learner.schedule."
    NULLABLE: ClassVar[tuple] = ("t0", "a", "b")

    t0: int | None = None
    a: float | None = None
    b: float | None = None

    def __post_init__(self) -> None:
        if self.t0 is not None:
            if isinstance(self.t0, bool) or not isinstance(self.t0, int) or self.t0 < 0:
                raise ConfigError(f"{self.PREFIX}t0 must be a non-negative integer or null, got {self.t0!r}")
            if self.a is None or self.b is None or self.a <= 0 or self.b <= 0:
                raise ConfigError("learner.schedule needs a > 0 and b > 0 when t0 is set (the rate is a / b at the "
                                  "switch)")


@dataclass(frozen=True)
class TTSettings(Settings):
    """Trans-SAP's tempered transitions (``learner.tt``): the inverse temperatures of a run, and when runs happen.

    Salakhutdinov 2009, Algorithm 2: ``num_betas`` inverse temperatures spaced uniformly from ``beta_min`` to 1; one
    run every ``every`` updates from update ``start_step`` on. ``DBMSAP`` with ``tempered`` takes the same block.

    Parameters
    ----------
    num_betas : int, default 50
        S, the inverse temperatures beta_1 = ``beta_min`` < ... < beta_S = 1 of the run (the paper's 50); >= 2. A
        run takes 2 (S - 1) block-Gibbs sweeps.
    beta_min : float, default 0.9
        The lowest inverse temperature (the paper's 0.9); in (0, 1].
    every : int, default 200
        Updates between runs; positive.
    start_step : int, default 0
        The first update that may take a run (runs fall on updates t >= start_step with t % every == 0);
        non-negative.

    Raises
    ------
    nvil.core.errors.ConfigError
        If ``num_betas`` is not an integer >= 2, ``beta_min`` is not in (0, 1], ``every`` is not a positive
        integer or ``start_step`` is not a non-negative integer.

    Examples
    --------
    >>> from nvil.learners import TTSettings
    >>> TTSettings()
    TTSettings(num_betas=50, beta_min=0.9, every=200, start_step=0)
    >>> TTSettings.of({"num_betas": 3, "every": None})      # null: the default
    TTSettings(num_betas=3, beta_min=0.9, every=200, start_step=0)
    >>> TTSettings(every=0)
    Traceback (most recent call last):
    ...
    nvil.core.errors.ConfigError: learner.tt.every must be a positive integer, got 0
    """

    PREFIX: ClassVar[str] = "learner.tt."

    num_betas: int = 50
    beta_min: float = 0.9
    every: int = 200
    start_step: int = 0

    def __post_init__(self) -> None:
        uniform_betas(self.num_betas, self.beta_min)  # learner.tt.num_betas >= 2, beta_min in (0, 1]
        self._set("every", positive_int(self.every, f"{self.PREFIX}every"))
        if isinstance(self.start_step, bool) or not isinstance(self.start_step, int) or self.start_step < 0:
            raise ConfigError(f"{self.PREFIX}start_step must be a non-negative integer, got {self.start_step!r}")


@dataclass(frozen=True)
class PTSettings(Settings):
    """pt_sap's parallel tempering: ``num_temps`` replicas per chain, betas spaced uniformly from ``beta_min`` to 1.

    The block is ``learner.pt``; the learner's particles are the beta = 1 replicas.

    Parameters
    ----------
    num_temps : int, default 10
        Replicas per chain, one per inverse temperature; >= 2.
    beta_min : float, default 0.9
        The lowest inverse temperature; in (0, 1].

    Raises
    ------
    nvil.core.errors.ConfigError
        If ``num_temps`` is not an integer >= 2 or ``beta_min`` is not a number in (0, 1].

    Examples
    --------
    >>> from nvil.learners import PTSettings
    >>> PTSettings(num_temps=4).keywords()
    {'num_temps': 4, 'beta_min': 0.9}
    >>> PTSettings(num_temps=1)
    Traceback (most recent call last):
    ...
    nvil.core.errors.ConfigError: learner.pt.num_temps must be an integer >= 2, got 1
    """

    PREFIX: ClassVar[str] = "learner.pt."

    num_temps: int = 10
    beta_min: float = 0.9

    def __post_init__(self) -> None:
        if isinstance(self.num_temps, bool) or not isinstance(self.num_temps, int) or self.num_temps < 2:
            raise ConfigError(f"{self.PREFIX}num_temps must be an integer >= 2, got {self.num_temps!r}")
        if isinstance(self.beta_min, bool) or not isinstance(self.beta_min, (int, float)) or not 0 < self.beta_min <= 1:
            raise ConfigError(f"{self.PREFIX}beta_min must be in (0, 1], got {self.beta_min!r}")


@dataclass(frozen=True)
class SAPSettings(Settings):
    """The Boltzmann-machine learners' settings (configs/learner/sap.yaml; ``nvil.learners.sap``):

    - ``lr``, ``momentum``: SGD's rate and momentum; ``weight_decay``: the weight cost on W (and U, L), never the
      biases (rbm.m's weightcost);
    - ``num_particles``: persistent chains; ``k``: block-Gibbs sweeps per update;
    - ``closed_form``: the gradient from sufficient statistics (models/rbm_grad.py) where the machine has them
      (false: autograd through the free energy, the same update, slower); ``reuse_hidden``: sweep x | h then h | x
      and reuse p(h | negatives) for their statistics (scikit-learn's BernoulliRBM; a different, tested chain);
    - ``k_final``: if set, k rises linearly from k to k_final over ``k_ramp`` updates, or with ``k_every`` by one
      every k_every updates (S&M 2008: ceil(epoch / 20)); ``lr_over_k``: the rate divided by the current k;
    - ``momentum_initial`` with ``momentum_switch``: that momentum for the first momentum_switch updates, then
      ``momentum`` (rbm.m: 0.5 for 5 epochs, then 0.9);
    - ``schedule`` (``ScheduleSettings``), ``tt`` (``TTSettings``, trans_sap), ``pt`` (``PTSettings``, pt_sap)."""

    NULLABLE: ClassVar[tuple] = ("k_final", "k_every", "momentum_initial", "momentum_switch")

    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    num_particles: int = 100
    k: int = 1
    closed_form: bool = True
    reuse_hidden: bool = False
    k_final: int | None = None
    k_ramp: int = 1
    k_every: int | None = None
    lr_over_k: bool = False
    momentum_initial: float | None = None
    momentum_switch: int | None = None
    schedule: ScheduleSettings = field(default_factory=ScheduleSettings)
    tt: TTSettings = field(default_factory=TTSettings)
    pt: PTSettings = field(default_factory=PTSettings)

    def __post_init__(self) -> None:
        self._set("lr", positive_float(self.lr, "learner.lr"))
        self._set("momentum", float(self.momentum))
        self._set("weight_decay", float(self.weight_decay))
        if self.weight_decay < 0:
            raise ConfigError(f"learner.weight_decay must be >= 0, got {self.weight_decay}")
        self._set("momentum_switch", positive_int(self.momentum_switch, "learner.momentum_switch", allow_none=True))
        if (self.momentum_initial is None) != (self.momentum_switch is None):
            raise ConfigError("learner.momentum_initial and learner.momentum_switch go together (the momentum for the "
                              "first momentum_switch updates)")
        if self.momentum_initial is not None:
            self._set("momentum_initial", float(self.momentum_initial))
        self._set("k", positive_int(self.k, "learner.k"))
        self._set("k_final", positive_int(self.k_final, "learner.k_final", allow_none=True))
        self._set("k_ramp", positive_int(self.k_ramp, "learner.k_ramp"))
        self._set("k_every", positive_int(self.k_every, "learner.k_every", allow_none=True))
        if self.k_every is not None and self.k_final is None:
            raise ConfigError("learner.k_every steps k up to learner.k_final, which is not set")
        self._set("lr_over_k", bool(self.lr_over_k))
        self._set("num_particles", positive_int(self.num_particles, "learner.num_particles"))
        self._set("closed_form", bool(self.closed_form))
        self._set("reuse_hidden", bool(self.reuse_hidden))
        self._set("schedule", ScheduleSettings.of(self.schedule))
        self._set("tt", TTSettings.of(self.tt))
        self._set("pt", PTSettings.of(self.pt))

    @classmethod
    def with_overrides(cls, base: "SAPSettings", overrides: Mapping, where: str) -> "SAPSettings":
        """``base`` with the keys of ``overrides`` replaced; a key that is not a setting is refused in one line
        naming ``where`` (e.g. ``learner.per_layer[0]``)."""
        names = [f.name for f in fields(cls)]
        for key in overrides:
            if key not in names:
                raise ConfigError(f"{where}.{key} is not a setting; the settings are {', '.join(names)}")
        return cls(**{**base.keywords(), **overrides})
