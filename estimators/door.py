"""The one door data passes before any estimate: every ``Estimator.estimate`` (``nvil.estimators.base``) runs
``admit`` on its rows first, so a notebook's call is checked as ``evaluate.py``'s is.

``admit(model, x)`` returns the rows the estimator works on, or raises one ``DataError`` line naming the problem:

- type: a ``torch.Tensor`` or a numpy array (converted); anything else is refused;
- dtype: a built-in model's rows are cast to its parameters' dtype (float64, integers and booleans accepted) and
  moved to its device; a user's model (``nvil.models.protocol``) gets floating rows in its parameters' dtype and
  on their device, other rows as given (numpy converted);
- values: every value finite (the count and the first bad row are named);
- shape: ``[examples, model.n_visible]`` where the model has ``n_visible``; a user's model is asked once, on two
  rows, whether its ``log_likelihood`` takes them, and a failure is named with the shape it was given;
- support: a model whose ``data_support`` is ``"binary"`` (Bernoulli visibles) takes values in {0, 1} only, and
  the message names the binarisations to use; ``"counts"``: non-negative whole numbers.

An estimate that is not finite is never certified: ``certify_finite`` fails its ``finite`` check.
"""

from __future__ import annotations

import math

import torch

from nvil.core.errors import DataError
from nvil.models.protocol import protocol_only

SUPPORTS = ("binary", "counts", "real")
BINARISE = ("binarise it first: torch.bernoulli(x) for a stochastic draw (data.binarize=fixed or dynamic, the "
            "papers' protocol) or (x > 0.5).float() (data.binarize=threshold)")


def _as_tensor(x, what: str) -> torch.Tensor:
    if torch.is_tensor(x):
        return x
    if type(x).__module__ == "numpy" and hasattr(x, "__array__"):
        return torch.from_numpy(x.copy() if not x.flags.writeable else x)
    raise DataError(f"{what} must be a torch.Tensor or a numpy array, got {type(x).__name__}")


def _first_bad(mask: torch.Tensor) -> str:
    """'row r' (and column c) of the first True entry of ``mask``."""
    index = [int(i) for i in mask.nonzero()[0]]
    return f"row {index[0]}" + (f", column {index[1]}" if len(index) > 1 else "")


def _parameter(model):
    params = getattr(model, "parameters", None)
    return next(iter(params()), None) if callable(params) else None


def check_finite(x: torch.Tensor, what: str) -> None:
    if x.is_floating_point() or x.is_complex():
        bad = ~torch.isfinite(x)
        if bool(bad.any()):
            raise DataError(f"{what} has {int(bad.sum())} non-finite value(s) (NaN or infinity), the first at "
                            f"{_first_bad(bad)}: remove or impute them before estimating")


def check_support(x: torch.Tensor, support: str | None, what: str) -> None:
    if support is None or support == "real":
        return
    if support not in SUPPORTS:
        raise DataError(f"the model's data_support must be one of {list(SUPPORTS)}, got {support!r}")
    if support == "binary":
        bad = (x != 0) & (x != 1)
        if bool(bad.any()):
            value = x[tuple(bad.nonzero()[0])].item()
            raise DataError(f"{what} has values outside {{0, 1}} ({int(bad.sum())} of them, e.g. {value:g} at "
                            f"{_first_bad(bad)}) but the model has Bernoulli visibles: {BINARISE}")
    else:
        bad = (x < 0) | (x != torch.round(x))
        if bool(bad.any()):
            raise DataError(f"{what} must hold counts (non-negative whole numbers) for this model, got "
                            f"{x[tuple(bad.nonzero()[0])].item():g} at {_first_bad(bad)}")


def _user_model(model):
    """The user's object behind a ``ProtocolModel`` (or the object itself), or None for a built-in model (one that
    declares a capability of the built-in families, ``nvil.models.protocol``, even where it follows the protocol)."""
    obj = getattr(model, "obj", model)
    if protocol_only(obj) and callable(getattr(obj, "log_likelihood", None)) and hasattr(obj, "latent"):
        return obj
    return None


def admit(model, x, what: str = "data") -> torch.Tensor:
    """``x`` checked against ``model`` and converted (see the module docstring); raises ``DataError``."""
    x = _as_tensor(x, what)
    user = _user_model(model)
    if x.dim() < 1 or x.shape[0] == 0:
        raise DataError(f"{what} must hold examples along its first dimension, got shape {tuple(x.shape)}")
    if user is None and x.dim() != 2:
        raise DataError(f"{what} must be a 2-D tensor [examples, visible units], got shape {tuple(x.shape)}")
    check_finite(x, what)
    if user is None:
        n = getattr(model, "n_visible", None)
        if x.dim() != 2:
            raise DataError(f"{what} must be a 2-D tensor [examples, visible units], got shape {tuple(x.shape)}")
        if n is not None and x.shape[1] != n:
            raise DataError(f"{what} has {x.shape[1]} columns but the model has {n} visible units (model.n_visible)")
        first = _parameter(model)
        if first is not None and (x.dtype != first.dtype or x.device != first.device):
            x = x.to(device=first.device, dtype=first.dtype)
        elif not x.is_floating_point():
            x = x.float()
    check_support(x, getattr(user if user is not None else model, "data_support", None), what)
    if user is not None:
        first = _parameter(user)
        if first is not None and x.is_floating_point() and first.is_floating_point() and (
                x.dtype != first.dtype or x.device != first.device):
            x = x.to(device=first.device, dtype=first.dtype)  # integer rows (token ids, say) stay as given
        _probe(user, x, what)
    return x


def _probe(user, x: torch.Tensor, what: str) -> None:
    """Ask the user's ``log_likelihood`` once, on two rows and z = 0, whether it takes rows shaped like ``x``."""
    n = getattr(user, "n_visible", None)
    if n is not None and (x.dim() != 2 or x.shape[1] != n):
        raise DataError(f"{what} must be [examples, {n}] for {type(user).__name__} (its n_visible), got shape "
                        f"{tuple(x.shape)}")
    first = _parameter(user)
    rows = x[:2]
    like = first if first is not None and first.is_floating_point() else x
    z = torch.zeros(rows.shape[0], user.latent.size, device=like.device,
                    dtype=like.dtype if like.is_floating_point() else torch.get_default_dtype())
    try:
        with torch.no_grad():
            out = user.log_likelihood(rows, z)
    except (RuntimeError, ValueError, IndexError, TypeError) as e:
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"{type(user).__name__}.log_likelihood(x, z) cannot take {what} of shape "
                        f"{tuple(x.shape)}: {message}") from None
    if torch.is_tensor(out) and out.is_floating_point() and not bool(torch.isfinite(out).all()):
        return  # a -inf likelihood at z = 0 is the model's business, not the data's


def certify_finite(result) -> None:
    """Fail the ``finite`` check of ``result``'s certificate where its estimate or standard error is not finite."""
    mean, stderr = result.mean, result.stderr
    if not (math.isfinite(mean) and math.isfinite(stderr)):
        result.check("finite", False, f"the estimate is not finite (mean_log_p {mean}, stderr {stderr}): a "
                                      "non-finite number is never certified")
