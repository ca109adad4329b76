"""Model registry: checkpoints name a model by a key of ``MODELS``, never by a class path."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Callable

from torch import nn

from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.core.registry import lookup
from nvil.models.dbm import DBM
from nvil.models.dbn import DBN
from nvil.models.gaussian import NONLINEARITIES, DynamicBayesNet, GaussianBeliefNet
from nvil.models.inference import LayeredInference
from nvil.models.rbm import BoltzmannMachine
from nvil.models.sbn import PRIORS, SBN, VISIBLES
from nvil.models.vae import VAE

RBM = BoltzmannMachine  # RBM(n_visible, n_hidden); a semi-RBM (lateral visible couplings) with lateral=True


def _layers(cfg) -> list[int]:
    """``model.layers``: a non-empty list of positive sizes. A bare number (``model.layers=200``) is refused
    with the list it probably meant, never iterated or wrapped silently."""
    layers = cfg.get("layers")
    if isinstance(layers, int) and not isinstance(layers, bool):
        example = layers if layers >= 1 else 200
        raise ConfigError(f"model.layers must be a list of layer sizes such as [{example}], got the number {layers} "
                          f"(write model.layers=[{example}])")
    if isinstance(layers, str) or not isinstance(layers, Sequence):
        raise ConfigError(f"model.layers must be a list of layer sizes such as [200], got {_show(layers)}")
    layers = list(layers)
    if not layers or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in layers):
        raise ConfigError(f"model.layers must be a non-empty list of positive integers such as [200], got {layers}")
    return layers


def _flag(cfg, key: str, default: bool, prefix: str = "model") -> bool:
    """A true/false option; ``1``, ``"yes"`` and the like are refused rather than read by truthiness."""
    value = cfg.get(key, default)
    if value is None:
        value = default
    if not isinstance(value, bool):
        raise ConfigError(f"{prefix}.{key} must be true or false, got {_show(value)}")
    return value


def _show(value) -> str:
    return f"{value!r} (type {type(value).__name__})" if value is not None else "nothing (null or missing)"


def _options(cfg) -> dict:
    visible = cfg.get("visible", "bernoulli")
    if visible not in VISIBLES:
        raise ConfigError(f"model.visible must be one of {list(VISIBLES)}, got {visible!r}")
    inference = cfg.get("inference")
    if inference is None:
        inference = {}
    if not isinstance(inference, Mapping):
        raise ConfigError(f"model.inference must be a group of options such as {{autoregressive: false}}, "
                          f"got {_show(inference)} (set model.inference.autoregressive=true or false)")
    return {"visible": visible, "doc_length": positive_int(cfg.get("doc_length", 100), "model.doc_length"),
            "autoregressive_q": _flag(inference, "autoregressive", False, prefix="model.inference")}


def _build(n_visible: int, layers: list[int], prior: str, opts: dict) -> tuple[nn.Module, nn.Module]:
    assert prior in PRIORS
    model = SBN(n_visible, layers, prior=prior, visible=opts["visible"], doc_length=opts["doc_length"])
    return model, LayeredInference(n_visible, layers, autoregressive=opts["autoregressive_q"])


def _build_sbn(cfg, n_visible: int):
    return _build(n_visible, _layers(cfg), "factorial", _options(cfg))


def _build_fdarn(cfg, n_visible: int):
    """fDARN: one layer of n_latent binary units with an autoregressive prior, factorial visibles."""
    n = cfg.get("n_latent")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"model.n_latent must be a positive integer, got {n!r}")
    return _build(n_visible, [n], "autoregressive", _options(cfg))


def _build_boltzmann(cfg, n_visible: int, lateral: bool):
    n_hidden = cfg.get("n_hidden")
    if isinstance(n_hidden, bool) or not isinstance(n_hidden, int) or n_hidden < 1:
        raise ConfigError(f"model.n_hidden must be a positive integer, got {n_hidden!r}")
    n_labels = N_LABELS if _flag(cfg, "labels", False) else 0
    model = BoltzmannMachine(n_visible - n_labels, n_hidden, visible=cfg.get("visible", "binary"), lateral=lateral,
                             n_labels=n_labels, visible_update=cfg.get("visible_update", "sequential"))
    return model, None


def _build_rbm(cfg, n_visible: int):
    """Restricted Boltzmann machine, binary or Gaussian (unit-variance) visibles."""
    return _build_boltzmann(cfg, n_visible, lateral=False)


def _build_srbm(cfg, n_visible: int):
    """Semi-restricted BM: lateral connections among the binary visibles, optional label units."""
    return _build_boltzmann(cfg, n_visible, lateral=True)


def _build_dbn(cfg, n_visible: int):
    """Deep belief net: a stack of binary RBMs, model.layers = [H_1, ..., H_L] with L >= 2, trained greedily."""
    layers = _layers(cfg)
    if len(layers) < 2:
        raise ConfigError(f"model=dbn needs at least two layers, got model.layers={layers} (one layer is model=rbm)")
    return DBN(n_visible, layers), None


def _build_dbm(cfg, n_visible: int):
    """Deep Boltzmann machine (Salakhutdinov & Hinton 2009): binary layers [H_1, ..., H_L] above the data, L >= 2,
    each joined to its neighbours only (learner=dbm_sap)."""
    layers = _layers(cfg)
    if len(layers) < 2:
        raise ConfigError(f"model=dbm needs at least two layers, got model.layers={layers} (one layer is model=rbm)")
    return DBM(n_visible, layers), None


def _gaussian_options(cfg, visible_default: str) -> dict:
    """``GaussianNet`` checks form and visible against its tables; the rest is checked here."""
    nonlinearity = cfg.get("nonlinearity", "tanh")
    if not isinstance(nonlinearity, str) or nonlinearity not in NONLINEARITIES:
        raise ConfigError(f"model.nonlinearity must be one of {list(NONLINEARITIES)}, got {_show(nonlinearity)}")
    scales = {key: positive_float(cfg.get(key, default), f"model.{key}")
              for key, default in (("sigma", 0.1), ("visible_sigma", 1.0), ("init_scale", 0.1))}
    return {"form": cfg.get("form", "auxiliary"), "visible": cfg.get("visible", visible_default),
            "nonlinearity": nonlinearity, "learn_sigma": _flag(cfg, "learn_sigma", True), **scales}


def _build_gbn(cfg, n_visible: int):
    """Gaussian belief net (Kingma 2013): latent layers [n_1, ..., n_L] above the data, centred or auxiliary form."""
    return GaussianBeliefNet(n_visible, _layers(cfg), **_gaussian_options(cfg, "bernoulli")), None


def _build_dbn_dynamic(cfg, n_visible: int):
    """Dynamic Bayesian network (Kingma 2013, Sec. 4.2): a chain of ``length`` latent vectors, each emitting one
    observed vector; a data row is the ``length`` observed vectors side by side."""
    length, latent, obs = (positive_int(cfg.get(k), f"model.{k}") for k in ("length", "latent_dim", "obs_dim"))
    if length * obs != n_visible:
        raise ConfigError(f"model=dbn_dynamic with length={length} and obs_dim={obs} needs rows of {length * obs} "
                          f"values, but the data has {n_visible}")
    return DynamicBayesNet(length, latent, obs, **_gaussian_options(cfg, "gaussian")), None


def _build_vae(cfg, n_visible: int):
    """Variational autoencoder (Burda et al. 2016's architecture): Gaussian latent layers ``latent`` (one or two),
    tanh MLPs ``hidden`` (one list per stochastic layer), Bernoulli pixels; trained by learner=iwae."""
    latent, hidden = cfg.get("latent"), cfg.get("hidden")
    if isinstance(latent, int) and not isinstance(latent, bool):
        raise ConfigError(f"model.latent must be a list of layer sizes such as [{latent}] (write model.latent=[{latent}])")
    if (isinstance(latent, str) or not isinstance(latent, Sequence) or isinstance(hidden, str)
            or not isinstance(hidden, Sequence) or any(isinstance(h, str) or not isinstance(h, Sequence) for h in hidden)):
        raise ConfigError(f"model.latent must be a list such as [50] and model.hidden a list of lists such as "
                          f"[[200, 200]], got latent={_show(latent)}, hidden={_show(hidden)}")
    if any(isinstance(n, bool) or not isinstance(n, int) for n in [*latent, *(n for h in hidden for n in h)]):
        raise ConfigError(f"model.latent and model.hidden must hold positive integers, got {list(latent)}, "
                          f"{[list(h) for h in hidden]}")
    return VAE(n_visible, list(latent), [list(h) for h in hidden]), None


N_LABELS = 10
MODELS: dict[str, Callable] = {"sbn": _build_sbn, "fdarn": _build_fdarn, "rbm": _build_rbm, "srbm": _build_srbm,
                               "dbn": _build_dbn, "dbm": _build_dbm, "gbn": _build_gbn, "dbn_dynamic": _build_dbn_dynamic,
                               "vae": _build_vae}


def build_model(cfg, n_visible: int) -> tuple[nn.Module, nn.Module | None]:
    """(model, inference network or None) for the ``model`` config group entry ``cfg``."""
    return lookup("model", cfg.get("name"), MODELS)(cfg, n_visible)
