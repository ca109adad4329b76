"""Learner registry: ``learner.name`` in the config picks one.

Each class takes its settings as typed keywords, the defaults those of configs/learner/<name>.yaml:
``SAP(rbm, None, lr=0.01, num_particles=100, k=1).step(x)``, ``NVIL(sbn, q, optimizer="sgd", lr=0.006)``; the
Boltzmann-machine learners sap, trans_sap, pt_sap, cd and exact_ml are one class, ``SAP(..., mode=name)``.
``build_learner(cfg, model, inference, device, seed)`` builds one from a config: ``LEARNERS[cfg.name](model,
inference, device=device, seed=seed, **learner_settings(cfg))``."""

from __future__ import annotations

from nvil.core.errors import ConfigError
from nvil.core.registry import keywords, lookup, read_settings
from nvil.learners.discrete import ARM, ESTIMATORS, REBAR, RELAX, RLOO, VIMCO, DisARM, GumbelST
from nvil.learners.dbm import DBMSAP
from nvil.learners.greedy import Greedy
from nvil.learners.iwae import ImportanceWeighted
from nvil.learners.mcem import MCEM, MAPLatents
from nvil.learners.nvil import NVIL
from nvil.learners.sap import SAP
from nvil.learners.settings import PTSettings, SAPSettings, ScheduleSettings, TTSettings
from nvil.learners.wake_sleep import WakeSleep

LEARNERS = {"nvil": NVIL, "wake_sleep": WakeSleep, "greedy": Greedy, "dbm_sap": DBMSAP, "mcem_hmc": MCEM, "map_latents": MAPLatents,
            "iwae": ImportanceWeighted,
            **{mode: SAP for mode in SAP.MODES}, **ESTIMATORS}
DIRECTED = ("nvil", "wake_sleep", *ESTIMATORS)
# The learners that train each built-in model class, named where a learner is given a model it does not train.
TRAINED_BY = {"BoltzmannMachine": SAP.MODES, "DBM": ("dbm_sap",), "DBN": ("greedy",),
              "GaussianBeliefNet": ("mcem_hmc", "map_latents"), "VAE": ("iwae",)}
# Keys of a learner config that are not settings: its name (SAP's ``mode`` for the Boltzmann-machine learners) and
# Hydra's defaults list (a file loaded without Hydra).
DRIVER_KEYS = ("name", "defaults")
# Keywords every constructor takes that come from the run, not the learner's config.
RUN_KEYWORDS = ("device", "seed", "mode")


def parameters(cls) -> list[str]:
    """The settings ``cls``'s constructor takes as keywords (not the model, inference network, device or seed)."""
    return keywords(cls, exclude=RUN_KEYWORDS, keyword_only=True)


def learner_settings(cfg) -> dict:
    """The keywords ``build_learner`` passes: the config's keys but ``DRIVER_KEYS`` (with ``mode=name`` for SAP's
    family); a key the class does not take is refused in one line naming its settings (``nvil.core.registry``)."""
    name = cfg.get("name")
    cls = lookup("learner", name, LEARNERS)
    mode = {"mode": name} if cls is SAP else {}
    return {**mode, **read_settings("learner", name, cfg, parameters(cls), DRIVER_KEYS)}


def build_learner(cfg, model, inference, device, seed: int):
    """The learner ``cfg`` (``learner.*``: a Hydra config or any mapping with ``name``) describes, for ``model`` (and
    its ``inference`` network), drawing from ``seed`` on ``device``."""
    settings = learner_settings(cfg)
    name = cfg.get("name")
    if name in DIRECTED and inference is None:
        others = TRAINED_BY.get(type(model).__name__, ())
        named = " or ".join(filter(None, [", ".join(others[:-1]), *others[-1:]]))
        hint = f"; this model trains with learner={named}" if others else ""
        raise ConfigError(f"learner={name} trains directed models with an inference network (model=sbn or "
                          f"fdarn){hint}")
    return LEARNERS[name](model, inference, device=device, seed=seed, **settings)


__all__ = ["ARM", "DBMSAP", "DIRECTED", "DisARM", "Greedy", "GumbelST", "ImportanceWeighted", "LEARNERS", "MAPLatents", "MCEM", "NVIL", "PTSettings",
           "REBAR", "RELAX", "RLOO", "SAP", "SAPSettings", "ScheduleSettings", "TTSettings", "VIMCO", "WakeSleep",
           "build_learner", "learner_settings", "parameters"]
