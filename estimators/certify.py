"""A certificate for an AIS estimate of a Boltzmann machine's log Z: the evidence that the number can be trusted,
or the sentence that says why it cannot.

Three independent pieces of evidence, each cheap next to the forward run:

- **A hard lower bound.** Z = sum_x p*(x) = sum_h p*(h), so every state gives log Z >= log p*(state), and a set
  of distinct states gives log Z >= logsumexp of their log p*. Probes on the hidden side use
  log p*(h) = c'h + sum_i softplus(b_i + W_i h) (``BoltzmannMachine.log_unnormalised_hidden``), on the binary
  visible side -F(x): all-off, all-on and one-hot states, training rows, the persistent particles a checkpoint
  stores, every AIS end state, and joint modes found by iterated conditional modes (alternating
  x = argmax p(x | h), h = argmax p(h | x), which never lowers p*(x, h) <= min(p*(x), p*(h))) from many starts.
  An estimate below this bound is wrong, whatever its ESS says (``nvil.estimators.hard_bound``).
- **Reverse AIS** (Grosse, Ghahramani & Adams 2015; Burda, Grosse & Salakhutdinov 2015): the same path run from
  beta = 1 back to the base rate, its chains started from each of several approximations of the model (the
  forward end states resampled by their weights, stored particles, Gibbs runs from data;
  ``nvil.estimators.reverse_starts``), the run consistent with the hard bound with the highest ESS kept. From
  exact model samples it over-estimates log Z in expectation; from these starts it is a diagnostic that parts
  from the forward estimate on a coarse ladder and inverts the sandwich for a number the runs did not give, not a
  bound: a mode that no forward chain reached is the hard lower bound's to catch.
- **The forward weights' ESS**, (sum w)^2 / sum w^2: an estimate carried by a few chains is flagged.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field

import torch

from nvil.core.ops import take_rows
from nvil.estimators.ais_rbm import RBMPath, forward_run
from nvil.estimators.annealing import LogZ, make_ladder
from nvil.estimators.base import Certificate
from nvil.estimators.hard_bound import HardBound, climb, hard_lower_bound
from nvil.estimators.reverse_starts import (SOURCES, ReverseRun, check_sources, choose_reverse, gibbs_run,
                                            resampled_end_states, reverse_log_zs, reverse_starts, stored_particles,
                                            tolerance)
from nvil.estimators.settings import AISSettings, CertifySettings
from nvil.models.rbm import BoltzmannMachine

__all__ = ["DEFAULTS", "SOURCES", "AISSettings", "CertifiedLogZ", "CertifySettings", "HardBound", "ReverseRun",
           "certified_log_z", "certify_settings", "check_sources", "choose_reverse", "climb", "digest", "gibbs_run",
           "hard_lower_bound", "log_p_extras", "reference_bound", "resampled_end_states", "reverse_starts",
           "run_checks", "stored_particles"]

DEFAULTS = asdict(CertifySettings())  # the certificate's default settings, as a plain dict (for reports)

MIN_ESS = 2.0  # the forward ESS below which log Z is not certified, whatever the number of chains


def certify_settings(values=None, /, **overrides) -> CertifySettings:
    """``CertifySettings`` from a mapping (a config block) and keywords; kept for callers that hold a dict."""
    return CertifySettings.of({**dict((values or {}).items()), **overrides})


# ---- the whole certified estimate -----------------------------------------------------------------------------


@dataclass
class CertifiedLogZ(Certificate):
    """A forward AIS estimate of log Z with its certificate (``certify=false``: the forward estimate alone).
    ``reverse`` is the estimate of the reverse run ``choose_reverse`` kept, ``reverse_init`` how its chains were
    drawn, ``reverse_source`` its source and ``reverse_choice`` why; ``reverse_runs`` holds every source's run."""

    forward: LogZ
    ladder: dict
    bound: HardBound | None = None
    reverse: LogZ | None = None
    reverse_init: str | None = None
    checks: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    seconds: dict = field(default_factory=dict)
    failed: list = field(default_factory=list)
    reverse_source: str | None = None
    reverse_choice: str | None = None
    reverse_runs: list = field(default_factory=list)

    @property
    def log_z(self) -> float:
        return self.forward.log_z

    @property
    def stderr(self) -> float:
        return self.forward.stderr

    def sandwich(self) -> tuple[float, float | None]:
        """[forward, reverse] (ordered), the raw stochastic sandwich, its low end floored by the hard bound; high is
        None without a reverse run. Not an interval for log Z: each side carries Monte Carlo error (``band``)."""
        lo = self.forward.log_z if self.reverse is None else min(self.forward.log_z, self.reverse.log_z)
        if self.bound is not None:
            lo = max(lo, self.bound.value)
        hi = None if self.reverse is None else max(self.forward.log_z, self.reverse.log_z, lo)
        return lo, hi

    def band(self) -> tuple[float | None, float | None]:
        """[low, high]: the interval for log Z printed beside the estimate, the sandwich widened by the Monte Carlo
        error of each side: from the lower to the upper end of both sides' 3-sigma intervals log(Z_hat -/+ 3
        sigma_hat) (``annealing.LogZ.log_z_3sd``, the delta method), the low end floored by the hard bound. An end
        a side cannot bound (Z_hat - 3 sigma_hat <= 0) is open: low None without a hard bound, high None where the
        reverse side's upper end is open or there is no reverse run."""
        sides = [self.forward] + ([self.reverse] if self.reverse is not None else [])
        lows = [side.log_z_3sd[0] for side in sides]
        lo = None if any(v is None for v in lows) else min(lows)
        if self.bound is not None:
            lo = self.bound.value if lo is None else max(lo, self.bound.value)
        highs = [side.log_z_3sd[1] for side in sides]
        hi = None if self.reverse is None or any(v is None for v in highs) else max(highs)
        if hi is not None and lo is not None:
            hi = max(hi, lo)
        return lo, hi

    def extras(self, prefix: str = "log_z") -> dict:
        r = lambda v: None if v is None else round(v, 4)  # noqa: E731
        out = {**self.forward.extras(prefix), f"{prefix}_schedule": self.ladder}
        if self.bound is not None:
            out.update({f"{prefix}_lower_bound": r(self.bound.value), f"{prefix}_lower_bound_probe": self.bound.source,
                        f"{prefix}_num_probes": self.bound.num_probes})
        if self.reverse is not None:
            out.update({f"{prefix}_reverse": r(self.reverse.log_z), f"{prefix}_reverse_stderr": r(self.reverse.stderr),
                        f"{prefix}_reverse_ess": round(self.reverse.ess, 2),
                        f"{prefix}_reverse_num_betas": self.reverse.num_betas,
                        f"{prefix}_reverse_init": self.reverse_init,
                        f"{prefix}_reverse_is": "a stochastic upper estimate only from exact model samples; from "
                                                "approximate ones (resampled forward end states, stored particles, "
                                                "Gibbs runs from data) a diagnostic that parts from the forward "
                                                "estimate on a coarse ladder, not a bound"})
        if self.reverse_source is not None:
            out.update({f"{prefix}_reverse_source": self.reverse_source,
                        f"{prefix}_reverse_choice": self.reverse_choice,
                        f"{prefix}_reverse_runs": {
                            run.source: {"log_z": r(run.estimate.log_z), "stderr": r(run.estimate.stderr),
                                         "ess": round(run.estimate.ess, 2), "num_chains": run.estimate.num_chains,
                                         "log_w_sd": r(run.estimate.log_w_sd), "init": run.init}
                            for run in self.reverse_runs}})
        if self.checks:
            out[f"{prefix}_band"] = [r(v) for v in self.band()]
            out[f"{prefix}_sandwich"] = [r(v) for v in self.sandwich()]
            out[f"{prefix}_certified"] = self.certified
        out[f"{prefix}_seconds"] = {k: round(v, 3) for k, v in self.seconds.items()}
        return out

    # ---- the log Z cache (estimators/log_z.py) ---------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d["digest"] = digest(d)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "CertifiedLogZ":
        """Rebuild a cached certificate; ``ValueError`` when its digest does not match its contents. The digest is
        unkeyed, so it catches damage, not forgery: the cache's HMAC does that (``nvil.estimators.log_z_cache``)."""
        d = dict(d)
        if d.pop("digest", None) != digest(d):
            raise ValueError("its digest does not match its contents")

        def logz(e):
            return None if e is None else LogZ(**{**e, "log_z_3sd": tuple(e["log_z_3sd"])})

        bound = None if d.get("bound") is None else HardBound(**d["bound"])
        runs = [ReverseRun(e["source"], e["init"], logz(e["estimate"])) for e in d.get("reverse_runs") or []]
        return cls(logz(d["forward"]), d["ladder"], bound, logz(d.get("reverse")), d.get("reverse_init"),
                   list(d.get("checks", [])), list(d.get("warnings", [])), dict(d.get("seconds", {})),
                   list(d.get("failed", [])), d.get("reverse_source"), d.get("reverse_choice"), runs)


def digest(d: dict) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:24]


def run_checks(c: CertifiedLogZ, settings: CertifySettings) -> None:
    """The checks, each with the sentence a user sees when it fails."""
    fwd = c.forward
    fix = {"adaptive": "more betas or more chains",
           "smc": "a higher estimator.cess, more particles or more runs"}.get(
        c.ladder.get("schedule"), "estimator.schedule=adaptive, more betas or more chains")

    # At least MIN_ESS chains' worth: with few chains the fraction alone asks for less than one, and an estimate one
    # chain carries has no standard error to speak of.
    min_ess = max(settings.min_ess_fraction * fwd.num_chains, MIN_ESS)
    c.check("ess", fwd.ess >= min_ess,
          f"forward AIS ESS is {fwd.ess:.1f} of {fwd.num_chains} chains (below {min_ess:.0f}): log Z rests on a few "
          f"chains; use {fix}")
    if c.bound is not None:
        # A hard bound beats any estimate, but the estimate is random: fail where it is below by more than 3 SE.
        c.check("hard_lower_bound", fwd.log_z + 3 * fwd.stderr >= c.bound.value - tolerance(c.bound.value),
              f"log Z {fwd.log_z:.2f} is below the hard lower bound {c.bound.value:.2f} (log p* of "
              f"{c.bound.source}): the AIS ladder is too coarse or the chains miss a mode; try {fix}")
    if c.reverse is not None:
        rev = c.reverse
        se = math.sqrt(fwd.stderr**2 + rev.stderr**2)
        c.check("sandwich_order", rev.log_z >= fwd.log_z - 3 * se - tolerance(fwd.log_z),
              f"reverse AIS log Z {rev.log_z:.2f} is below forward AIS log Z {fwd.log_z:.2f} by more than 3 SE: the "
              f"sandwich is inverted, so one side is wrong (reverse chains from {c.reverse_init} may not represent "
              "the model; try estimator.reverse_burn_in=N sweeps before the reverse run, more betas or more chains)")
        gap = rev.log_z - fwd.log_z
        c.check("sandwich_gap", gap <= settings.max_gap,
              f"forward and reverse AIS disagree by {gap:.2f} nats (more than estimator.max_gap="
              f"{settings.max_gap}): log Z lies somewhere in [{fwd.log_z:.2f}, {rev.log_z:.2f}]; use more betas "
              "or chains")
        if c.bound is not None:
            c.check("reverse_hard_lower_bound", rev.log_z + 3 * rev.stderr >= c.bound.value - tolerance(c.bound.value),
                  f"reverse AIS log Z {rev.log_z:.2f} is below the hard lower bound {c.bound.value:.2f}: its chains "
                  f"({c.reverse_init}) miss the mode at {c.bound.source}")


@torch.no_grad()
def certified_log_z(model: BoltzmannMachine, base, settings: AISSettings, cert: CertifySettings, generator=None, *,
                    data_rows: torch.Tensor | None = None, particles: torch.Tensor | None = None,
                    progress: bool = False, accel: str = "none", phase=None, sources=SOURCES,
                    sampler=None) -> CertifiedLogZ:
    """Forward AIS for log Z on the ladder ``settings.schedule`` (adaptive: from a pilot run), and, with
    ``cert.certify``, its certificate: the hard lower bound from probes (``reference_bound``'s among them), one
    reverse AIS run on ``reverse_fraction`` of the betas with chains from each of ``sources`` (``reverse_starts``:
    the forward end states resampled by their weights, ``particles``, Gibbs runs from ``data_rows``), the run
    ``choose_reverse`` keeps, and the checks (``run_checks``). One path (and its compiled kernels) and one ladder serve every run: the pilot, forward and
    reverse. ``progress``: inner bars for the forward and reverse runs; ``phase(text)`` is told each phase as it
    starts (``log Z (forward AIS, 2/4)``), for the evaluation bar's description. ``sampler``: a forward sampler in
    place of the ladder and forward AIS (``nvil.estimators.smc.SMCSampler``: ``steps``, ``run(path, generator,
    progress, announce) -> (ForwardRun, Ladder)``, ``reverse(K, cert) -> (chains, steps)`` on its ladder)."""
    settings, cert = AISSettings.of(settings), CertifySettings.of(cert)  # a dict of either is accepted too
    sources = check_sources(sources)
    first = (sampler.steps if sampler is not None
             else (["pilot AIS"] if settings.schedule == "adaptive" else []) + ["forward AIS"])
    steps = first + (["hard-bound probes", "reverse AIS"] if cert.certify else [])

    def announce(step: str) -> None:
        if phase is not None:
            phase(f"log Z ({step}, {steps.index(step) + 1}/{len(steps)})")

    seconds = {}
    t0 = time.perf_counter()
    path = RBMPath(model, base, accel)
    n, K = settings.num_chains, settings.num_betas
    if sampler is not None:
        forward, ladder = sampler.run(path, generator, progress, announce)
        betas = ladder.betas(ladder.pilot_steps)
        K = len(betas) - 1
        seconds["forward"] = time.perf_counter() - t0
    else:
        if settings.schedule == "adaptive":
            announce("pilot AIS")
        ladder = make_ladder(settings.schedule, K, pilot=lambda: (path, path.sample_base(n, generator)),
                             generator=generator, pilot_fraction=cert.pilot_fraction)
        seconds["pilot"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        announce("forward AIS")
        betas = ladder.betas(K)  # built once: the forward run walks it, and the reverse run too when it has K steps
        forward = forward_run(path, n, betas, generator, progress)
        seconds["forward"] = time.perf_counter() - t1
    c = CertifiedLogZ(forward.estimate, ladder.extras(), seconds=seconds)
    if not cert.certify:
        return c
    t2 = time.perf_counter()
    announce("hard-bound probes")
    rows = None
    if data_rows is not None and len(data_rows):
        idx = torch.randperm(len(data_rows), generator=torch.Generator().manual_seed(1))[: cert.num_data_probes]
        rows = data_rows[idx.to(data_rows.device)]
        rows = rows.to_dense() if rows.is_sparse else rows
    c.bound = max(hard_lower_bound(model, {"training rows": rows, "persistent particles": particles,
                                           "AIS end states": forward.end.x}, generator, cert.num_climb),
                  reference_bound(model, data_rows), key=lambda b: b.value)
    seconds["probes"] = time.perf_counter() - t2
    t3 = time.perf_counter()
    announce("reverse AIS")
    n, k_rev = (n, max(1, round(cert.reverse_fraction * K))) if sampler is None else sampler.reverse(K, cert)
    starts = reverse_starts(model, n, sources, forward=forward, particles=particles, rows=rows, num_betas=K,
                            burn_in=cert.reverse_burn_in, generator=generator)
    estimates = reverse_log_zs(path, [x for _, x, _ in starts], betas if k_rev == K else ladder.betas(k_rev),
                               generator, progress)
    c.reverse_runs = [ReverseRun(source, how, est) for (source, _, how), est in zip(starts, estimates)]
    chosen, c.reverse_choice = choose_reverse(c.reverse_runs, c.bound)
    c.reverse, c.reverse_init, c.reverse_source = chosen.estimate, chosen.init, chosen.source
    seconds["reverse"] = time.perf_counter() - t3
    run_checks(c, cert)
    return c


def reference_bound(model: BoltzmannMachine, rows: torch.Tensor | None) -> HardBound:
    """The hard lower bound from fixed probes: the first 1000 ``rows``, the corner states and 64 hill-climbs from a
    generator seeded 0. A cached certificate is checked against it (``nvil.estimators.log_z.verify``); it is
    deterministic and part of the bound of every certificate ``certified_log_z`` makes, so it never exceeds one."""
    g = torch.Generator(device=model.W.device).manual_seed(0)
    probes = {"training rows": take_rows(rows, 0, 1000)} if rows is not None and len(rows) else {}
    return hard_lower_bound(model, probes, g, num_climb=64)


def log_p_extras(mean_log_p: float, c: CertifiedLogZ, used_log_z: float) -> dict:
    """The test mean over the log Z band, and the hard upper bound on it, for a mean computed with ``used_log_z``."""
    out = {}
    lo, hi = c.band()
    if c.checks:
        out["mean_log_p_band"] = [None if hi is None else round(mean_log_p + used_log_z - hi, 4),
                                  None if lo is None else round(mean_log_p + used_log_z - lo, 4)]
    if c.bound is not None:
        out["mean_log_p_hard_upper_bound"] = round(mean_log_p + used_log_z - c.bound.value, 4)
    return out
