"""Estimator registry: ``estimator.name`` picks one; each returns an ``nvil.estimators.base.Result``.

Each class takes its settings as typed keywords, the defaults those of configs/estimator/<name>.yaml:
``AIS(num_chains=1000, num_betas=10_000).estimate(rbm, x_test, train=x_train)``. ``build_estimator(cfg)`` builds
one from a config: ``ESTIMATORS[cfg.name](**settings)``, the settings being the config's keys but those the
evaluation driver reads for itself.

A model of the user's own (``nvil.models.protocol``: ``latent``, ``log_prior``, ``log_likelihood``, optionally the
samplers and a proposal) is scored from the same registry: ``evaluate_model(model, x, estimator="ais")`` or
``build_estimator({"name": "ais", ...}, model)``. Where the registry's class does not take such a model, the name is
routed (``ROUTES``): ``ais`` and ``ais_hmc`` on a model whose latents are to be integrated out are
per-example AIS (``ModelAIS``), with that class's defaults and the settings the user gave."""

from __future__ import annotations

import inspect

from nvil.core.errors import ConfigError
from nvil.core.registry import keywords, lookup, plain, read_settings
from nvil.estimators.ais_hmc import AISHMC
from nvil.estimators.base import Result
from nvil.estimators.bounds import ELBO, IWAE, SampledBound
from nvil.estimators.chib import Chib, ChibMH
from nvil.estimators.classify import Classify
from nvil.estimators.dbm_bound import DBMBound
from nvil.estimators.dbn_bound import DBNBound
from nvil.estimators.exact import Exact
from nvil.estimators.harmonic import Harmonic
from nvil.estimators.ais_per_example import ModelAIS
from nvil.estimators.ais import AIS, RAISE
from nvil.estimators.ais_posterior import AISPosterior
from nvil.estimators.bdmc import BDMC
from nvil.estimators.smc_log_z import SMC
from nvil.estimators.smc_per_example import ModelSMC, PosteriorSMC
from nvil.estimators.settings import AISSettings, CertifySettings, LogZSettings
from nvil.estimators.budget import resolve_budget, within_budget
from nvil.models.protocol import BINARY_LATENTS, capable, follows_protocol, protocol_only

ESTIMATORS = {"iwae": IWAE, "elbo": ELBO, "exact": Exact, "classify": Classify, "ais": AIS,
              "raise": RAISE, "ais_posterior": AISPosterior, "chib": Chib, "harmonic": Harmonic,
              "dbn_bound": DBNBound, "dbm_bound": DBMBound, "ais_hmc": AISHMC, "chib_mh": ChibMH,
              "bdmc": BDMC, "smc": SMC}

# Keys of an estimator config that are not the estimator's: its name, Hydra's defaults list (a file loaded without
# Hydra), estimator.strict (nvil.app.main: a failed certificate exits with code 3) and estimator.budget
# (nvil.app.evaluation: the estimator grown within it, nvil.estimators.budget).
DRIVER_KEYS = ("name", "defaults", "strict", "budget")
# Keys the evaluation driver also reads (nvil.app.evaluation: accel for the samplers' draws, batch_size for the
# shards' edges): dropped for a class that does not take them.
SHARED_KEYS = ("accel", "batch_size")


def parameters(cls) -> list[str]:
    """The keyword settings ``cls``'s constructor takes."""
    return keywords(cls)


def estimator_settings(cfg) -> dict:
    """The keywords ``build_estimator`` passes to the registry's class that ``cfg["name"]`` names.

    They are the config's keys but ``DRIVER_KEYS``, the class's ``config_only`` and the ``SHARED_KEYS`` it does
    not take; any other key it does not take is refused in one line (``nvil.core.registry``).

    Parameters
    ----------
    cfg : Mapping
        An estimator config (``estimator.*``: a Hydra / OmegaConf node or a plain dict) with ``name``, a key of
        ``ESTIMATORS``.

    Returns
    -------
    dict
        Keyword settings for the class's constructor, values as plain Python (mappings as dicts, sequences as
        lists).

    Raises
    ------
    nvil.core.errors.ConfigError
        If ``name`` is not a key of ``ESTIMATORS``, or a key is not a setting of that class (raised by
        ``nvil.core.registry``, naming the closest setting).

    Examples
    --------
    >>> from nvil.estimators import estimator_settings
    >>> estimator_settings({"name": "ais", "num_chains": 50, "strict": True})
    {'num_chains': 50}
    >>> estimator_settings({"name": "ais", "num_chain": 50})
    Traceback (most recent call last):
    ...
    nvil.core.errors.ConfigError: estimator.num_chain is not a setting of estimator=ais (did you mean ...num_chains?); ...
    """
    name = cfg.get("name")
    cls = lookup("estimator", name, ESTIMATORS)
    known = parameters(cls)
    skip = {*DRIVER_KEYS, *cls.config_only, *(k for k in SHARED_KEYS if k not in known)}
    return read_settings("estimator", name, cfg, known, skip)


# ``estimator=NAME`` on a model the registry's own class does not take (a user's model, the VAE, a Gaussian net for
# ``ais``; an SBN or a DBN for ``smc``): the first route whose model test holds, under the config's names (left) as
# the route's class's (right; a name not listed is the same in both). The config file's defaults are the registry
# class's (a Boltzmann machine's log Z for ``ais`` and ``smc``), so only the settings the user gave are read.
ROUTES = {
    "ais": [(ModelAIS, {}, follows_protocol)],
    "ais_hmc": [(ModelAIS, {"num_runs": "num_chains"}, follows_protocol)],
    "smc": [(ModelSMC, {}, follows_protocol), (PosteriorSMC, {}, lambda m: capable(m, BINARY_LATENTS))],
}


def serves(name: str, model, inference=None) -> bool:
    """Whether the registry's class ``name`` takes ``model`` itself (its own check, at its default settings)."""
    cls = ESTIMATORS[name]
    if protocol_only(model):
        return getattr(cls, "serves_protocol", False)
    try:
        cls().check(model, inference)
    except ConfigError:
        return False
    return True


def route(name, model, inference=None):
    """(class, names) of the route of ``ROUTES`` that scores ``model`` under ``name`` in place of the registry's
    class, or None."""
    if model is None or name not in ROUTES or serves(name, model, inference):
        return None
    return next(((target, names) for target, names, applies in ROUTES[name] if applies(model)), None)


def protocol_names() -> list[str]:
    """The estimators that score a model seen through the protocol alone."""
    return sorted({*ROUTES, *(n for n, c in ESTIMATORS.items() if getattr(c, "serves_protocol", False))})


def user_settings(cfg, given=None) -> dict:
    """The keys of ``cfg`` the user set: those whose value differs from the registry class's default (a config
    file's own values are its defaults; an experiment's are the user's), and those in ``given`` (the keys named on
    the command line or as keywords, whatever their value)."""
    cls = ESTIMATORS[cfg.get("name")]
    defaults = {p.name: p.default for p in inspect.signature(cls).parameters.values()}
    given = set(given or ())
    return {key: plain(value) for key, value in cfg.items()
            if key not in DRIVER_KEYS and key not in cls.config_only
            and (key in given or key not in defaults or plain(value) != defaults[key])}


def resolve(cfg, model=None, given=None, inference=None) -> tuple[type, dict]:
    """(class, keyword settings) of the estimator ``cfg`` (``estimator.*``: a Hydra config or any mapping with
    ``name``) describes for ``model`` (None: the registry's class); where the registry's class does not take
    ``model``, the route of ``ROUTES`` with the settings the user set (``user_settings``; ``given`` names
    them). A key the class does not take is refused in one line."""
    name = cfg.get("name")
    cls = lookup("estimator", name, ESTIMATORS)
    routed = route(name, model, inference)
    if routed is not None:
        target, names = routed
        settings = {names.get(k, k): v for k, v in user_settings(cfg, given).items()}
        known = parameters(target)
        return target, read_settings("estimator", f"{name} (per example, {target.__name__}, on a "
                                     f"{type(model).__name__})", settings, known,
                                     [k for k in SHARED_KEYS if k not in known])
    if model is not None and protocol_only(model) and not getattr(cls, "serves_protocol", False):
        raise ConfigError(f"estimator={name} needs a capability a {type(model).__name__} does not declare (it follows "
                          f"the model protocol alone); use estimator={', '.join(protocol_names())}")
    return cls, estimator_settings(cfg)


def build_estimator(cfg, model=None, given=None, inference=None):
    """The estimator ``cfg`` describes for ``model`` (``resolve``): ``ESTIMATORS[cfg.name](**settings)`` or its route.

    Where the registry's class does not take ``model`` (a user's model, the VAE or a Gaussian net for ``ais``; an
    SBN or a DBN for ``smc``), the route of ``ROUTES`` is built instead, from the settings the user set.

    Parameters
    ----------
    cfg : Mapping
        An estimator config (``estimator.*``: a Hydra / OmegaConf node or a plain dict) with ``name``, a key of
        ``ESTIMATORS``, and its settings.
    model : torch.nn.Module or None, default None
        The model to be scored; None builds the registry's class.
    given : iterable of str or None, default None
        The keys named on the command line or as keywords: the user's settings whatever their value (the others
        count only where they differ from the class's default).
    inference : torch.nn.Module or None, default None
        The model's inference network Q(h | v), where it has one (an SBN's, an fDARN's), for deciding the route.

    Returns
    -------
    Estimator
        An instance of the registry's class or of its route's class (for example ``ModelAIS``).

    Raises
    ------
    nvil.core.errors.ConfigError
        Raised by ``resolve``: an unknown ``name``, a key the class does not take, or a model that follows the
        protocol alone given an estimator that needs more of it.

    Examples
    --------
    >>> from nvil.estimators import build_estimator
    >>> from nvil.models import VAE
    >>> ais = build_estimator({"name": "ais", "num_chains": 50, "num_betas": 200})
    >>> type(ais).__name__, ais.settings.num_chains, ais.settings.num_betas
    ('AIS', 50, 200)
    >>> routed = build_estimator({"name": "ais_hmc", "num_betas": 10, "num_runs": 3}, VAE(6, latent=[2], hidden=[[4]]))
    >>> type(routed).__name__, routed.num_betas, routed.num_runs
    ('ModelAIS', 10, 3)
    """
    cls, settings = resolve(cfg, model, given, inference)
    return cls(**settings)


def evaluate_model(model, x, estimator: str = "ais", *, seed: int = 0, progress=None,
                   budget: float | str | None = "auto", **settings) -> Result:
    """log p(x) of each row of ``x`` under a model following ``nvil.models.protocol``, with its certificate.

    ``estimator`` is ais | iwae | bdmc | exact; binary z also chib | ais_posterior | harmonic; continuous z chib_mh,
    with its keyword ``settings``. The estimator is checked against the model before any work starts. With a
    ``budget`` the estimator starts small and doubles its temperatures and chains until its certificate holds or
    the budget would be overrun (``nvil.estimators.budget``), the rounds in ``extras["budget"]``.

    Parameters
    ----------
    model : torch.nn.Module
        A model following ``nvil.models.protocol`` (``latent``, ``log_prior``, ``log_likelihood``, optionally the
        samplers and a proposal), or a built-in model the estimator takes.
    x : torch.Tensor
        ``[examples, ...]`` rows to score, on the device the model computes on; bdmc ignores it (it simulates its
        own data).
    estimator : str, default "ais"
        The estimator's name (``ESTIMATORS``, routed by ``ROUTES`` where the registry's class does not take the
        model: ``ais`` on such a model is per-example AIS, ``ModelAIS``).
    seed : int, default 0
        The seed of the estimate (of its first round under a budget).
    progress : tqdm or None, default None
        A progress bar counting examples; None draws none.
    budget : float or str or None, default "auto"
        Seconds the estimate may grow within. ``"auto"``: ``AUTO_SECONDS`` for an annealing estimator given no
        schedule, else the schedule given; None: the schedule given or the defaults, run once.
    **settings : Any
        The estimator's keyword settings (``num_betas=``, ``num_chains=``, ...), those of its class or its route's.

    Returns
    -------
    Result
        ``mean_log_p``, ``stderr``, ``certified``, ``warnings`` and the per-example ``log_p``.

    Raises
    ------
    nvil.core.errors.ConfigError
        If a setting is not one the estimator takes, the estimator does not serve the model, or ``budget`` is not a
        positive number of seconds (raised by ``resolve``, the estimator's ``check`` and ``nvil.estimators.budget``).
    nvil.core.errors.DataError
        If the rows of ``x`` do not suit the model (``nvil.estimators.door``).

    Examples
    --------
    >>> import torch
    >>> import nvil
    >>> from nvil.models import VAE
    >>> vae = VAE(6, latent=[2], hidden=[[4]])
    >>> x = torch.bernoulli(torch.full((4, 6), 0.5))
    >>> result = nvil.evaluate_model(vae, x, estimator="ais", num_betas=10, num_chains=4, num_leapfrog=2,
    ...                              iwae_samples=10, num_simulated=4)
    >>> result.estimator, result.log_p.shape
    ('ais', torch.Size([4]))
    >>> result.checks
    ['nonzero_estimates', 'example_ess', 'run_spread', 'reverse_order', 'reverse_gap', 'above_iwae', 'bdmc_gap', 'bdmc_order', 'likelihood_consistency']
    >>> isinstance(result.mean_log_p, float)
    True
    """
    cls, kwargs = resolve({"name": estimator, **settings}, model, given=set(settings))
    est = cls(**kwargs)
    est.check(model)
    budget = resolve_budget(cls, kwargs, budget)
    if budget is None:
        return est.estimate(model, x, seed=seed, progress=progress)
    return within_budget(cls, kwargs, budget,
                         lambda est, round_seed: est.estimate(model, x, seed=round_seed, progress=progress), seed)


__all__ = ["AIS", "AISHMC", "AISPosterior", "AISSettings", "BDMC", "CertifySettings", "Chib", "ChibMH", "Classify",
           "DBMBound", "DBNBound", "ELBO", "ESTIMATORS", "Exact", "Harmonic", "IWAE", "LogZSettings", "ModelAIS", "ModelSMC", "PosteriorSMC", "ROUTES", "RAISE", "Result", "SMC", "SampledBound", "build_estimator",
           "estimator_settings", "resolve", "evaluate_model", "protocol_names", "route", "serves"]
