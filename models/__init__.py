"""Model registry: checkpoints name a model by a key of ``MODELS``, never by a class path; each name's builder
takes its settings as typed keywords (``build_rbm(784, n_hidden=500)``), the defaults those of
configs/model/<name>.yaml, and ``build_model(cfg, n_visible)`` reads them from a config, refusing a key the builder
does not take."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Callable

from torch import nn

from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.core.registry import keywords, lookup, read_settings
from nvil.models.dbm import DBM
from nvil.models.dbn import DBN
from nvil.models.gaussian import NONLINEARITIES, DynamicBayesNet, GaussianBeliefNet
from nvil.models.inference import LayeredInference
from nvil.models.rbm import BoltzmannMachine
from nvil.models.sbn import SBN, VISIBLES
from nvil.models.vae import VAE

RBM = BoltzmannMachine  # RBM(n_visible, n_hidden); a semi-RBM (lateral visible couplings) with lateral=True


def _layers(layers, key: str = "model.layers") -> list[int]:
    """A non-empty list of positive sizes. A bare number (``model.layers=200``) is refused with the list it probably
    meant, never iterated or wrapped silently."""
    if isinstance(layers, int) and not isinstance(layers, bool):
        example = layers if layers >= 1 else 200
        raise ConfigError(f"{key} must be a list of layer sizes such as [{example}], got the number {layers} "
                          f"(write {key}=[{example}])")
    if isinstance(layers, str) or not isinstance(layers, Sequence):
        raise ConfigError(f"{key} must be a list of layer sizes such as [200], got {_show(layers)}")
    layers = list(layers)
    if not layers or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in layers):
        raise ConfigError(f"{key} must be a non-empty list of positive integers such as [200], got {layers}")
    return layers


def _flag(value, key: str) -> bool:
    """A true/false option; ``1``, ``"yes"`` and the like are refused rather than read by truthiness."""
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {_show(value)}")
    return value


def _count(value, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    return value


def _show(value) -> str:
    return f"{value!r} (type {type(value).__name__})" if value is not None else "nothing (null or missing)"


def _directed(n_visible: int, layers: list[int], prior: str, visible: str, doc_length: int,
              inference: Mapping | None) -> tuple[nn.Module, nn.Module]:
    """An SBN / fDARN with its inference network (``inference.autoregressive``: connections within each layer)."""
    if visible not in VISIBLES:
        raise ConfigError(f"model.visible must be one of {list(VISIBLES)}, got {visible!r}")
    inference = {} if inference is None else inference
    if not isinstance(inference, Mapping):
        raise ConfigError(f"model.inference must be a group of options such as {{autoregressive: false}}, "
                          f"got {_show(inference)} (set model.inference.autoregressive=true or false)")
    unknown = [k for k in inference if k != "autoregressive"]
    if unknown:
        raise ConfigError(f"model.inference.{unknown[0]} is not a setting; the inference network's setting is "
                          "autoregressive")
    autoregressive = _flag(inference.get("autoregressive", False), "model.inference.autoregressive")
    model = SBN(n_visible, layers, prior=prior, visible=visible,
                doc_length=positive_int(doc_length, "model.doc_length"))
    return model, LayeredInference(n_visible, layers, autoregressive=autoregressive)


def build_sbn(n_visible: int, *, layers: list[int] = (200,), visible: str = "bernoulli", doc_length: int = 100,
              inference: dict = {"autoregressive": False}):  # noqa: B006  (the yaml's group, never mutated)
    """Sigmoid belief net (Neal 1992): binary layers ``layers`` [H_1 (above the data), ..., H_L], factorial prior on
    the top, Bernoulli pixels or multinomial words (``visible``, ``doc_length`` words per sampled document)."""
    return _directed(n_visible, _layers(layers), "factorial", visible, doc_length, inference)


def build_fdarn(n_visible: int, *, n_latent: int = 200, visible: str = "bernoulli", doc_length: int = 100,
                inference: dict = {"autoregressive": False}):  # noqa: B006  (the yaml's group, never mutated)
    """fDARN (Gregor et al. 2014): one layer of ``n_latent`` binary units with an autoregressive prior."""
    return _directed(n_visible, [_count(n_latent, "model.n_latent")], "autoregressive", visible, doc_length, inference)


def _boltzmann(n_visible: int, n_hidden, visible: str, labels, lateral: bool, visible_update: str = "sequential"):
    n_labels = N_LABELS if _flag(labels, "model.labels") else 0
    model = BoltzmannMachine(n_visible - n_labels, _count(n_hidden, "model.n_hidden"), visible=visible,
                             lateral=lateral, n_labels=n_labels, visible_update=visible_update)
    return model, None


def build_rbm(n_visible: int, *, n_hidden: int = 500, visible: str = "binary", labels: bool = False):
    """Restricted Boltzmann machine, binary or Gaussian (unit-variance) visibles; ``labels``: 10 one-hot label units
    joined to the hidden units."""
    return _boltzmann(n_visible, n_hidden, visible, labels, lateral=False)


def build_srbm(n_visible: int, *, n_hidden: int = 500, visible: str = "binary", labels: bool = False,
               visible_update: str = "sequential"):
    """Semi-restricted Boltzmann machine: lateral connections among the binary visibles (``visible_update``:
    sequential Gibbs over the pixels, or damped mean field for CD), optional label units."""
    return _boltzmann(n_visible, n_hidden, visible, labels, lateral=True, visible_update=visible_update)


def build_dbn(n_visible: int, *, layers: list[int] = (500, 2000)):
    """Deep belief net: a stack of binary RBMs, ``layers`` = [H_1, ..., H_L] with L >= 2, trained greedily."""
    layers = _layers(layers)
    if len(layers) < 2:
        raise ConfigError(f"model=dbn needs at least two layers, got model.layers={layers} (one layer is model=rbm)")
    return DBN(n_visible, layers), None


def build_dbm(n_visible: int, *, layers: list[int] = (500, 1000)):
    """Deep Boltzmann machine (Salakhutdinov & Hinton 2009): binary layers [H_1, ..., H_L] above the data, L >= 2,
    each joined to its neighbours only (learner=dbm_sap)."""
    layers = _layers(layers)
    if len(layers) < 2:
        raise ConfigError(f"model=dbm needs at least two layers, got model.layers={layers} (one layer is model=rbm)")
    return DBM(n_visible, layers), None


def _gaussian_options(form: str, visible: str, nonlinearity: str, sigma: float, visible_sigma: float,
                      learn_sigma: bool, init_scale: float) -> dict:
    """``GaussianNet`` checks form and visible against its tables; the rest is checked here."""
    if not isinstance(nonlinearity, str) or nonlinearity not in NONLINEARITIES:
        raise ConfigError(f"model.nonlinearity must be one of {list(NONLINEARITIES)}, got {_show(nonlinearity)}")
    scales = {key: positive_float(value, f"model.{key}")
              for key, value in (("sigma", sigma), ("visible_sigma", visible_sigma), ("init_scale", init_scale))}
    return {"form": form, "visible": visible, "nonlinearity": nonlinearity,
            "learn_sigma": _flag(learn_sigma, "model.learn_sigma"), **scales}


def build_gbn(n_visible: int, *, layers: list[int] = (64, 64), form: str = "auxiliary", visible: str = "bernoulli",
              nonlinearity: str = "tanh", sigma: float = 0.1, visible_sigma: float = 1.0, learn_sigma: bool = True,
              init_scale: float = 0.1):
    """Gaussian belief net (Kingma 2013): latent layers [n_1, ..., n_L] above the data, centred or auxiliary form."""
    return GaussianBeliefNet(n_visible, _layers(layers), **_gaussian_options(
        form, visible, nonlinearity, sigma, visible_sigma, learn_sigma, init_scale)), None


def build_dbn_dynamic(n_visible: int, *, length: int = 10, latent_dim: int = 10, obs_dim: int = 10,
                      form: str = "auxiliary", visible: str = "gaussian", nonlinearity: str = "tanh", sigma: float = 0.1,
                      visible_sigma: float = 1.0, learn_sigma: bool = True, init_scale: float = 0.1):
    """Dynamic Bayesian network (Kingma 2013, Sec. 4.2): a chain of ``length`` latent vectors, each emitting one
    observed vector; a data row is the ``length`` observed vectors side by side."""
    length, latent_dim, obs_dim = (positive_int(v, f"model.{k}") for k, v in
                                   (("length", length), ("latent_dim", latent_dim), ("obs_dim", obs_dim)))
    if length * obs_dim != n_visible:
        raise ConfigError(f"model=dbn_dynamic with length={length} and obs_dim={obs_dim} needs rows of "
                          f"{length * obs_dim} values, but the data has {n_visible}")
    return DynamicBayesNet(length, latent_dim, obs_dim, **_gaussian_options(
        form, visible, nonlinearity, sigma, visible_sigma, learn_sigma, init_scale)), None


def build_vae(n_visible: int, *, latent: list[int] = (50,), hidden: list[list[int]] = ((200, 200),)):
    """Variational autoencoder (Burda et al. 2016's architecture): Gaussian latent layers ``latent`` (one or two),
    tanh MLPs ``hidden`` (one list per stochastic layer), Bernoulli pixels; trained by learner=iwae."""
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
# The families by name: each builder takes the number of visible units and, as typed keywords, the settings of
# configs/model/<name>.yaml (its defaults those of the file, tests/test_contract.py).
MODELS: dict[str, Callable] = {"sbn": build_sbn, "fdarn": build_fdarn, "rbm": build_rbm, "srbm": build_srbm,
                               "dbn": build_dbn, "dbm": build_dbm, "gbn": build_gbn, "dbn_dynamic": build_dbn_dynamic,
                               "vae": build_vae}
DRIVER_KEYS = ("name", "defaults")  # a model config's keys that are not the builder's


def model_settings(cfg) -> dict:
    """The keywords ``build_model`` passes: the config's keys but ``DRIVER_KEYS``; a key the builder does not take
    is refused in one line naming its settings (``nvil.core.registry``)."""
    name = cfg.get("name")
    builder = lookup("model", name, MODELS)
    return read_settings("model", name, cfg, keywords(builder, exclude=("n_visible",)), DRIVER_KEYS)


def build_model(cfg, n_visible: int) -> tuple[nn.Module, nn.Module | None]:
    """(model, inference network or None) for the ``model`` config group entry ``cfg``.

    ``cfg["name"]`` picks the builder in ``MODELS``; every other key but ``DRIVER_KEYS`` is passed to it as a
    keyword (``model_settings``), so a key the builder does not take is refused in one line naming its settings.
    Only the directed models (``sbn``, ``fdarn``) come with an inference network.

    Parameters
    ----------
    cfg : Mapping
        The ``model`` config group entry: ``name`` (a key of ``MODELS``) and that model's settings, the keys of
        configs/model/<name>.yaml (``n_hidden``, ``layers``, ...), any left out at their defaults.
    n_visible : int
        The number of visible units: the width of a data row.

    Returns
    -------
    tuple of (torch.nn.Module, torch.nn.Module or None)
        The model, and its inference network q(h | x) (a ``LayeredInference``) or None for families that need
        none.

    Raises
    ------
    ConfigError
        (``nvil.core.errors``) If ``name`` is not a key of ``MODELS``, a key is not one of the builder's
        settings, or a setting's value is refused by the builder.

    Examples
    --------
    >>> from nvil.models import build_model
    >>> model, q = build_model({"name": "sbn", "layers": [4, 3]}, 6)
    >>> type(model).__name__, type(q).__name__, model.layers
    ('SBN', 'LayeredInference', [4, 3])
    >>> model, q = build_model({"name": "rbm", "n_hidden": 4}, 6)
    >>> type(model).__name__, q
    ('BoltzmannMachine', None)
    >>> build_model({"name": "rbm", "n_hiden": 4}, 6)
    Traceback (most recent call last):
        ...
    nvil.core.errors.ConfigError: model.n_hiden is not a setting of model=rbm (did you mean model.n_hidden?); ...
    """
    settings = model_settings(cfg)
    return MODELS[cfg.get("name")](n_visible, **settings)
