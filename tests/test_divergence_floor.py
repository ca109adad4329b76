"""The absolute floor of the divergence rule (nvil/app/divergence.py, ``score_floor``): a log-likelihood score far below
the reference model's stops the run from its first value on, which the range rule cannot see when a run is garbage
from step 1; healthy runs of each data kind stay above it. And word-count files whose values no model can learn from
(infinite, 1e30) are refused when they are read (nvil/data/values.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import SYNTHETIC, run_script
from nvil.app.divergence import LOG_LIKELIHOODS, DivergenceMonitor, score_floor
from nvil.core.errors import ConfigError, DataError
from nvil.data import Dataset, SPLITS, load_count_matrix
from test_cli import assert_one_line_error

RBM = [a for a in SYNTHETIC if not a.startswith("model.layers")] + ["model=rbm", "model.n_hidden=6", "learner=sap"]
SHORT = ["trainer.max_steps=40"]


def train_run(tmp_path, *args: str):
    tmp_path.mkdir(parents=True, exist_ok=True)
    return run_script("train.py", *args, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)


# ---- runs ---------------------------------------------------------------------------------------------------

def test_an_rbm_garbage_from_step_one_is_stopped_at_the_floor(tmp_path):
    """learner.lr=1e6: the exact log-likelihood is near -1e6 from the first validation on, so its range is garbage
    too; the floor (12 pixels: -12 log 2 - 12 * 10 = -128.3) stops it with one line, before best.pt."""
    proc = train_run(tmp_path, *RBM, *SHORT, "learner.lr=1e6")
    assert proc.returncode == 2
    assert_one_line_error(proc, "training diverged", "below -128.3", "uniform model's -8.318",
                          "trainer.divergence_floor")
    assert not (tmp_path / "run" / "checkpoints" / "best.pt").exists()


@pytest.mark.parametrize("args", [
    RBM,                                                                           # SAP at its default rate
    SYNTHETIC,                                                                     # an SBN by NVIL
    [a for a in SYNTHETIC if not a.startswith(("data=", "model.layers"))]          # word counts
    + ["data=synthetic_bow", "model.visible=multinomial", "model.layers=[5]"],
], ids=["rbm_sap", "sbn_nvil", "bow_nvil"])
def test_healthy_runs_stay_above_the_floor(tmp_path, args):
    assert train_run(tmp_path, *args, *SHORT).returncode == 0
    assert (tmp_path / "run" / "checkpoints" / "best.pt").exists()


GAUSSIAN = [a for a in SYNTHETIC if not a.startswith(("data=", "model.layers"))] + [
    "model=dbn_dynamic", "data=synthetic_dynamic", "learner=mcem_hmc", "trainer.batch_size=100",
    "trainer.max_steps=20"]


@pytest.mark.slow
def test_a_gaussian_net_on_real_valued_data_stays_above_the_floor(tmp_path, monkeypatch):
    """At default settings its first validation (about -386 nats) is far above the floor, -1,772: 10 nats per dimension
    below the standard normal's -772 on these sequences (worse than the fitted Gaussian's -239: their means reach
    5.6). A validation score far below the floor (the broken variant) stops the same run."""
    assert train_run(tmp_path, *GAUSSIAN).returncode == 0
    assert (tmp_path / "run" / "checkpoints" / "best.pt").exists()
    monkeypatch.setattr("nvil.app.loop.validate", lambda *a, **k: {"val/log_likelihood": -5000.0})
    proc = train_run(tmp_path / "garbage", *GAUSSIAN)
    assert_one_line_error(proc, "val/log_likelihood fell to -5000, below -1772", "standard normal")


# ---- score_floor, per kind of data --------------------------------------------------------------------------

def dataset(kind: str, train, valid) -> Dataset:
    splits = {"train": torch.tensor(train, dtype=torch.float32), "valid": torch.tensor(valid, dtype=torch.float32)}
    splits["test"] = splits["valid"]
    return Dataset("handmade", splits, dict.fromkeys(SPLITS), kind, 0)


def test_binary_floor_is_the_uniform_models_less_the_margin():
    d = dataset("fixed", [[0.0] * 10, [1.0] * 10], [[1.0] * 10])
    floor = score_floor(d, 3.0)
    assert set(floor) == set(LOG_LIKELIHOODS) and "train/log_joint" not in floor
    assert all(v == pytest.approx(-10 * math.log(2) - 10 * 3.0) for v in floor.values())


def test_count_floor_is_per_word_over_the_vocabulary():
    """V = 4 words. Training scores: the longest training document (5 words); validation scores: the largest mean
    length of a first-n prefix of the validation documents (lengths 2, 6, 1: prefix means 2, 4, 3)."""
    d = dataset("counts", [[1, 2, 0, 0], [2, 0, 3, 0], [0, 0, 0, 1]], [[2, 0, 0, 0], [1, 1, 1, 3], [0, 1, 0, 0]])
    floor = score_floor(d, 10.0)
    assert floor["train/elbo"] == pytest.approx(-5 * (math.log(4) + 10))
    assert floor["val/elbo"] == pytest.approx(-4 * (math.log(4) + 10))
    sparse = dataset("counts", [[1, 2, 0, 0], [2, 0, 3, 0]], [[2, 0, 0, 0]])
    sparse.splits = {k: v.to_sparse() for k, v in sparse.splits.items()}
    assert score_floor(sparse, 10.0)["train/elbo"] == pytest.approx(-5 * (math.log(4) + 10))


def test_real_valued_floor_is_the_worse_of_the_fitted_gaussian_and_the_standard_normal():
    """Per dimension, min(-1/2 log(2 pi e var), -1/2 log(2 pi) - mean(x^2) / 2). Column 0 (0, 2): var 1, mean square 2:
    min(-1.419, -1.919); column 1 (0, 0.2): var 0.01, mean square 0.02: min(+0.884, -0.929); column 2 (5, 5),
    constant: min(+inf, -13.42)."""
    d = dataset("continuous", [[0.0, 0.0, 5.0], [2.0, 0.2, 5.0]], [[1.0, 0.1, 5.0]])
    half_log_2pi = 0.5 * math.log(2 * math.pi)
    expected = -3 * half_log_2pi - 0.5 * (2.0 + 0.02 + 25.0) - 3 * 2.0
    floor = score_floor(d, 2.0)
    assert all(v == pytest.approx(expected) for v in floor.values()) and math.isfinite(expected)
    assert "standard normal" in floor.reasons["val/log_likelihood"]


def test_no_margin_no_floor_and_a_bad_margin_is_refused():
    d = dataset("fixed", [[0.0, 1.0]], [[1.0, 1.0]])
    assert score_floor(d, None) is None
    for bad in (0, -1.0, float("inf"), "ten", True):
        with pytest.raises(ConfigError, match="trainer.divergence_floor must be a positive number"):
            score_floor(d, bad)


# ---- the monitor -----------------------------------------------------------------------------------------------

def test_the_floor_applies_from_the_first_value_and_is_not_stored():
    floor = score_floor(dataset("fixed", [[0.0] * 12], [[1.0] * 12]), 10.0)
    said = DivergenceMonitor(floor=floor).check({"val/pseudo_log_likelihood": -1e6})
    assert said.startswith("val/pseudo_log_likelihood fell to -1e+06, below -128.3 (10 nats per dimension below the "
                           "uniform model's -8.318")
    # the range rule alone (the broken variant) takes the same first value as its range
    assert DivergenceMonitor().check({"val/pseudo_log_likelihood": -1e6}) is None
    # train/log_joint is not on the scale of log p(x): no floor; the floor holds with the range rule off
    assert DivergenceMonitor(floor=floor).check({"train/log_joint": -1e6}) is None
    assert DivergenceMonitor(None, floor=floor).check({"train/elbo": -200.0})
    monitor = DivergenceMonitor(floor=floor)
    assert monitor.check({"train/elbo": -50.0}) is None
    assert set(monitor.state_dict()) == {"train/elbo", "_regression"}
    monitor.load_state_dict({"train/elbo": [-60.0, -40.0]})  # a checkpoint from before the regression rule
    assert monitor.range == {"train/elbo": (-60.0, -40.0)} and monitor.floor is floor


# ---- word-count files that no model can learn from -------------------------------------------------------------

def write_float_csr(path, dense: np.ndarray) -> None:
    """A CSR .npz as scipy.sparse.save_npz writes it, with float64 values (where infinity can be stored)."""
    rows, cols = np.nonzero(dense)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=dense.shape[0]))])
    np.savez(path, data=dense[rows, cols].astype(np.float64), indices=cols.astype(np.int32),
             indptr=indptr.astype(np.int32), shape=np.array(dense.shape), format=np.array(b"csr"))


@pytest.mark.parametrize("bad", [math.inf, 1e30, math.nan, 2.5, 2.0**24 + 2])
def test_a_count_no_model_can_learn_from_is_refused_when_read(tmp_path, bad):
    dense = np.ones((4, 3))
    dense[2, 1] = bad
    write_float_csr(tmp_path / "docs.npz", dense)
    with pytest.raises(DataError, match=r"docs.npz has the value .* at row 2, column 1 .*non-negative integers of at "
                                        r"most 2\*\*24") as e:
        load_count_matrix(tmp_path / "docs.npz")
    assert "\n" not in str(e.value)


def test_an_infinite_count_stops_train_py_with_one_line(tmp_path):
    dense = np.ones((200, 3))
    dense[7, 2] = math.inf
    write_float_csr(tmp_path / "docs.npz", dense)
    proc = train_run(tmp_path, "data=bow", f"data.path={tmp_path / 'docs.npz'}", "model.visible=multinomial",
                     "trainer.device=cpu", "trainer.progress=false", "final_eval.enabled=false", "print_config=false")
    assert proc.returncode == 2
    assert_one_line_error(proc, "docs.npz has the value inf at row 7, column 2")
