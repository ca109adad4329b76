"""Data drawn from small known models, so tests can compare estimators with exact enumeration.

``synthetic`` draws binary data from a small SBN with known parameters; ``synthetic_bow`` draws word counts
from a small known document model (split like a user's ``bow`` corpus); ``synthetic_dynamic`` forward-samples
real-valued sequences from a small dynamic Bayesian network. The only data module that imports ``models``.
"""

from __future__ import annotations

import math

import torch

from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.data.bow import split_documents
from nvil.data.checks import binarization as check_binarization
from nvil.data.checks import data_seed, split_sizes
from nvil.data.dataset import SPLITS, Dataset
from nvil.models.gaussian import DynamicBayesNet
from nvil.models.sbn import SBN


def synthetic_sbn(cfg, visible: str = "bernoulli"):
    """The known generating SBN behind ``data=synthetic`` and ``data=synthetic_bow`` (weights scaled by
    ``cfg.weight_scale``)."""
    n_visible, model_seed = positive_int(cfg.get("n_visible"), "data.n_visible"), data_seed(cfg, "model_seed")
    layers = cfg.get("layers")
    if (isinstance(layers, (str, int)) or layers is None or not len(layers)
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in layers)):
        raise ConfigError(f"data.layers must be a non-empty list of positive integers such as [4, 3], got {layers!r}")
    scale = cfg.get("weight_scale")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (scale >= 0 and math.isfinite(scale)):
        raise ConfigError(f"data.weight_scale must be a non-negative number, got {scale!r}")
    torch_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(model_seed)
        model = SBN(n_visible, list(layers), visible=visible)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, float(scale))
    finally:
        torch.random.set_rng_state(torch_state)
    return model


def build_synthetic(cfg) -> Dataset:
    """Binary data drawn from a small SBN whose parameters are fixed by ``cfg.model_seed``."""
    binarization = check_binarization(cfg)
    if binarization != "fixed":
        raise ConfigError(f"data=synthetic is drawn as binary data, so data.binarize={binarization} would do "
                          "nothing; leave data.binarize=fixed")
    sizes = split_sizes(cfg)
    seed = data_seed(cfg)
    model = synthetic_sbn(cfg)
    g = torch.Generator().manual_seed(seed)
    splits = {}
    for s in SPLITS:
        with torch.no_grad():
            x, _ = model.sample(sizes[s], generator=g)
        splits[s] = x
    return Dataset("synthetic", splits, {s: None for s in SPLITS}, "fixed", seed)


def build_synthetic_dynamic(cfg) -> Dataset:
    """Real-valued sequences forward-sampled from a dynamic Bayesian network whose parameters are drawn from
    N(0, weight_scale^2) with ``cfg.model_seed`` (Kingma 2013, Sec. 4.2: 100 sequences of length 10, latent and
    observed vectors of size 10). A row is [x_1, ..., x_T]."""
    length, latent_dim, obs_dim = (positive_int(cfg.get(k), f"data.{k}") for k in ("length", "latent_dim", "obs_dim"))
    sigma, visible_sigma, weight_scale = (positive_float(cfg.get(k), f"data.{k}")
                                          for k in ("sigma", "visible_sigma", "weight_scale"))
    sizes, seed, model_seed = split_sizes(cfg), data_seed(cfg), data_seed(cfg, "model_seed")
    torch_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(model_seed)
        model = DynamicBayesNet(length, latent_dim, obs_dim, visible="gaussian", sigma=sigma,
                                visible_sigma=visible_sigma, init_scale=weight_scale)
    finally:
        torch.random.set_rng_state(torch_state)
    g = torch.Generator().manual_seed(seed)
    splits = {s: model.sample(sizes[s], generator=g)[0] for s in SPLITS}
    return Dataset("synthetic_dynamic", splits, {s: None for s in SPLITS}, "continuous", seed)


def build_synthetic_bow(cfg) -> Dataset:
    """Word counts from a small known document model: an SBN with a multinomial visible layer over
    ``n_visible`` words, document lengths 1 + Poisson(``mean_length`` - 1)."""
    n, seed = positive_int(cfg.get("num_docs"), "data.num_docs"), data_seed(cfg)
    mean_length = cfg.get("mean_length")
    if (isinstance(mean_length, bool) or not isinstance(mean_length, (int, float))
            or not (mean_length >= 1 and math.isfinite(mean_length))):
        raise ConfigError(f"data.mean_length must be a number of words, at least 1, got {mean_length!r}")
    model = synthetic_sbn(cfg, visible="multinomial")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        _, hs = model.sample(n, generator=g)
        probs = model.visible_probs(hs)
        lengths = 1 + torch.poisson(torch.full((n,), float(mean_length) - 1), generator=g).long()
        words = torch.multinomial(probs, int(lengths.max()), replacement=True, generator=g)
        keep = (torch.arange(words.shape[1]) < lengths.unsqueeze(1)).float()
        counts = torch.zeros_like(probs).scatter_add_(1, words, keep)
    splits = split_documents(counts.to_sparse().coalesce(), cfg, None)
    return Dataset("synthetic_bow", splits, {s: None for s in SPLITS}, "counts", seed)
