"""``estimator=classify``: the test error of a Boltzmann machine used as a classifier.

- With label units (``model.labels=true``): p(y | v) is proportional to exp(-F([v, onehot(y)])), exact,
  one free energy per class for a batch of examples; the prediction is its argmax. The one-hot label in
  each data row is the truth to score against and is never read when predicting (it is overwritten).
- Without label units: a multinomial logistic regression on the hidden probabilities p(h | v) of the
  training split, with an L2 penalty 1/2 l2 |W|^2 on the weights (not the biases) added to the mean
  cross-entropy, fitted full-batch by L-BFGS from zero weights (a convex problem started at a fixed
  point: deterministic, no seed involved), then applied to the evaluated rows.

How the estimator gets labels and the training split: the public interface stays
``estimate(model, data, *, inference, generator, seed, progress)`` plus two optional keywords,
``labels`` (int64 [n], the true labels of ``data``'s rows) and ``train`` ((x_train, y_train)). Only the
regression needs them. ``evaluate_checkpoint`` obtains them through the optional estimator hook
``dataset_inputs(model, dataset, split, num_rows)``, which returns the extra keywords (none for models
with label units) or raises a one-line ``DataError`` when the data has no labels.

The result is a ``ClassificationResult``: a ``Result`` whose per-example tensor (the ``log_p`` field,
also readable as ``errors``) holds 1.0 for a misclassified example and 0.0 for a correct one, so its mean
is the error rate; ``stderr`` is the binomial standard error sqrt(p (1 - p) / n), and the JSON line
reports ``error_rate`` and ``stderr`` in place of ``mean_log_p``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from nvil.core.config import positive_int
from nvil.core.errors import ConfigError, DataError
from nvil.data import take_rows
from nvil.estimators.base import Estimator, Result, check_rows, check_seed, chunks

LABEL_UNITS = "label units"
REGRESSION = "logistic regression on p(h|v)"


@dataclass
class ClassificationResult(Result):
    """``log_p`` holds per-example 0/1 errors (1.0 = misclassified), not log-probabilities."""

    predictions: torch.Tensor | None = None  # [num_examples] predicted classes

    @property
    def errors(self) -> torch.Tensor:
        return self.log_p

    @property
    def error_rate(self) -> float:
        return self.errors.double().mean().item() if self.errors.numel() else float("nan")

    @property
    def stderr(self) -> float:
        """Binomial standard error of the error rate, sqrt(p (1 - p) / n)."""
        n = self.errors.numel()
        p = self.error_rate
        return math.sqrt(p * (1.0 - p) / n) if n else float("nan")

    def summary(self) -> dict:
        out = {
            "estimator": self.estimator,
            "method": self.extras.get("method"),
            "error_rate": round(self.error_rate, 6),
            "stderr": round(self.stderr, 6),
            "num_examples": int(self.errors.numel()),
            "seconds": round(self.seconds, 3),
            "seed": self.seed,
        }
        out.update(self.extras)
        return out


# ---- label units ------------------------------------------------------------------------------------


@torch.no_grad()
def label_log_posterior(model, x: torch.Tensor) -> torch.Tensor:
    """[n, n_labels] log p(y | v) = log softmax_y(-F([v, onehot(y)])) for rows x = [v, y]; y is ignored."""
    v, _ = model.split(x)
    eye = torch.eye(model.n_labels, dtype=v.dtype, device=v.device)
    neg_f = torch.stack([-model.free_energy(torch.cat([v, eye[k].expand(v.shape[0], -1)], -1))
                         for k in range(model.n_labels)], -1)  # a loop over classes, batched over examples
    return torch.log_softmax(neg_f, -1)


@torch.no_grad()
def predict_with_labels(model, data: torch.Tensor, *, batch_size: int = 1000, progress=None) -> torch.Tensor:
    """argmax_y p(y | v) for every row of ``data`` (int64 [n])."""
    out = []
    for start, stop in chunks(data.shape[0], batch_size):
        out.append(label_log_posterior(model, take_rows(data, start, stop)).argmax(-1))
        if progress is not None:
            progress.update(stop - start)
    return torch.cat(out)


# ---- logistic regression on p(h | v) --------------------------------------------------------------------


@torch.no_grad()
def hidden_features(model, data: torch.Tensor, *, batch_size: int = 1000, progress=None) -> torch.Tensor:
    """[n, n_hidden] p(h_j = 1 | v) for every row of ``data``."""
    out = []
    for start, stop in chunks(data.shape[0], batch_size):
        out.append(model.h_given_x(take_rows(data, start, stop)))
        if progress is not None:
            progress.update(stop - start)
    return torch.cat(out)


@dataclass
class LogisticRegression:
    center: torch.Tensor  # [features], the training features' mean
    weight: torch.Tensor  # [features, classes]
    bias: torch.Tensor  # [classes]
    iterations: int
    converged: bool

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return (features - self.center) @ self.weight + self.bias

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        return self.logits(features).argmax(-1)


def fit_logistic_regression(features: torch.Tensor, labels: torch.Tensor, num_classes: int, *, l2: float,
                            max_iter: int, tolerance: float = 1e-6) -> LogisticRegression:
    """Minimise mean cross-entropy + 1/2 l2 |W|^2 by full-batch L-BFGS (strong Wolfe line search) from zero.

    The features are centred at their training mean first: with an unpenalised bias this is the same model
    and the same optimum, but far better conditioned (about 6x fewer iterations on RBM features)."""
    features = features.detach().double()  # float64: in float32 the strong-Wolfe line search can stall on rounding
    center = features.mean(0)
    features = features - center
    labels = labels.to(features.device).long()
    weight = torch.zeros(features.shape[1], num_classes, dtype=features.dtype, device=features.device,
                         requires_grad=True)
    bias = torch.zeros(num_classes, dtype=features.dtype, device=features.device, requires_grad=True)
    max_eval = 2 * max_iter
    opt = torch.optim.LBFGS([weight, bias], lr=1.0, max_iter=max_iter, max_eval=max_eval, history_size=20,
                            tolerance_grad=tolerance, tolerance_change=1e-10, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(features @ weight + bias, labels) + 0.5 * l2 * (weight**2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    state = opt.state[weight]
    iterations, evals = int(state.get("n_iter", 0)), int(state.get("func_evals", 0))
    return LogisticRegression(center, weight.detach(), bias.detach(), iterations,
                              converged=iterations < max_iter and evals < max_eval)


# ---- the estimator ------------------------------------------------------------------------------------------


class Classify(Estimator):
    """``estimator=classify``: test error from the label units, or from a logistic regression on p(h | v).

    With label units the prediction is argmax_y p(y | v), p(y | v) proportional to exp(-F([v, onehot(y)])); without
    them, a multinomial logistic regression fitted to the training split's p(h | v) (the module docstring).
    Defaults: configs/estimator/classify.yaml. Nothing is random.

    Parameters
    ----------
    batch_size : int, default 1000
        Examples per batch for the free energies and p(h | v).
    l2 : float, default 1.0e-4
        Regression only: the penalty 1/2 l2 |W|^2 added to the mean cross-entropy (biases unpenalised);
        non-negative.
    max_iter : int, default 500
        Regression only: L-BFGS iterations at most (full batch, from zero weights).

    Raises
    ------
    nvil.core.errors.ConfigError
        If ``l2`` is not a finite non-negative number, or ``batch_size`` or ``max_iter`` is not a positive integer.

    Examples
    --------
    With label units the rows carry their labels, one-hot after the pixels:

    >>> import torch
    >>> from nvil.models import RBM
    >>> from nvil.estimators import Classify
    >>> model = RBM(4, 3, n_labels=3)
    >>> y = torch.tensor([0, 1, 2, 0, 1])
    >>> x = torch.cat([torch.bernoulli(torch.full((5, 4), 0.5)), torch.nn.functional.one_hot(y, 3).float()], 1)
    >>> result = Classify().estimate(model, x)
    >>> result.errors.shape, result.extras["method"]
    (torch.Size([5]), 'label units')

    Without them, a logistic regression on p(h | v) of labelled training rows:

    >>> rbm = RBM(6, 4)
    >>> x_train, y_train = torch.bernoulli(torch.full((20, 6), 0.5)), torch.randint(0, 2, (20,))
    >>> x_test, y_test = torch.bernoulli(torch.full((5, 6), 0.5)), torch.randint(0, 2, (5,))
    >>> result = Classify(max_iter=50).estimate(rbm, x_test, labels=y_test, train=(x_train, y_train))
    >>> result.extras["method"], result.extras["num_train"], 0.0 <= result.error_rate <= 1.0
    ('logistic regression on p(h|v)', 20, True)
    """

    name = "classify"

    def __init__(self, *, batch_size: int = 1000, l2: float = 1.0e-4, max_iter: int = 500) -> None:
        self.batch_size = positive_int(batch_size, "estimator.batch_size")
        self.max_iter = positive_int(max_iter, "estimator.max_iter")
        if isinstance(l2, bool) or not isinstance(l2, (int, float)) or not 0 <= l2 < math.inf:
            raise ConfigError(f"estimator.l2 must be a non-negative number, got {l2!r}")
        self.l2 = float(l2)

    def check(self, model, inference=None) -> None:
        """Refuse, before any work starts, a model that is not a Boltzmann machine.

        Parameters
        ----------
        model : torch.nn.Module
            The model to be scored: it needs ``n_labels``, ``free_energy`` and ``h_given_x``.
        inference : torch.nn.Module or None, default None
            Not used (every estimator is handed it).

        Raises
        ------
        nvil.core.errors.ConfigError
            If ``model`` is not a Boltzmann machine (model=rbm or model=srbm).
        """
        if not all(hasattr(model, a) for a in ("n_labels", "free_energy", "h_given_x")):
            raise ConfigError("estimator=classify needs a Boltzmann machine (model=rbm or model=srbm), "
                              f"not {type(model).__name__}")

    def dataset_inputs(self, model, dataset, split: str, rows: tuple[int, int], **_) -> dict:
        """The keywords ``estimate`` needs beyond the rows: the labels and the labelled training split, or none.

        None with label units (the rows carry the labels); otherwise the rows' labels and the labelled training
        split, for the regression.

        Parameters
        ----------
        model : torch.nn.Module
            The Boltzmann machine being evaluated.
        dataset : nvil.data.Dataset
            The dataset, with its ``labels`` per split.
        split : str
            The split being evaluated (train | valid | test).
        rows : tuple of int
            ``(start, stop)``: the evaluated rows of ``split``.
        **_ : Any
            Other keywords of the hook (``checkpoint``, ``payload``), ignored.

        Returns
        -------
        dict
            Empty with label units; else ``labels`` (int64 [stop - start]) and ``train`` = (x_train, y_train).

        Raises
        ------
        nvil.core.errors.DataError
            If the dataset has no labels for the training split or for ``split``.
        """
        if model.n_labels:
            return {}
        missing = [s for s in dict.fromkeys(("train", split)) if dataset.labels.get(s) is None]
        if missing:
            raise DataError(f"estimator=classify fits a logistic regression to labels, but data={dataset.name} "
                            f"has no labels for the {' and '.join(missing)} split")
        return {"labels": dataset.labels[split][rows[0]:rows[1]],
                "train": (dataset.split("train"), dataset.labels["train"])}

    def estimate(self, model, data, *, labels: torch.Tensor | None = None, train: tuple | None = None,
                 inference=None, seed: int = 0, generator=None, progress=None) -> ClassificationResult:
        """0/1 errors for each row of ``data`` [examples, model.n_visible]: 1.0 where the prediction is wrong.

        With label units the rows carry the truth; otherwise ``labels`` and ``train`` are needed for the regression.
        Nothing is random (``seed`` is recorded, ``generator`` not used).

        Parameters
        ----------
        model : torch.nn.Module
            A Boltzmann machine (model=rbm or srbm), with or without label units.
        data : torch.Tensor
            ``[examples, model.n_visible]`` rows to classify (with label units: [v, onehot(y)], the one-hot never
            read when predicting).
        labels : torch.Tensor or None, default None
            Regression only: int64 ``[examples]``, the true classes of ``data``'s rows.
        train : tuple or None, default None
            Regression only: (x_train, y_train), the labelled training rows the regression is fitted to.
        inference : torch.nn.Module or None, default None
            Not used (every estimator is handed it).
        seed : int, default 0
            Recorded in the result; nothing is drawn.
        generator : torch.Generator or None, default None
            Not used.
        progress : tqdm or None, default None
            A bar counting the evaluated examples.

        Returns
        -------
        ClassificationResult
            ``errors`` (the ``log_p`` field) [examples], ``predictions``, ``error_rate`` and its binomial ``stderr``;
            ``extras`` say the method (and, for the regression, its fit).

        Raises
        ------
        nvil.core.errors.ConfigError
            If the model is not a Boltzmann machine (``check``).
        nvil.core.errors.DataError
            If the regression lacks ``labels`` or ``train``, the training labels and rows differ in number, or the
            labels and the predictions differ in number.
        ValueError
            If ``data`` is not 2-D with ``model.n_visible`` columns, or ``seed`` is not an integer.
        """
        self.check(model, inference)
        check_rows(model, data)
        check_seed(seed)
        t0 = time.perf_counter()
        if model.n_labels:
            truth = model.split(take_rows(data, 0))[1].argmax(-1)  # the one-hot in each row: the truth
            pred = predict_with_labels(model, data, batch_size=self.batch_size, progress=progress)
            extras = {"method": LABEL_UNITS, "num_classes": model.n_labels}
        else:
            truth, pred, extras = self._regression(model, data, labels, train, progress)
        pred, truth = pred.cpu(), truth.cpu().long()
        if truth.shape != pred.shape:
            raise DataError(f"estimator=classify got {truth.numel()} labels for {pred.numel()} examples")
        errors = (pred != truth).float()
        return ClassificationResult(self.name, errors, time.perf_counter() - t0, seed, extras, predictions=pred)

    def _regression(self, model, data, labels, train, progress):
        if labels is None or train is None or train[1] is None:
            raise DataError("estimator=classify on a model without label units fits a logistic regression on "
                            "p(h|v): it needs the labels of the evaluated rows and a labelled training split")
        x_train, y_train = train
        y_train = y_train.long()
        if x_train.shape[0] != y_train.shape[0]:
            raise DataError(f"estimator=classify got {y_train.shape[0]} training labels for {x_train.shape[0]} rows")
        num_classes = int(max(y_train.max().item(), labels.max().item())) + 1
        feats = hidden_features(model, x_train, batch_size=self.batch_size)
        reg = fit_logistic_regression(feats, y_train, num_classes, l2=self.l2, max_iter=self.max_iter)
        train_error = (reg.predict(feats).cpu() != y_train.cpu()).double().mean().item()
        del feats
        pred = reg.predict(hidden_features(model, data, batch_size=self.batch_size, progress=progress))
        extras = {"method": REGRESSION, "num_classes": num_classes, "l2": self.l2, "num_train": int(x_train.shape[0]),
                  "train_error_rate": round(train_error, 6), "iterations": reg.iterations, "converged": reg.converged}
        return labels, pred, extras
