"""The file ``<checkpoint>.log_z.json`` that keeps a DBN's certified top-RBM log Z, or an RBM's own
(``nvil.estimators.log_z``): a JSON list of entries ``{"key", "certificate", "mac"}``.

- ``key``: what produced the entry: the AIS and certificate settings, the seed, the reverse chains' sources, a
  digest of the RBM's and of the whole model's parameters, and the nvil version.
- ``certificate``: ``CertifiedLogZ.to_dict()`` (with its digest).
- ``mac``: HMAC-SHA256 (RFC 2104) of the rest, in canonical JSON, under the user's secret key
  (``nvil.core.userkey``), which the cache does not hold: a reader cannot forge one by recomputing a digest.

An entry is used only when its MAC checks out under the reader's key and every number in it is finite and in
order (``check_certificate``); otherwise a one-line warning names the problem and log Z is computed again. A file
that is not a list of entries is ignored with a warning and rewritten. An update reads, merges and replaces the
file atomically under an exclusive lock (``nvil.core.files``), so evaluations racing on one checkpoint keep every
entry; where the lock, the file or the key cannot be written or read, a warning says so and nothing is cached.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import sys
from pathlib import Path

from nvil.core.files import describe_write_failure, lock_path, locked, replace_atomically
from nvil.core.userkey import KeyUnavailable, key_file, user_key

TOLERANCE = 1e-6  # rounding allowed in the order checks


class Untrusted(ValueError):
    """An entry that cannot be used: one line naming the problem."""


def warn(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr, flush=True)


def canonical(entry: dict) -> bytes:
    """The bytes the MAC covers: the entry without its ``mac``, sorted and compact; ``ValueError`` on NaN or inf."""
    rest = {k: v for k, v in entry.items() if k != "mac"}
    return json.dumps(rest, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def mac(entry: dict, key: bytes) -> str:
    return hmac.new(key, canonical(entry), hashlib.sha256).hexdigest()


class LogZCache:
    """The entries of one cache file, read and written as the module says; ``key_path``: the secret key's file
    (default ``nvil.core.userkey.key_file()``)."""

    def __init__(self, path: Path, key_path: Path | None = None) -> None:
        self.path = Path(path)
        self.key_path = Path(key_path) if key_path is not None else key_file()
        self._key: bytes | None = None
        self._key_problem: str | None = None

    def secret(self) -> bytes | None:
        """The user's key, read (or made) once; None, after one warning, when it is unavailable."""
        if self._key is None and self._key_problem is None:
            try:
                self._key = user_key(self.key_path)
            except KeyUnavailable as e:
                self._key_problem = str(e)
                warn(f"{e}; the log Z cache {self.path} is neither trusted nor written")
        return self._key

    def entries(self, quiet: bool = False) -> list[dict]:
        """The file's entries; [] (after a warning unless ``quiet``) when it is not a readable list of objects."""
        try:
            entries = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError, ValueError) as e:
            reason = f"cannot read it ({e.strerror})" if isinstance(e, OSError) else "it is not JSON"
            return self._ignored(reason, quiet)
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            return self._ignored("it is not a list of entries", quiet)
        return entries

    def _ignored(self, reason: str, quiet: bool) -> list:
        if not quiet:
            warn(f"ignoring the log Z cache {self.path}: {reason}; it will be rewritten")
        return []

    def trusted(self, entry: dict) -> dict:
        """The certificate dict of ``entry`` once its numbers and MAC check out; ``Untrusted`` otherwise."""
        check_certificate(entry.get("certificate"))
        key = self.secret()
        if key is None:
            raise Untrusted(f"there is no cache key to check its MAC ({self._key_problem})")
        if not isinstance(entry.get("mac"), str):
            raise Untrusted("it carries no MAC")
        if not hmac.compare_digest(entry["mac"], mac(entry, key)):
            raise Untrusted("its MAC does not match its contents (edited, or written under another key than "
                            f"{self.key_path})")
        return entry["certificate"]

    def store(self, key: dict, certificate: dict) -> None:
        """Add (or replace) the entry for ``key``: read, merge and replace the file under its lock."""
        secret = self.secret()
        if secret is None:
            return
        entry = json.loads(json.dumps({"key": key, "certificate": certificate}))
        try:
            entry["mac"] = mac(entry, secret)
        except ValueError:
            return  # a non-finite number: never trusted on reading, so not kept
        try:
            with locked(lock_path(self.path)):
                kept = [e for e in self.entries(quiet=True) if e.get("key") != entry["key"]]
                replace_atomically(self.path, json.dumps(kept + [entry], indent=1))
        except OSError as e:
            warn(f"{describe_write_failure(e, self.path, 'the log Z cache')}; log Z is not cached")


# ---- the numbers of a certificate, checked without the model --------------------------------------------------


def _number(value, where: str, integer: bool = False) -> float:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value):
        raise Untrusted(f"its {where} is {value!r}, not a finite {'integer' if integer else 'number'}")
    return value


def _text(value, where: str, nullable: bool = False) -> None:
    if not (isinstance(value, str) or (nullable and value is None)):
        raise Untrusted(f"its {where} is {value!r}, not text")


def _texts(value, where: str) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Untrusted(f"its {where} is not a list of names")


def _finite_everywhere(value, where: str) -> None:
    """Every number in a nest of dicts and lists is finite."""
    if isinstance(value, dict):
        for k, v in value.items():
            _finite_everywhere(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _finite_everywhere(v, f"{where}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise Untrusted(f"its {where} is {value!r}, not a finite number")


def check_log_z(d, where: str) -> None:
    """An ``annealing.LogZ`` as a dict: finite numbers, 0 <= stderr, 0 <= ESS <= chains, and its 3-SD band
    [low, high] around log Z in order (an end may be None)."""
    if not isinstance(d, dict):
        raise Untrusted(f"its {where} is not an object")
    log_z = _number(d.get("log_z"), f"{where}.log_z")
    for name in ("stderr", "ess", "seconds", "log_w_sd"):
        if _number(d.get(name), f"{where}.{name}") < 0:
            raise Untrusted(f"its {where}.{name} is negative")
    chains = _number(d.get("num_chains"), f"{where}.num_chains", integer=True)
    _number(d.get("num_betas"), f"{where}.num_betas", integer=True)
    if d["ess"] > chains * (1 + TOLERANCE):
        raise Untrusted(f"its {where}.ess {d['ess']} exceeds its {chains} chains")
    _text(d.get("direction"), f"{where}.direction")
    band = d.get("log_z_3sd")
    if not isinstance(band, list) or len(band) != 2:
        raise Untrusted(f"its {where}.log_z_3sd is not a [low, high] pair")
    low, high = (None if v is None else _number(v, f"{where}.log_z_3sd") for v in band)
    if (low is not None and low > log_z + TOLERANCE) or (high is not None and high < log_z - TOLERANCE):
        raise Untrusted(f"its {where}.log_z_3sd {band} is out of order around log Z {log_z}")


def check_certificate(d) -> None:
    """``Untrusted`` unless ``d`` is a ``CertifiedLogZ.to_dict()`` of the right types, every number finite, the
    forward and reverse estimates in order (``check_log_z``), the hard bound at least its best single probe, and
    the failed checks among those that ran."""
    if not isinstance(d, dict):
        raise Untrusted("its certificate is not an object")
    _finite_everywhere(d, "certificate")
    check_log_z(d.get("forward"), "forward")
    if d.get("reverse") is not None:
        check_log_z(d["reverse"], "reverse")
    bound = d.get("bound")
    if bound is not None:
        if not isinstance(bound, dict):
            raise Untrusted("its bound is not an object")
        value, best = _number(bound.get("value"), "bound.value"), _number(bound.get("best_single"), "bound.best_single")
        _number(bound.get("num_probes"), "bound.num_probes", integer=True)
        _text(bound.get("source"), "bound.source")
        if value < best - TOLERANCE:
            raise Untrusted(f"its hard bound {value} is below its best single probe {best}")
    for name in ("checks", "failed", "warnings"):
        _texts(d.get(name), name)
    if not set(d["failed"]) <= set(d["checks"]):
        raise Untrusted("it lists failed checks that did not run")
    if not isinstance(d.get("ladder"), dict) or not isinstance(d.get("seconds"), dict):
        raise Untrusted("its ladder or timings are not objects")
    _text(d.get("reverse_init"), "reverse_init", nullable=True)
    _text(d.get("digest"), "digest")
    check_reverse_runs(d)


def check_reverse_runs(d: dict) -> None:
    """The reverse run of every source (``certify.ReverseRun``): a source and start that are text, an estimate in
    order (``check_log_z``), and the kept source among them."""
    _text(d.get("reverse_source"), "reverse_source", nullable=True)
    _text(d.get("reverse_choice"), "reverse_choice", nullable=True)
    runs = d.get("reverse_runs") or []
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise Untrusted("its reverse_runs is not a list of objects")
    for i, r in enumerate(runs):
        _text(r.get("source"), f"reverse_runs[{i}].source")
        _text(r.get("init"), f"reverse_runs[{i}].init")
        check_log_z(r.get("estimate"), f"reverse_runs[{i}].estimate")
    if runs and d.get("reverse_source") not in [r["source"] for r in runs]:
        raise Untrusted(f"its reverse source {d.get('reverse_source')!r} is not among its reverse runs")
