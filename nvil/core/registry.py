"""One way a config reaches an object, for models' neighbours alike (learners, estimators, datasets): a registry
maps a name to a class or builder, whose keyword arguments are its settings (typed, the defaults those of its YAML
file); ``read_settings`` reads them from a config's keys and refuses, in one line naming the key and the settings there
are, a key the constructor does not take. ``Settings`` is the base of the frozen dataclasses that group settings
several classes share (an AIS run, a certificate, a tempered-transitions schedule)."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import fields
from typing import ClassVar

from nvil.core.errors import ConfigError


def keywords(target: Callable, exclude: Iterable[str] = (), keyword_only: bool = False) -> list[str]:
    """The settings ``target``'s signature takes by name, in its order (``keyword_only``: those after ``*`` only),
    less ``exclude`` (what the run supplies: a device, a seed)."""
    kinds = (inspect.Parameter.KEYWORD_ONLY,) if keyword_only else (
        inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    skip = set(exclude)
    return [p.name for p in inspect.signature(target).parameters.values() if p.kind in kinds and p.name not in skip]


def plain(value):
    """A config value as plain Python: mappings as dicts, sequences as lists, all the way down (an OmegaConf
    container, or a dict from a notebook)."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [plain(v) for v in value]
    return value


def lookup(group: str, name, registry: Mapping, label: str | None = None):
    """``registry[name]``, or one line naming the known ones."""
    if not isinstance(name, str) or name not in registry:
        raise ConfigError(f"unknown {label or group} {name!r}; known {label or group}s: {', '.join(sorted(registry))}")
    return registry[name]


def read_settings(group: str, name: str, cfg: Mapping, known: Sequence[str], skip: Iterable[str] = ()) -> dict:
    """The keywords for ``group=name`` from ``cfg``'s keys: each key but ``skip`` must be one of ``known``, else
    ``group.KEY is not a setting of group=NAME (did you mean group.CLOSEST?); its settings are ...``; values as plain
    Python."""
    skip = set(skip)
    out = {}
    for key, value in cfg.items():
        if key in skip:
            continue
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.8)
            hint = f" (did you mean {group}.{close[0]}?)" if close else ""
            raise ConfigError(f"{group}.{key} is not a setting of {group}={name}{hint}; its settings are "
                              f"{', '.join(known)}")
        out[key] = plain(value)
    return out


class Settings:
    """What the settings dataclasses share: ``PREFIX`` for error messages, ``of`` and ``_set``."""

    PREFIX: ClassVar[str] = "estimator."

    @classmethod
    def of(cls, value=None):
        """``value`` itself when it is one already; ``cls()`` for None; else ``cls(**mapping)``, where a null value
        means the default (as in the config files) and a key that is not a field is refused in one line."""
        if isinstance(value, cls):
            return value
        if value is None:
            return cls()
        if not isinstance(value, Mapping):
            raise ConfigError(f"{cls.PREFIX.rstrip('.')} must be a mapping of settings or a {cls.__name__}, "
                              f"got {type(value).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = [k for k in value if k not in names]
        if unknown:
            raise ConfigError(f"{cls.PREFIX}{unknown[0]} is not a setting; the settings are {', '.join(names)}")
        nullable = getattr(cls, "NULLABLE", ())
        return cls(**{k: v for k, v in value.items() if v is not None or k in nullable})

    def _set(self, name: str, value) -> None:
        object.__setattr__(self, name, value)  # the normalised value (frozen dataclass)
