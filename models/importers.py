"""Boltzmann machines trained elsewhere, as this package's ``RBM``, so that its estimators (AIS with its
certificate, exact enumeration, reverse AIS) score them as they score its own.

The energy of a binary RBM is E(v, h) = -v'Wh - b'v - c'h, W of shape [n_visible, n_hidden] (Salakhutdinov & Murray
2008, Eq. 1). ``rbm_from_params`` takes (W, b, c) in that convention, or W as [n_hidden, n_visible] with
``weights="hidden_by_visible"``; ``rbm_from_sklearn`` reads a fitted ``sklearn.neural_network.BernoulliRBM``, whose
energy is the same with W = ``components_``' transpose, b = ``intercept_visible_``, c = ``intercept_hidden_``;
``rbm_from_rbms`` reads the ``rbms`` package's Bernoulli-Bernoulli RBM (``rbms.bernoulli_bernoulli.classes.BBRBM``, or
its ``named_parameters()`` mapping), whose energy is the same with W = ``weight_matrix`` ([n_visible, n_hidden]),
b = ``vbias``, c = ``hbias``.

    from nvil.models.importers import rbm_from_sklearn
    from nvil.estimators import AIS
    rbm = rbm_from_sklearn(fitted)                          # any BernoulliRBM after fit()
    result = AIS(num_chains=1000).estimate(rbm, x_test, train=x_train)
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from nvil.core.errors import ConfigError
from nvil.models.rbm import BoltzmannMachine

WEIGHT_LAYOUTS = ("visible_by_hidden", "hidden_by_visible")


def rbm_from_params(W, b, c, *, weights: str = "visible_by_hidden", dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu") -> BoltzmannMachine:
    """A binary ``RBM`` with weights ``W``, visible biases ``b`` and hidden biases ``c``.

    The arguments are arrays or tensors; the energy is that of the module's docstring,
    E(v, h) = -v'Wh - b'v - c'h. Shapes and finiteness are checked, each problem in one line.

    Parameters
    ----------
    W : array_like
        The weights W, ``[n_visible, n_hidden]`` (or ``[n_hidden, n_visible]`` with
        ``weights="hidden_by_visible"``); anything ``torch.as_tensor`` takes.
    b : array_like
        ``[n_visible]`` visible biases b.
    c : array_like
        ``[n_hidden]`` hidden biases c.
    weights : str, default "visible_by_hidden"
        The layout of ``W``: ``"visible_by_hidden"`` (this package's) or ``"hidden_by_visible"`` (transposed, as
        scikit-learn's ``components_``). Keyword only.
    dtype : torch.dtype, default torch.float32
        The dtype of the returned model's parameters. Keyword only.
    device : torch.device or str, default "cpu"
        The device of the returned model. Keyword only.

    Returns
    -------
    BoltzmannMachine
        ``RBM(n_visible, n_hidden)`` holding ``W``, ``b`` and ``c``.

    Raises
    ------
    ConfigError
        (``nvil.core.errors``) If ``weights`` is not one of ``WEIGHT_LAYOUTS``, ``W`` is not a matrix, ``b`` or
        ``c`` does not hold one bias per visible or hidden unit, or any of them holds NaN or infinity.

    Examples
    --------
    >>> import torch
    >>> from nvil.models.importers import rbm_from_params
    >>> W, b, c = torch.randn(6, 4), torch.zeros(6), torch.zeros(4)
    >>> rbm = rbm_from_params(W, b, c)
    >>> rbm.n_visible, rbm.n_hidden, torch.equal(rbm.W, W)
    (6, 4, True)
    >>> torch.equal(rbm_from_params(W.T, b, c, weights="hidden_by_visible").W, W)
    True
    >>> rbm_from_params(W, torch.zeros(5), c)
    Traceback (most recent call last):
        ...
    nvil.core.errors.ConfigError: b must hold one bias per visible unit (6, from W of shape [6, 4] ...
    """
    if weights not in WEIGHT_LAYOUTS:
        raise ConfigError(f"weights must be one of {', '.join(WEIGHT_LAYOUTS)}, got {weights!r}")
    W, b, c = (_tensor(t, name) for t, name in ((W, "W"), (b, "b"), (c, "c")))
    if W.dim() != 2:
        raise ConfigError(f"W must be a matrix, got a tensor of shape {list(W.shape)}")
    if weights == "hidden_by_visible":
        W = W.T
    n_visible, n_hidden = W.shape
    for name, t, n, side in (("b", b, n_visible, "visible"), ("c", c, n_hidden, "hidden")):
        if t.shape != (n,):
            raise ConfigError(f"{name} must hold one bias per {side} unit ({n}, from W of shape "
                              f"[{n_visible}, {n_hidden}] as [n_visible, n_hidden]), got shape {list(t.shape)}")
    rbm = BoltzmannMachine(n_visible, n_hidden).to(device=device, dtype=dtype)
    with torch.no_grad():
        rbm.W.copy_(W)
        rbm.b.copy_(b)
        rbm.c.copy_(c)
    return rbm


def rbm_from_state(state: Mapping, **kwargs) -> BoltzmannMachine:
    """``rbm_from_params`` from a mapping with keys ``W``, ``b`` and ``c`` (a state dict, an ``.npz``'s arrays).

    Parameters
    ----------
    state : Mapping
        Holds ``"W"`` (``[n_visible, n_hidden]`` unless ``weights`` says otherwise), ``"b"`` and ``"c"``; other
        keys are ignored.
    **kwargs : dict
        ``weights``, ``dtype`` and ``device``, passed to ``rbm_from_params``.

    Returns
    -------
    BoltzmannMachine
        The ``RBM`` with those parameters.

    Raises
    ------
    ConfigError
        If ``state`` lacks any of ``W``, ``b`` and ``c`` (the message names the keys it found), or
        ``rbm_from_params`` refuses the parameters.

    Examples
    --------
    >>> import torch
    >>> from nvil.models import RBM
    >>> from nvil.models.importers import rbm_from_state
    >>> source = RBM(6, 4)
    >>> rbm = rbm_from_state(source.state_dict())
    >>> torch.equal(rbm.W, source.W), torch.equal(rbm.b, source.b), torch.equal(rbm.c, source.c)
    (True, True, True)
    >>> rbm_from_state({"W": torch.zeros(6, 4)})
    Traceback (most recent call last):
        ...
    nvil.core.errors.ConfigError: an RBM's parameters need the keys W, b and c; missing b, c (found W)
    """
    missing = [k for k in ("W", "b", "c") if k not in state]
    if missing:
        raise ConfigError(f"an RBM's parameters need the keys W, b and c; missing {', '.join(missing)} "
                          f"(found {', '.join(map(str, state)) or 'none'})")
    return rbm_from_params(state["W"], state["b"], state["c"], **kwargs)


def rbm_from_sklearn(model, **kwargs) -> BoltzmannMachine:
    """A fitted scikit-learn ``BernoulliRBM`` as an ``RBM`` with the same energy (the module's docstring).

    W = ``components_``' transpose, b = ``intercept_visible_``, c = ``intercept_hidden_``. scikit-learn itself is not
    imported: any object with those three attributes will do.

    Parameters
    ----------
    model : sklearn.neural_network.BernoulliRBM
        A fitted ``BernoulliRBM`` (``components_`` ``[n_components, n_features]``).
    **kwargs : dict
        ``dtype`` and ``device``, passed to ``rbm_from_params``.

    Returns
    -------
    BoltzmannMachine
        An ``RBM(n_features, n_components)`` with the same energy.

    Raises
    ------
    ConfigError
        If ``model`` lacks ``components_``, ``intercept_visible_`` or ``intercept_hidden_`` (an unfitted
        ``BernoulliRBM``), or ``rbm_from_params`` refuses the parameters.

    Examples
    --------
    A stand-in with a fitted model's attributes (``BernoulliRBM(n_components=4).fit(x)`` on 6 features):

    >>> import types
    >>> import numpy as np
    >>> import torch
    >>> from nvil.models.importers import rbm_from_sklearn
    >>> fitted = types.SimpleNamespace(components_=np.ones((4, 6)), intercept_visible_=np.zeros(6),
    ...                                intercept_hidden_=np.zeros(4))
    >>> rbm = rbm_from_sklearn(fitted)
    >>> rbm.n_visible, rbm.n_hidden, rbm.W.shape, rbm.W.dtype
    (6, 4, torch.Size([6, 4]), torch.float32)
    """
    missing = [a for a in ("components_", "intercept_visible_", "intercept_hidden_") if not hasattr(model, a)]
    if missing:
        raise ConfigError(f"{type(model).__name__} has no {', '.join(missing)}: pass a fitted BernoulliRBM")
    return rbm_from_params(model.components_, model.intercept_visible_, model.intercept_hidden_,
                           weights="hidden_by_visible", **kwargs)


RBMS_KEYS = ("weight_matrix", "vbias", "hbias")


def rbm_from_rbms(model, **kwargs) -> BoltzmannMachine:
    """The ``rbms`` package's Bernoulli-Bernoulli RBM as an ``RBM`` with the same energy.

    A ``BBRBM``, or a mapping with its ``weight_matrix``, ``vbias`` and ``hbias``, e.g. from
    ``rbms.io.load_params``: W = ``weight_matrix`` ([n_visible, n_hidden]), b = ``vbias``, c = ``hbias``. The
    ``rbms`` package itself is not imported.

    Parameters
    ----------
    model : rbms.bernoulli_bernoulli.classes.BBRBM or Mapping
        The RBM, or its ``named_parameters()`` as a mapping.
    **kwargs : dict
        ``weights``, ``dtype`` and ``device``, passed to ``rbm_from_params``.

    Returns
    -------
    BoltzmannMachine
        The ``RBM`` with the same energy.

    Raises
    ------
    ConfigError
        If ``model`` lacks any of ``weight_matrix``, ``vbias`` and ``hbias``, or ``rbm_from_params`` refuses the
        parameters.

    Examples
    --------
    >>> import torch
    >>> from nvil.models.importers import rbm_from_rbms
    >>> params = {"weight_matrix": torch.randn(6, 4), "vbias": torch.zeros(6), "hbias": torch.zeros(4)}
    >>> rbm = rbm_from_rbms(params)
    >>> rbm.n_visible, rbm.n_hidden, torch.equal(rbm.W, params["weight_matrix"])
    (6, 4, True)
    """
    params = model if isinstance(model, Mapping) else {k: getattr(model, k, None) for k in RBMS_KEYS}
    missing = [k for k in RBMS_KEYS if params.get(k) is None]
    if missing:
        raise ConfigError(f"{type(model).__name__} has no {', '.join(missing)}: pass an rbms Bernoulli-Bernoulli RBM "
                          "(BBRBM) or its named_parameters()")
    return rbm_from_params(params["weight_matrix"], params["vbias"], params["hbias"], **kwargs)


def _tensor(value, name: str) -> torch.Tensor:
    t = torch.as_tensor(value).detach().cpu().double()
    if not bool(torch.isfinite(t).all()):
        raise ConfigError(f"{name} holds non-finite values (NaN or infinity)")
    return t
