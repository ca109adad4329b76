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
    """The keywords ``build_learner`` passes to the learner class that ``cfg.name`` names.

    They are the config's keys but ``DRIVER_KEYS`` (``name``, ``defaults``), with ``mode=name`` added for SAP's family
    (sap, trans_sap, pt_sap, cd, exact_ml); a key the class does not take is refused in one line naming its settings
    (``nvil.core.registry``).

    Parameters
    ----------
    cfg : Mapping
        The ``learner.*`` block: a Hydra config or any mapping with ``name`` (a key of ``LEARNERS``) and the
        learner's settings as further keys.

    Returns
    -------
    dict
        ``{setting: value}``, values as plain Python (mappings as dicts, sequences as lists), ready to pass as
        keywords to ``LEARNERS[cfg.name]``.

    Raises
    ------
    nvil.core.errors.ConfigError
        If ``name`` is not a known learner, or a key is not a setting of that learner (the message suggests the
        closest one).

    Examples
    --------
    >>> from nvil.learners import learner_settings
    >>> learner_settings({"name": "cd", "k": 5})
    {'mode': 'cd', 'k': 5}
    >>> learner_settings({"name": "nvil", "lr": 0.001, "defaults": ["_self_"]})
    {'lr': 0.001}
    """
    name = cfg.get("name")
    cls = lookup("learner", name, LEARNERS)
    mode = {"mode": name} if cls is SAP else {}
    return {**mode, **read_settings("learner", name, cfg, parameters(cls), DRIVER_KEYS)}


def build_learner(cfg, model, inference, device, seed: int):
    """Build the learner that the config ``cfg`` describes for ``model`` and its inference network.

    ``cfg`` is ``learner.*``: a Hydra config or any mapping with ``name``. The learner is
    ``LEARNERS[cfg.name](model, inference, device=device, seed=seed, **learner_settings(cfg))``, drawing from
    ``seed`` on ``device``.

    Parameters
    ----------
    cfg : Mapping
        The ``learner.*`` block: ``name`` (a key of ``LEARNERS``) and the learner's settings (``learner_settings``).
    model : torch.nn.Module
        The model to train (an SBN / fDARN for the directed learners, an RBM for SAP's family, a DBN for greedy,
        a DBM for dbm_sap, a Gaussian belief net for mcem_hmc / map_latents, a VAE for iwae).
    inference : torch.nn.Module or None
        The model's inference network q(h | x) (the directed learners need one); None for the learners that
        have none.
    device : torch.device or str
        Where the learner's random generator (and any state it keeps) lives.
    seed : int
        Seed of the learner's generator.

    Returns
    -------
    Learner
        The learner, ready for ``step(x)``.

    Raises
    ------
    nvil.core.errors.ConfigError
        If ``name`` is a directed learner (``DIRECTED``: nvil, wake_sleep and the discrete estimators) and
        ``inference`` is None (the message names the learners that train ``model``'s class), if ``name`` is not
        a known learner or a key is not one of its settings, or if the learner refuses a setting's value or
        the model.

    Examples
    --------
    >>> from nvil.models import RBM
    >>> from nvil.learners import build_learner
    >>> learner = build_learner({"name": "cd", "k": 2}, RBM(6, 4), None, "cpu", 0)
    >>> type(learner).__name__, learner.mode, learner.k
    ('SAP', 'cd', 2)
    """
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
