"""The one AIS estimate of a DBN's top-RBM log Z that every DBN estimator shares, and an RBM's own log Z
(``estimator=ais`` / ``raise``), each cached beside its checkpoint.

Murray & Salakhutdinov 2009 (Fig. 2): the bound, AIS over h_1, and the Chib-style estimator "shared the same
AIS estimate of a single global normalization constant Z". It is computed once per checkpoint and AIS
settings, and kept in ``<checkpoint>.log_z.json`` (``nvil.estimators.log_z_cache``) under a key that holds the
settings, the seed, the reverse chains' sources, digests of the RBM's and the whole model's parameters and the
nvil version (``log_z_key``), so an overwritten checkpoint never reuses a stale value, together with its
certificate (``nvil.estimators.certify``) and an HMAC under the user's secret key. On reading, an entry must carry
a valid HMAC and finite, ordered numbers; its checks and its choice of reverse run are made again from its
numbers, and its hard lower bound is tested against a fresh probe of the model (``verify``); otherwise a warning
names the problem and log Z is computed again (``cached_log_z``).
For a DBN the base-rate model takes its marginals from the training data passed up through the RBMs below the top.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from importlib import metadata
from pathlib import Path

import torch

from nvil.backend.accel import check_mode
from nvil.estimators.ais_rbm import base_rate
from nvil.estimators.certify import (SOURCES, CertifiedLogZ, certified_log_z, check_sources, choose_reverse,
                                     log_p_extras, reference_bound, run_checks)
from nvil.estimators.log_z_cache import LogZCache, Untrusted
from nvil.estimators.settings import AISSettings, CertifySettings, LogZSettings
from nvil.estimators.smc import SMCSampler
from nvil.models.protocol import TOP_MACHINE, capable


def parameter_digest(module: torch.nn.Module) -> str:
    """sha256 of every named parameter and buffer of ``module``, in name order."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def fingerprint(module: torch.nn.Module) -> str:
    return parameter_digest(module)[:16]


def nvil_version() -> str:
    try:
        return metadata.version("nvil")
    except metadata.PackageNotFoundError:
        return "unknown"


def has_top_log_z(model) -> bool:
    """Whether log p(v) = log p*(v) - log Z needs the log Z of the Boltzmann machine ``model.top``: a DBN's top RBM,
    a DBM's bipartite form (even layers | odd layers); ``model.top_data(train)`` gives its data rows."""
    return capable(model, TOP_MACHINE)


def cache_path(checkpoint) -> Path | None:
    return None if checkpoint is None else Path(str(checkpoint) + ".log_z.json")


def top_log_z(dbn, train: torch.Tensor, settings: LogZSettings, checkpoint=None, progress: bool = False,
              particles: torch.Tensor | None = None, phase=None) -> tuple[CertifiedLogZ, bool]:
    """(certified log Z of the top RBM, whether it came from the cache). ``settings``: the ``estimator.log_z``
    block (a ``LogZSettings``; a mapping of its fields, such as a config block, is converted). ``particles``: the top RBM's persistent
    particles from the checkpoint, where the greedy run stored them (the reverse chains start there).
    ``progress``: inner bars for the AIS runs; ``phase(text)`` names each phase on the evaluation bar (the caller's
    ``nvil.estimators.base.phase_namer``), and ``phase(None)`` once log Z is known.

    A cache entry is reused only when its HMAC and numbers check out (``nvil.estimators.log_z_cache``), its checks
    follow from its numbers and its hard lower bound survives a fresh probe of the top RBM (``verify``); otherwise
    a warning names the problem and log Z is computed again."""
    phase = phase or (lambda text: None)
    try:
        return _top_log_z(dbn, train, LogZSettings.of(settings), checkpoint, progress, particles, phase)
    finally:
        phase(None)


def _top_log_z(dbn, train, log_z: LogZSettings, checkpoint, progress, particles,
               phase) -> tuple[CertifiedLogZ, bool]:
    settings, cert, seed = log_z.ais, log_z.cert, log_z.seed
    sampler = None if log_z.sampler == "ais" else SMCSampler(log_z.num_particles, log_z.num_runs, log_z.cess, 0.5, 1,
                                                             100_000, 2)
    key = log_z_key(dbn.top, dbn, settings, cert, seed, **({} if sampler is None else
                                                            {"sampler": "smc", **sampler.settings()}))
    phase("log Z (training data up to the top machine)")
    top_data = dbn.top_data(train)

    def compute() -> CertifiedLogZ:
        device = dbn.top.W.device
        base = base_rate(dbn.top, top_data, settings.base_smoothing)
        generator = torch.Generator(device=device).manual_seed(seed)
        # accel changes only the float rounding, so it is not part of the cache key
        return certified_log_z(dbn.top, base, settings, cert, generator, data_rows=top_data, particles=particles,
                               progress=progress, accel=check_mode(log_z.accel, device, "estimator.log_z.accel"),
                               phase=phase, sampler=sampler)

    return cached_log_z(checkpoint if log_z.cache else None, key, dbn.top, top_data, cert, compute, phase)


def log_z_key(rbm, model, settings: AISSettings, cert: CertifySettings, seed: int, sources=SOURCES, **extra) -> dict:
    """What a cached log Z of ``rbm`` (inside ``model``: the DBN, or the RBM itself) depends on: the AIS and
    certificate settings, the seed, the reverse chains' sources, digests of the parameters, the nvil version and
    ``extra`` (the rows the reverse chains may start from)."""
    return {**asdict(settings), **asdict(cert), "seed": seed, "reverse_sources": list(check_sources(sources)),
            "params": fingerprint(rbm), "model": parameter_digest(model), "nvil": nvil_version(), **extra}


def cached_log_z(checkpoint, key: dict, rbm, rows: torch.Tensor, cert: CertifySettings,
                 compute: Callable[[], CertifiedLogZ], phase=None) -> tuple[CertifiedLogZ, bool]:
    """(the certified log Z of ``rbm``, whether it came from the cache beside ``checkpoint``): the cache's entry
    for ``key`` once it checks out (``_cached``, its hard bound probed again from ``rows``), else ``compute()``,
    stored under ``key``. ``checkpoint`` None: no cache. A cache that cannot be read or written costs a warning,
    never the estimate."""
    cache = LogZCache(cache_path(checkpoint)) if checkpoint is not None else None
    if cache is not None:
        if phase is not None:
            phase("log Z (checking the cached value)")
        cached = _cached(cache, key, rbm, rows, cert)
        if cached is not None:
            return cached, True
    c = compute()
    if cache is not None:
        cache.store(key, c.to_dict())
    return c, False


def _cached(cache: LogZCache, key: dict, top, top_data: torch.Tensor, cert: CertifySettings) -> CertifiedLogZ | None:
    """The cache's entry for ``key`` once it checks out; None (after a warning for each entry that does not)."""
    for entry in cache.entries():
        if entry.get("key") != key:
            continue
        try:
            c = recheck(CertifiedLogZ.from_dict(cache.trusted(entry)), cert)
            verify(c, top, top_data)
            return c
        except (KeyError, TypeError, ValueError) as e:  # Untrusted is a ValueError
            what = "cannot be trusted" if isinstance(e, Untrusted) else "fails its certificate"
            print(f"warning: the log Z cache {cache.path} holds an entry for these settings that {what} ({e}); "
                  "computing log Z again", file=sys.stderr, flush=True)
    return None


def recheck(c: CertifiedLogZ, cert: CertifySettings) -> CertifiedLogZ:
    """``c`` with its choice of reverse run (``certify.choose_reverse``) and its checks (``certify.run_checks``) made
    again from its numbers; ``ValueError`` when they differ from the ones it lists."""
    if c.reverse_runs:
        chosen, _ = choose_reverse(c.reverse_runs, c.bound)
        if (chosen.source, chosen.estimate, chosen.init) != (c.reverse_source, c.reverse, c.reverse_init):
            raise ValueError(f"its reverse run from {c.reverse_source!r} is not the one its numbers choose "
                             f"({chosen.source!r})")
    fresh = replace(c, checks=[], failed=[], warnings=[])
    if cert.certify:
        run_checks(fresh, cert)
    if (set(fresh.checks), set(fresh.failed)) != (set(c.checks), set(c.failed)):
        raise ValueError(f"its checks {sorted(c.checks)} (failed {sorted(c.failed)}) do not follow from its "
                         f"numbers, which give {sorted(fresh.checks)} (failed {sorted(fresh.failed)})")
    return fresh


def verify(c: CertifiedLogZ, top, top_data: torch.Tensor) -> None:
    """Raise ``ValueError`` unless a cached certificate agrees with a fresh probe of the model: the hard lower bound
    from the deterministic probes (``certify.reference_bound``: training rows, corners, hill-climbing from a fixed
    seed), which every certificate's bound includes, may not exceed the stored bound, and each estimate whose
    hard-bound check passed must pass it again against the fresh bound."""
    if c.bound is None:
        return
    fresh = reference_bound(top, top_data)
    tol = 1e-3 + 1e-5 * abs(fresh.value)
    if not fresh.value <= c.bound.value + tol:
        raise ValueError(f"a fresh probe gives a hard lower bound {fresh.value:.3f} above the stored "
                         f"{c.bound.value:.3f}")
    for name, est in (("hard_lower_bound", c.forward), ("reverse_hard_lower_bound", c.reverse)):
        passed = est is not None and name in c.checks and name not in c.failed
        if passed and not est.log_z + 3 * est.stderr >= fresh.value - tol:
            raise ValueError(f"the stored {est.direction} log Z {est.log_z:.3f} is below a fresh hard lower bound "
                             f"{fresh.value:.3f}, yet its certificate says it passed")


def apply_log_z(result, c: CertifiedLogZ, cached: bool) -> None:
    """Put the top RBM's log Z and its certificate into a DBN estimate's ``Result``: the extras (log Z, its SE, the
    hard bound, the reverse side, the band) and ``mean_log_p_band``, the test mean over the log Z band, beside the
    statistical SE; the log Z checks and warnings join the result's own."""
    result.extras.update({**c.extras(), "log_z_cached": cached, **log_p_extras(result.mean, c, c.log_z)})
    result.carry(c)
