"""Document models: multinomial visible layer, bag-of-words data, perplexity from a bound."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import make_cfg
from nvil.estimators.exact import exact_log_marginal
from nvil.models.sbn import SBN
from nvil.data import build_dataset, load_count_matrix
from nvil.core.errors import ConfigError, DataError
from nvil.app.evaluation import EvalSpec, evaluate_checkpoint
from nvil.app.main import train


def test_multinomial_log_prob_is_a_sum_of_word_log_probabilities():
    torch.manual_seed(0)
    model = SBN(5, [3], visible="multinomial")
    h = torch.tensor([[1.0, 0.0, 1.0]])
    counts = torch.tensor([[2.0, 0.0, 1.0, 0.0, 3.0]])
    probs = torch.softmax(model.decoders[0](h), -1)[0]
    expected = 2 * probs[0].log() + probs[2].log() + 3 * probs[4].log()
    assert model.log_prob_layers(counts, [h])[0].item() == pytest.approx(expected.item(), abs=1e-5)


def test_multinomial_sampling_matches_word_probabilities():
    torch.manual_seed(1)
    model = SBN(4, [2], visible="multinomial", doc_length=50)
    with torch.no_grad():
        model.prior_logits.fill_(20.0)  # h = (1, 1) almost surely, so p(word) is fixed
    x, _ = model.sample(2000, generator=torch.Generator().manual_seed(0))
    assert torch.all(x.sum(1) == 50)
    probs = torch.softmax(model.decoders[0](torch.ones(2)), -1)
    observed = x.sum(0).double()
    chi2 = ((observed - 100000 * probs.double()) ** 2 / (100000 * probs.double())).sum().item()
    assert chi2 < 16.27  # 3 degrees of freedom, p = 0.001


def write_csr(path, dense: np.ndarray) -> None:
    """What scipy.sparse.save_npz writes for a CSR matrix (without importing scipy)."""
    indptr, indices, data = [0], [], []
    for row in dense:
        nz = np.nonzero(row)[0]
        indices.extend(nz)
        data.extend(row[nz])
        indptr.append(len(indices))
    np.savez(path, data=np.array(data, dtype=np.int64), indices=np.array(indices, dtype=np.int32),
             indptr=np.array(indptr, dtype=np.int32), shape=np.array(dense.shape), format=np.array(b"csr"))  # bytes, as scipy writes it


def test_bow_loader_reads_scipy_csr_and_splits(tmp_path):
    rng = np.random.default_rng(0)
    dense = rng.poisson(0.3, size=(400, 30))
    write_csr(tmp_path / "docs.npz", dense)
    x = load_count_matrix(tmp_path / "docs.npz")
    assert torch.equal(x.to_dense(), torch.from_numpy(dense).float())
    d = build_dataset(OmegaConf.create({"name": "bow", "path": str(tmp_path / "docs.npz"), "test_path": None,
                                        "test_fraction": 0.25, "num_valid": 20, "seed": 0}))
    assert [d.splits[s].shape[0] for s in ("train", "valid", "test")] == [280, 20, 100]
    total = sum(d.splits[s].sum().item() for s in ("train", "valid", "test"))
    assert total == dense.sum()  # every document lands in exactly one split


def test_bow_bad_files_are_clear_errors(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_count_matrix(tmp_path / "nope.npz")
    np.savez(tmp_path / "dense.npz", counts=np.ones((3, 3)))
    with pytest.raises(DataError, match="scipy.sparse"):
        load_count_matrix(tmp_path / "dense.npz")
    write_csr(tmp_path / "neg.npz", np.array([[1, -2], [0, 1]]))
    with pytest.raises(DataError, match="non-negative integer"):
        load_count_matrix(tmp_path / "neg.npz")
    with pytest.raises(ConfigError, match="data.path"):
        build_dataset(OmegaConf.create({"name": "bow", "path": None}))


def test_model_and_data_must_agree_on_the_visible_layer(tmp_path):
    with pytest.raises(ConfigError, match="model.visible=multinomial"):
        train(make_cfg("train", ["data=synthetic_bow", "trainer.device=cpu", "final_eval.enabled=false"]), tmp_path / "a")
    with pytest.raises(ConfigError, match="needs word counts"):
        train(make_cfg("train", ["data=synthetic", "model.visible=multinomial", "trainer.device=cpu",
                                 "final_eval.enabled=false"]), tmp_path / "b")


def test_document_model_trains_and_reports_perplexity(tmp_path):
    """NVIL on synthetic_bow; evaluate.py's perplexity from the exact log p(d) and from the IS bound."""
    cfg = make_cfg("train", ["data=synthetic_bow", "model.visible=multinomial", "model.layers=[5]",
                             "trainer.device=cpu", "trainer.progress=false", "trainer.tensorboard=false",
                             "trainer.max_steps=300", "trainer.val_every=100", "trainer.log_every=50",
                             "final_eval.enabled=false", "print_config=false"])
    metrics = train(cfg, tmp_path)
    exact_cfg = OmegaConf.load("configs/estimator/exact.yaml")
    iwae_cfg = OmegaConf.merge(OmegaConf.load("configs/estimator/iwae.yaml"), {"num_samples": 500})
    exact = evaluate_checkpoint(metrics["checkpoint"], exact_cfg, EvalSpec(device="cpu", progress=False)).summary()
    bound = evaluate_checkpoint(metrics["checkpoint"], iwae_cfg, EvalSpec(device="cpu", progress=False)).summary()
    assert exact["perplexity_is"] == "exact" and bound["perplexity_is"].startswith("upper bound")
    assert bound["perplexity"] >= exact["perplexity"] - 3 * bound["perplexity_stderr"]
    assert bound["perplexity"] == pytest.approx(exact["perplexity"], rel=0.02)
    # Perplexity is exp(-mean_d log p(d) / L_d), checked against the exact per-document values.
    d = build_dataset(cfg.data)
    test = d.split("test")
    from nvil.app.evaluation import load_model
    model, _, _ = load_model(metrics["checkpoint"], torch.device("cpu"))
    per_word = exact_log_marginal(model, test) / test.sum(1)
    assert exact["perplexity"] == pytest.approx(math.exp(-per_word.mean().item()), rel=1e-3)
    lines = [json.loads(s) for s in open(metrics["checkpoint"] + ".eval.jsonl")]
    assert [line["estimator"] for line in lines] == ["exact", "iwae"]


def test_bow_indices_outside_the_shape_are_refused(tmp_path):
    np.savez(tmp_path / "bad.npz", data=np.array([1, 2]), indices=np.array([0, 7]), indptr=np.array([0, 1, 2]),
             shape=np.array([2, 3]), format=np.array("csr"))
    with pytest.raises(DataError, match="not a valid sparse matrix"):
        load_count_matrix(tmp_path / "bad.npz")
