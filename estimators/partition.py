"""``estimator=ais`` and ``estimator=raise``: a Boltzmann machine's log Z with its certificate, and the per-example
log p(v) = -F(v) - log Z (Salakhutdinov & Murray 2008, Sec. 4.2).

Both run forward AIS from the base-rate model on the ladder ``schedule`` (``adaptive`` by default: spaced from a
pilot run so each step adds about the same log-weight variance; ``paper`` is the paper's fixed ladder) and,
unless ``certify=false``, the certificate of ``estimators.certify``: a hard lower bound from probe states,
reverse AIS from the checkpoint's persistent particles (or a Gibbs run), the ESS, and ``certified`` with the
reasons when it fails. ``raise`` runs its reverse side on the whole ladder and reports the conservative side
(the reverse log Z, hence the lower log p) as ``mean_log_p``.

Beside ``mean_log_p`` the line carries ``mean_log_p_band``, the per-example mean over the log Z band, and
``mean_log_p_hard_upper_bound`` = mean -F(v) - (hard lower bound on log Z), which no estimate can honestly exceed.
"""

from __future__ import annotations

import time

import torch

from estimators.ais_rbm import ais_settings, base_rate, check_boltzmann, free_energy_log_p
from estimators.annealing import LogZ
from estimators.base import Estimator, Result, phase_namer, shows_progress
from estimators.certify import CertifiedLogZ, certified_log_z, certify_settings, stored_particles
from nvil.accel import check_mode
from nvil.config import positive_int
from nvil.errors import ConfigError


def log_p_extras(mean_log_p: float, c: CertifiedLogZ, used_log_z: float) -> dict:
    """The test mean over the log Z band, and the hard upper bound on it, for a mean computed with ``used_log_z``."""
    out = {}
    lo, hi = c.band()
    if c.checks:
        out["mean_log_p_band"] = [None if hi is None else round(mean_log_p + used_log_z - hi, 4),
                                  round(mean_log_p + used_log_z - lo, 4)]
    if c.bound is not None:
        out["mean_log_p_hard_upper_bound"] = round(mean_log_p + used_log_z - c.bound.value, 4)
    return out


class AIS(Estimator):
    """``estimator=ais``: log Z of an RBM or semi-RBM by certified AIS, and log p(v) = -F(v) - log Z."""

    name = "ais"
    reverse_fraction = None  # None: the config's ``reverse_fraction``

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.settings = ais_settings(cfg)
        self.cert = certify_settings(cfg)
        if self.reverse_fraction is not None:
            self.cert["reverse_fraction"] = self.reverse_fraction
        self.batch_size = positive_int(cfg.get("batch_size", 1000), "estimator.batch_size")
        self.accel = check_mode(cfg.get("accel", "none"), what="estimator.accel")

    def check(self, model, inference) -> None:
        check_boltzmann(model, self.name)

    def dataset_inputs(self, model, data, split, rows, payload=None, **_) -> dict:
        return {"train": data.split("train"), "particles": stored_particles(payload, model.n_visible)}

    def certified_log_z(self, model, train, rows, generator, progress, particles=None, phase=None) -> CertifiedLogZ:
        """Base rate from ``train``; probes and (without particles) reverse-chain starts from ``rows``. ``progress``:
        inner bars for the AIS runs; ``phase(text)`` names each phase (``estimators.certify.certified_log_z``)."""
        base = base_rate(model, train, self.settings["base_smoothing"])
        return certified_log_z(model, base, self.settings, self.cert, generator, data_rows=rows, particles=particles,
                               progress=progress, accel=self.accel, phase=phase)

    def side(self, c: CertifiedLogZ) -> LogZ:
        """The log Z that ``mean_log_p`` uses: the forward estimate."""
        return c.forward

    @torch.no_grad()
    def estimate(self, model, data, *, inference=None, generator, seed: int, progress=None, train=None,
                 particles=None, init=None) -> Result:
        self.check(model, inference)
        t0 = time.perf_counter()
        phase = phase_namer(progress, self.name)
        c = self.certified_log_z(model, train, train if init is None else init, generator, shows_progress(progress),
                                 particles, phase)
        phase(None)
        if shows_progress(progress) and hasattr(progress, "reset"):
            progress.reset()  # the bar counts examples: -F(v) - log Z per batch, after the log Z phase
        side = self.side(c)
        log_p = free_energy_log_p(model, data, side.log_z, self.batch_size, progress)
        result = Result(self.name, log_p, time.perf_counter() - t0, seed,
                        {**c.extras(), "num_betas": c.forward.num_betas, "schedule": self.settings["schedule"]},
                        shared_stderr=side.stderr)
        result.extras.update(log_p_extras(result.mean, c, side.log_z))
        result.carry(c)
        return result


class RAISE(AIS):
    """``estimator=raise``: forward and reverse AIS for log Z on the whole ladder, both sides per example.
    ``mean_log_p`` is the conservative side (from the reverse log Z); ``mean_log_p_ais`` the forward one. The
    reverse chains start from the checkpoint's persistent particles (with ``reverse_burn_in`` block-Gibbs sweeps from
    them when set), else from ``reverse_burn_in`` sweeps from rows of ``init_split``: states near the model, not data
    rows themselves."""

    name = "raise"
    reverse_fraction = 1.0

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        if not self.cert["certify"]:
            raise ConfigError("estimator=raise is forward and reverse AIS; it needs estimator.certify=true")
        self.init_split = cfg.get("init_split", "train")
        if self.init_split not in ("train", "valid", "test"):
            raise ConfigError(f"estimator.init_split must be train, valid or test, got {self.init_split!r}")

    def dataset_inputs(self, model, data, split, rows, payload=None, **_) -> dict:
        return {"train": data.split("train"), "init": data.split(self.init_split),
                "particles": stored_particles(payload, model.n_visible)}

    def side(self, c: CertifiedLogZ) -> LogZ:
        """The conservative side: the reverse (over-estimated) log Z."""
        return c.reverse

    @torch.no_grad()
    def estimate(self, model, data, **kwargs) -> Result:
        result = super().estimate(model, data, **kwargs)
        gap = result.extras["log_z_reverse"] - result.extras["log_z"]
        result.extras.update({"mean_log_p_ais": round(result.mean + gap, 4), "log_z_gap": round(gap, 4),
                              "init_split": self.init_split})
        return result
