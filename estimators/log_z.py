"""The one AIS estimate of a DBN's top-RBM log Z that every DBN estimator shares, cached beside the checkpoint.

Murray & Salakhutdinov 2009 (Fig. 2): the bound, AIS over h_1, and the Chib-style estimator "shared the same
AIS estimate of a single global normalization constant Z". It is computed once per checkpoint and AIS
settings, and kept in ``<checkpoint>.log_z.json`` under a key that holds the settings, the seed and a
fingerprint of the top RBM's parameters, so an overwritten checkpoint never reuses a stale value.
The base-rate model takes its marginals from the training data passed up through the RBMs below the top.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch

from estimators.ais import LogZ, ais_settings, base_rate, rbm_log_z, schedule
from estimators.base import chunks
from nvil.accel import check_mode


def fingerprint(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


@torch.no_grad()
def propagate_up(dbn, train: torch.Tensor, batch_size: int = 5000) -> torch.Tensor:
    """p(h_{L-1} = 1 | ...) of the training data through the RBMs below the top (the top RBM's data)."""
    out = []
    for s0, s1 in chunks(train.shape[0], batch_size):
        x = train[s0:s1]
        x = x.to_dense() if x.is_sparse else x
        for rbm in dbn.rbms[:-1]:
            x = rbm.h_given_x(x)
        out.append(x)
    return torch.cat(out)


def cache_path(checkpoint) -> Path | None:
    return None if checkpoint is None else Path(str(checkpoint) + ".log_z.json")


def top_log_z(dbn, train: torch.Tensor, cfg, checkpoint=None, progress: bool = False) -> tuple[LogZ, bool]:
    """(log Z of the top RBM, whether it came from the cache)."""
    settings = ais_settings(cfg)
    seed = int(cfg.get("seed", 0))
    key = {**settings, "seed": seed, "params": fingerprint(dbn.top)}
    path = cache_path(checkpoint) if cfg.get("cache", True) else None
    entries = _read(path)
    for entry in entries:
        if entry.get("key") == key:
            return LogZ(**{**entry["estimate"], "log_z_3sd": tuple(entry["estimate"]["log_z_3sd"])}), True
    device = dbn.top.W.device
    base = base_rate(dbn.top, propagate_up(dbn, train), settings["base_smoothing"])
    generator = torch.Generator(device=device).manual_seed(seed)
    # accel changes only the float rounding, so it is not part of the cache key
    est = rbm_log_z(dbn.top, base, settings["num_chains"], schedule(settings["schedule"], settings["num_betas"]),
                    generator, progress, check_mode(cfg.get("accel", "none"), device, "estimator.log_z.accel"))
    if path is not None:
        _write(path, entries + [{"key": key, "estimate": est.to_dict()}])
    return est, False


def _read(path: Path | None) -> list:
    if path is None or not path.exists():
        return []
    try:
        entries = json.loads(path.read_text())
        return entries if isinstance(entries, list) else []
    except (OSError, ValueError):
        print(f"warning: ignoring unreadable log Z cache {path}; it will be rewritten", file=sys.stderr)
        return []


def _write(path: Path, entries: list) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(entries, indent=1))
    os.replace(tmp, path)
