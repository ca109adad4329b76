"""Reverse AIS for an RBM's log Z: the other side of the sandwich (Grosse, Ghahramani & Adams 2015, BDMC;
Burda, Grosse & Salakhutdinov 2015, RAISE).

The chains start at beta = 1 from data and anneal back to the base-rate model through the same path and
operators as forward AIS (``estimators.ais.RBMPath``), with the betas in decreasing order. From exact
samples of the RBM, exp(log w) is unbiased for Z_0 / Z, so log Z_hat = log Z_0 - log mean exp(log w)
over-estimates log Z in expectation while forward AIS under-estimates it: the true value lies between them.
Data rows stand in for exact model samples (``init_split``): on data simulated from the model they are exact,
and the sandwich brackets every per-example log p(v) = -F(v) - log Z; on real data the reverse side is only as
trustworthy as the model's fit to those rows.
"""

from __future__ import annotations

import time

import torch

from estimators.ais import AIS, LogZ, RBMPath, ais, base_rate, free_energy_log_p, schedule
from estimators.base import Result
from nvil.data import take_rows
from nvil.errors import ConfigError


def rbm_log_z_reverse(model, base, x_init: torch.Tensor, betas: torch.Tensor, generator=None,
                      progress: bool = False, accel: str = "none") -> LogZ:
    """Reverse AIS from chains at ``x_init`` (beta = 1) to the base-rate model: log Z_hat over-estimates log Z."""
    t0 = time.perf_counter()
    path = RBMPath(model, base, accel)
    log_w, _ = ais(path, path.state(x_init), betas.flip(0), generator, progress, "reverse AIS log Z")
    return LogZ.from_log_w(log_w, path.log_z0(), "reverse", len(betas) - 1, time.perf_counter() - t0)


class RAISE(AIS):
    """``estimator=raise``: forward and reverse AIS for log Z; per-example log p(v) on both sides.
    ``mean_log_p`` is the conservative side (from the reverse-AIS log Z); ``mean_log_p_ais`` the other."""

    name = "raise"

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.init_split = cfg.get("init_split", "train")
        if self.init_split not in ("train", "valid", "test"):
            raise ConfigError(f"estimator.init_split must be train, valid or test, got {self.init_split!r}")

    def dataset_inputs(self, model, data, split, rows, **_) -> dict:
        return {"train": data.split("train"), "init": data.split(self.init_split)}

    @torch.no_grad()
    def estimate(self, model, data, *, inference=None, generator, seed: int, progress=None, train=None,
                 init=None) -> Result:
        self.check(model, inference)
        t0 = time.perf_counter()
        show = progress is not None and not progress.disable
        s = self.settings
        base = base_rate(model, train, s["base_smoothing"])
        betas = schedule(s["schedule"], s["num_betas"])
        forward = self.log_z(model, train, generator, show)
        rows = torch.randperm(init.shape[0], generator=torch.Generator().manual_seed(seed))[: s["num_chains"]]
        x_init = take_rows(init, 0, init.shape[0])[rows.to(init.device)] if init.shape[0] >= s["num_chains"] else None
        if x_init is None:
            raise ConfigError(f"estimator.num_chains={s['num_chains']} exceeds the {init.shape[0]} rows of the "
                              f"{self.init_split} split that start the reverse chains")
        reverse = rbm_log_z_reverse(model, base, x_init, betas, generator, show, self.accel)
        log_p = free_energy_log_p(model, data, reverse.log_z, self.batch_size, progress)
        gap = reverse.log_z - forward.log_z
        extras = {**reverse.extras("log_z_raise"), **forward.extras("log_z_ais"),
                  "mean_log_p_ais": round((log_p + gap).mean().item(), 4), "log_z_gap": round(gap, 4),
                  "num_betas": s["num_betas"], "schedule": s["schedule"], "init_split": self.init_split}
        return Result(self.name, log_p, time.perf_counter() - t0, seed, extras, shared_stderr=reverse.stderr)
