"""Learner registry: ``learner.name`` in the config picks one."""

from __future__ import annotations

from nvil.core.errors import ConfigError
from nvil.learners.discrete import ESTIMATORS
from nvil.learners.greedy import Greedy
from nvil.learners.mcem import MCEM, MAPLatents
from nvil.learners.nvil import NVIL
from nvil.learners.sap import SAP
from nvil.learners.wake_sleep import WakeSleep

LEARNERS = {"nvil": NVIL, "wake_sleep": WakeSleep, "greedy": Greedy, "mcem_hmc": MCEM, "map_latents": MAPLatents,
            **{mode: SAP for mode in SAP.MODES}, **ESTIMATORS}
DIRECTED = ("nvil", "wake_sleep", *ESTIMATORS)


def build_learner(cfg, model, inference, device, seed: int):
    name = cfg.get("name")
    if name not in LEARNERS:
        raise ConfigError(f"unknown learner {name!r}; known learners: {', '.join(sorted(LEARNERS))}")
    if name in DIRECTED and inference is None:
        raise ConfigError(f"learner={name} trains directed models with an inference network (model=sbn or fdarn)")
    return LEARNERS[name](model, inference, cfg, device, seed)
