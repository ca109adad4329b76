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
    """``data=synthetic`` (configs/data/synthetic.yaml): binary data drawn from a small SBN with known parameters.

    For tests with exact answers: the generating model is small enough to enumerate, and ``synthetic_sbn`` rebuilds
    it from the same settings.

    Parameters
    ----------
    binarize : str, default "fixed"
        Must stay ``fixed`` (the data are drawn binary).
    seed : int, default 0
        Seeds the draws of the splits.
    model_seed : int, default 1
        Seeds the generating SBN's parameters (``synthetic_sbn``).
    n_visible : int, default 12
        Visible units of the generating SBN: the data's dimension.
    layers : sequence of int, default (4, 3)
        Hidden layer sizes of the generating SBN, bottom first.
    weight_scale : float, default 1.5
        Every parameter of the generating SBN is drawn from N(0, ``weight_scale``^2).
    num_train : int, default 5000
        Training examples.
    num_valid : int, default 500
        Validation examples.
    num_test : int, default 500
        Test examples.

    Returns
    -------
    Dataset
        ``synthetic``: ``[n, n_visible]`` binary float32 splits, no labels.

    Raises
    ------
    ConfigError
        If ``binarize`` is not ``fixed``, or a size, seed, layer list or scale is invalid.

    Examples
    --------
    >>> from nvil.data import synthetic_data
    >>> data = synthetic_data(n_visible=8, layers=[3], num_train=50, num_valid=10, num_test=10)
    >>> {name: tuple(x.shape) for name, x in data.splits.items()}
    {'train': (50, 8), 'valid': (10, 8), 'test': (10, 8)}
    >>> bool(((data.split("train") == 0) | (data.split("train") == 1)).all())
    True
    """
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
    """``data=synthetic_dynamic``: real-valued sequences forward-sampled from a dynamic Bayesian network.

    configs/data/synthetic_dynamic.yaml; use with model=dbn_dynamic. The network's parameters are drawn from
    N(0, weight_scale^2) with ``model_seed`` (Kingma 2013, Sec. 4.2: 100 training sequences of length 10, latent and
    observed vectors of size 10). A row is [x_1, ..., x_T].

    Parameters
    ----------
    seed : int, default 0
        Seeds the sequences drawn.
    model_seed : int, default 1
        Seeds the network's parameters.
    length : int, default 10
        T, the steps of each sequence.
    latent_dim : int, default 10
        The size of z_t.
    obs_dim : int, default 10
        The size of x_t.
    weight_scale : float, default 1.0
        The parameters are drawn from N(0, ``weight_scale``^2).
    sigma : float, default 0.1
        The latent noise scale.
    visible_sigma : float, default 0.5
        The observed noise scale.
    num_train : int, default 100
        Training sequences.
    num_valid : int, default 100
        Validation sequences.
    num_test : int, default 100
        Test sequences.

    Returns
    -------
    Dataset
        ``synthetic_dynamic`` with ``binarize="continuous"``: ``[n, length * obs_dim]`` real-valued splits, no labels.

    Raises
    ------
    ConfigError
        If a size, seed or scale is not positive (seeds: not a non-negative integer).

    Examples
    --------
    >>> from nvil.data import synthetic_dynamic_data
    >>> data = synthetic_dynamic_data(length=4, latent_dim=2, obs_dim=3, num_train=5, num_valid=2, num_test=2)
    >>> data.binarize, data.split("train").shape
    ('continuous', torch.Size([5, 12]))
    """
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
    """``data=synthetic_bow`` (configs/data/synthetic_bow.yaml): word counts drawn from a small known document model.

    The model is an SBN (``synthetic_sbn``: ``model_seed``, ``layers``, ``weight_scale``) with a multinomial visible
    layer over ``n_visible`` words (the vocabulary size); ``num_docs`` documents of lengths
    1 + Poisson(``mean_length`` - 1), drawn with ``seed`` and split like a user's ``bow`` corpus (``test_fraction``
    for testing, ``num_valid`` for validation).

    Parameters
    ----------
    seed : int, default 0
        Seeds the documents drawn and the split.
    model_seed : int, default 1
        Seeds the generating SBN's parameters.
    n_visible : int, default 50
        The vocabulary size.
    layers : sequence of int, default (5,)
        Hidden layer sizes of the generating SBN.
    weight_scale : float, default 2.0
        Every parameter of the generating SBN is drawn from N(0, ``weight_scale``^2).
    num_docs : int, default 3000
        Documents drawn.
    mean_length : float, default 40
        The mean document length in words (at least 1).
    test_fraction : float, default 0.1
        The fraction of the documents held out for testing, in [0, 1).
    num_valid : int, default 100
        Documents held out for validation.

    Returns
    -------
    Dataset
        ``synthetic_bow`` with ``binarize="counts"``: ``[n, n_visible]`` word counts per split (dense where small
        enough, else sparse COO), no labels.

    Raises
    ------
    ConfigError
        If ``mean_length`` is not a number of at least 1, or a size, seed, fraction or layer list is invalid (or the
        split leaves no training documents).

    Examples
    --------
    >>> from nvil.data import synthetic_bow_data
    >>> data = synthetic_bow_data(n_visible=20, num_docs=200, mean_length=10, num_valid=10)
    >>> data.binarize, {name: tuple(x.shape) for name, x in data.splits.items()}
    ('counts', {'valid': (10, 20), 'train': (170, 20), 'test': (20, 20)})
    >>> bool((data.split("train").sum(1) >= 1).all())
    True
    """
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
