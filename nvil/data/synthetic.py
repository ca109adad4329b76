"""Data drawn from small known models, so tests can compare estimators with exact enumeration.

``synthetic`` (``synthetic_data``) draws binary data from a small SBN with known parameters; ``synthetic_bow``
(``synthetic_bow_data``) draws word counts from a small known document model (split like a user's ``bow`` corpus);
``synthetic_dynamic`` (``synthetic_dynamic_data``) forward-samples real-valued sequences from a small dynamic
Bayesian network. The only data module that imports ``models``."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from nvil.core.config import positive_float, positive_int
from nvil.core.errors import ConfigError
from nvil.data.bow import split_documents
from nvil.data.checks import binarization as check_binarization
from nvil.data.checks import data_seed, layer_sizes, non_negative, split_sizes
from nvil.data.dataset import SPLITS, Dataset
from nvil.models.gaussian import DynamicBayesNet
from nvil.models.sbn import SBN


def synthetic_sbn(*, n_visible: int, layers: Sequence[int], weight_scale: float, model_seed: int,
                  visible: str = "bernoulli") -> SBN:
    """The known generating SBN behind ``data=synthetic`` and ``data=synthetic_bow``: ``n_visible`` visible units
    over hidden ``layers``, every parameter drawn from N(0, ``weight_scale``^2) with the seed ``model_seed`` (the
    global torch generator is left as it was)."""
    n_visible, model_seed = positive_int(n_visible, "data.n_visible"), data_seed(model_seed, "model_seed")
    layers = layer_sizes(layers)
    scale = non_negative(weight_scale, "weight_scale")
    torch_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(model_seed)
        model = SBN(n_visible, layers, visible=visible)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, scale)
    finally:
        torch.random.set_rng_state(torch_state)
    return model


def synthetic_data(*, binarize: str = "fixed", seed: int = 0, model_seed: int = 1, n_visible: int = 12,
                   layers: Sequence[int] = (4, 3), weight_scale: float = 1.5, num_train: int = 5000,
                   num_valid: int = 500, num_test: int = 500) -> Dataset:
    """``data=synthetic`` (configs/data/synthetic.yaml): binary data drawn from a small SBN with known parameters,
    for tests with exact answers.

    ``binarize``: must stay ``fixed`` (the data are drawn binary). ``seed``: the draws of the splits.
    ``model_seed``, ``n_visible``, ``layers``, ``weight_scale``: the generating SBN (``synthetic_sbn``).
    ``num_train``, ``num_valid``, ``num_test``: the split sizes."""
    binarization = check_binarization(binarize)
    if binarization != "fixed":
        raise ConfigError(f"data=synthetic is drawn as binary data, so data.binarize={binarization} would do "
                          "nothing; leave data.binarize=fixed")
    sizes = split_sizes(num_train, num_valid, num_test)
    seed = data_seed(seed)
    model = synthetic_sbn(n_visible=n_visible, layers=layers, weight_scale=weight_scale, model_seed=model_seed)
    g = torch.Generator().manual_seed(seed)
    splits = {}
    for s in SPLITS:
        with torch.no_grad():
            x, _ = model.sample(sizes[s], generator=g)
        splits[s] = x
    return Dataset("synthetic", splits, {s: None for s in SPLITS}, "fixed", seed)


def synthetic_dynamic_data(*, seed: int = 0, model_seed: int = 1, length: int = 10, latent_dim: int = 10,
                           obs_dim: int = 10, weight_scale: float = 1.0, sigma: float = 0.1,
                           visible_sigma: float = 0.5, num_train: int = 100, num_valid: int = 100,
                           num_test: int = 100) -> Dataset:
    """``data=synthetic_dynamic`` (configs/data/synthetic_dynamic.yaml; use with model=dbn_dynamic): real-valued
    sequences forward-sampled from a dynamic Bayesian network whose parameters are drawn from N(0, weight_scale^2)
    with ``model_seed`` (Kingma 2013, Sec. 4.2: 100 training sequences of length 10, latent and observed vectors of
    size 10). A row is [x_1, ..., x_T].

    ``seed``: the sequences drawn. ``length``: T. ``latent_dim``, ``obs_dim``: the sizes of z_t and x_t.
    ``sigma``, ``visible_sigma``: the latent and observed noise scales. ``num_train``, ``num_valid``,
    ``num_test``: the split sizes."""
    length, latent_dim, obs_dim = (positive_int(v, f"data.{k}") for k, v in
                                   (("length", length), ("latent_dim", latent_dim), ("obs_dim", obs_dim)))
    sigma, visible_sigma, weight_scale = (positive_float(v, f"data.{k}") for k, v in
                                          (("sigma", sigma), ("visible_sigma", visible_sigma),
                                           ("weight_scale", weight_scale)))
    sizes = split_sizes(num_train, num_valid, num_test)
    seed, model_seed = data_seed(seed), data_seed(model_seed, "model_seed")
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


def synthetic_bow_data(*, seed: int = 0, model_seed: int = 1, n_visible: int = 50, layers: Sequence[int] = (5,),
                       weight_scale: float = 2.0, num_docs: int = 3000, mean_length: float = 40,
                       test_fraction: float = 0.1, num_valid: int = 100) -> Dataset:
    """``data=synthetic_bow`` (configs/data/synthetic_bow.yaml): word counts drawn from a small known document
    model, an SBN (``synthetic_sbn``: ``model_seed``, ``layers``, ``weight_scale``) with a multinomial visible layer
    over ``n_visible`` words (the vocabulary size); ``num_docs`` documents of lengths 1 + Poisson(``mean_length`` -
    1), drawn with ``seed`` and split like a user's ``bow`` corpus (``test_fraction`` for testing, ``num_valid``
    for validation)."""
    n, seed = positive_int(num_docs, "data.num_docs"), data_seed(seed)
    if (isinstance(mean_length, bool) or not isinstance(mean_length, (int, float))
            or not (mean_length >= 1 and math.isfinite(mean_length))):
        raise ConfigError(f"data.mean_length must be a number of words, at least 1, got {mean_length!r}")
    model = synthetic_sbn(n_visible=n_visible, layers=layers, weight_scale=weight_scale, model_seed=model_seed,
                          visible="multinomial")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        _, hs = model.sample(n, generator=g)
        probs = model.visible_probs(hs)
        lengths = 1 + torch.poisson(torch.full((n,), float(mean_length) - 1), generator=g).long()
        words = torch.multinomial(probs, int(lengths.max()), replacement=True, generator=g)
        keep = (torch.arange(words.shape[1]) < lengths.unsqueeze(1)).float()
        counts = torch.zeros_like(probs).scatter_add_(1, words, keep)
    splits = split_documents(counts.to_sparse().coalesce(), None, num_valid=num_valid, test_fraction=test_fraction,
                             seed=seed)
    return Dataset("synthetic_bow", splits, {s: None for s in SPLITS}, "counts", seed)
