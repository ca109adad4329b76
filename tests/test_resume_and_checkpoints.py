"""Resume continues exactly; checkpoints are atomic and bad ones are refused with one-line errors."""

from __future__ import annotations

import io

import pytest
import torch

from conftest import make_cfg
from nvil.core.checkpoint import load_checkpoint, save_checkpoint
from nvil.core.errors import CheckpointError, ConfigError, TrainingDiverged
from nvil.app.evaluation import load_model
from nvil.learners.nvil import NVIL
from nvil.app.main import train


def params(path):
    payload = load_checkpoint(path)
    return payload["model"] | {f"q.{k}": v for k, v in payload["inference"].items()}, payload


def test_resume_gives_identical_parameters(tmp_path, synthetic_overrides):
    n = 60
    straight = make_cfg("train", synthetic_overrides + [f"trainer.max_steps={n}"])
    train(straight, tmp_path / "straight")
    half = make_cfg("train", synthetic_overrides + [f"trainer.max_steps={n // 2}"])
    train(half, tmp_path / "resumed")
    rest = make_cfg("train", synthetic_overrides + [f"trainer.max_steps={n}", "trainer.resume=true"])
    train(rest, tmp_path / "resumed")
    a, pa = params(tmp_path / "straight/checkpoints/last.pt")
    b, pb = params(tmp_path / "resumed/checkpoints/last.pt")
    assert pa["step"] == pb["step"] == n
    for k in a:
        assert torch.equal(a[k], b[k]), k
    for part in ("baselines", "moments"):
        for k, v in pa["learner"][part].items():
            assert torch.equal(v, pb["learner"][part][k]), k
    assert pa["best_score"] == pb["best_score"]


def test_run_directory_layout(tmp_path, synthetic_overrides):
    cfg = make_cfg("train", synthetic_overrides + ["trainer.max_steps=40", "trainer.tensorboard=true"])
    train(cfg, tmp_path)
    for name in ("checkpoints/last.pt", "checkpoints/best.pt", "config.yaml", "metrics.jsonl"):
        assert (tmp_path / name).is_file(), name
    assert any((tmp_path / "tb").iterdir())
    text = (tmp_path / "metrics.jsonl").read_text()
    assert '"train/elbo"' in text and '"val/elbo"' in text and '"nvil/layer2/signal_var"' in text


def test_existing_run_is_not_overwritten_without_resume(tmp_path, synthetic_overrides):
    cfg = make_cfg("train", synthetic_overrides + ["trainer.max_steps=20"])
    train(cfg, tmp_path)
    before = (tmp_path / "checkpoints/last.pt").read_bytes()
    with pytest.raises(ConfigError, match="already holds a run.*trainer.resume=true"):
        train(cfg, tmp_path)
    assert (tmp_path / "checkpoints/last.pt").read_bytes() == before


def test_resume_with_another_model_is_refused(tmp_path, synthetic_overrides):
    train(make_cfg("train", synthetic_overrides + ["trainer.max_steps=20"]), tmp_path)
    other = make_cfg("train", synthetic_overrides + ["trainer.max_steps=40", "trainer.resume=true", "model.layers=[5]"])
    with pytest.raises(CheckpointError, match=r"cannot resume.*model\.layers=\[4, 3\], but this run asks for model\.layers=\[5\]"):
        train(other, tmp_path)


def test_nan_during_training_stops_with_a_message_and_keeps_the_last_good_checkpoint(
        tmp_path, synthetic_overrides, monkeypatch):
    original = NVIL.step
    calls = {"n": 0}

    def poisoned(self, x, diagnostics=False):
        metrics = original(self, x, diagnostics)
        calls["n"] += 1
        if calls["n"] >= 25:  # from step 25 on the model's weights are NaN
            with torch.no_grad():
                self.model.decoders[0].weight.fill_(float("nan"))
        return metrics

    monkeypatch.setattr(NVIL, "step", poisoned)
    cfg = make_cfg("train", synthetic_overrides + ["trainer.max_steps=100"])
    with pytest.raises(TrainingDiverged, match="diverged at step 30.*last good checkpoint"):
        train(cfg, tmp_path)
    payload = load_checkpoint(tmp_path / "checkpoints/last.pt")
    assert payload["step"] == 20
    assert all(torch.isfinite(v).all() for v in payload["model"].values())


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"config": {}, "model_name": "sbn", "n_visible": 1, "model": {}})
    good = path.read_bytes()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, {"config": {}, "model_name": "sbn", "n_visible": 2, "model": {}})
    assert path.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


# ---- bad checkpoints, each refused with a one-line CheckpointError ----------------------------------


@pytest.fixture
def good_checkpoint(tmp_path, synthetic_overrides):
    train(make_cfg("train", synthetic_overrides + ["trainer.max_steps=20"]), tmp_path / "run")
    return tmp_path / "run/checkpoints/last.pt"


def one_line(excinfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text
    return text


def test_missing_checkpoint(tmp_path):
    with pytest.raises(CheckpointError) as e:
        load_model(tmp_path / "nope.pt", torch.device("cpu"))
    assert "checkpoint not found" in one_line(e)


def test_truncated_checkpoint(tmp_path, good_checkpoint):
    bad = tmp_path / "truncated.pt"
    bad.write_bytes(good_checkpoint.read_bytes()[:2000])
    with pytest.raises(CheckpointError) as e:
        load_model(bad, torch.device("cpu"))
    assert "truncated or corrupt" in one_line(e)


def test_checkpoint_of_another_model(tmp_path, good_checkpoint):
    payload = load_checkpoint(good_checkpoint)
    payload["model_name"] = payload["config"]["model"]["name"] = "darn"
    save_checkpoint(tmp_path / "darn.pt", payload)
    with pytest.raises(CheckpointError) as e:
        load_model(tmp_path / "darn.pt", torch.device("cpu"))
    assert "holds a model 'darn'" in one_line(e)

    payload = load_checkpoint(good_checkpoint)  # SBN weights under an RBM's name and config
    payload["model_name"] = "rbm"
    payload["config"]["model"] = {"name": "rbm", "n_hidden": 7, "visible": "binary", "labels": False}
    save_checkpoint(tmp_path / "rbm.pt", payload)
    with pytest.raises(CheckpointError) as e:
        load_model(tmp_path / "rbm.pt", torch.device("cpu"))
    assert "does not match this rbm model" in one_line(e)

    payload = load_checkpoint(good_checkpoint)
    payload["config"]["model"]["layers"] = [7]  # state dict of a 4-3 SBN, config of a 7-unit one
    save_checkpoint(tmp_path / "mismatch.pt", payload)
    with pytest.raises(CheckpointError) as e:
        load_model(tmp_path / "mismatch.pt", torch.device("cpu"))
    assert "does not match this sbn model" in one_line(e)


class Payload:
    """An arbitrary class: unpickling it would run code from the file."""

    def __reduce__(self):
        return (print, ("pwned",))


def test_checkpoint_with_a_pickle_payload_is_refused(tmp_path, good_checkpoint, capsys):
    payload = load_checkpoint(good_checkpoint)
    payload["extra"] = Payload()
    buf = io.BytesIO()
    torch.save(payload, buf)
    (tmp_path / "evil.pt").write_bytes(buf.getvalue())
    with pytest.raises(CheckpointError) as e:
        load_model(tmp_path / "evil.pt", torch.device("cpu"))
    assert "refusing to load" in one_line(e)
    assert "pwned" not in capsys.readouterr().out


def test_file_that_is_not_a_checkpoint(tmp_path):
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError) as e:
        load_model(tmp_path / "other.pt", torch.device("cpu"))
    assert "not an nvil checkpoint" in one_line(e)


def test_resume_accepts_config_keys_added_after_the_checkpoint(tmp_path, synthetic_overrides):
    """A checkpoint written before a config key existed still resumes; a changed value does not."""
    train(make_cfg("train", synthetic_overrides + ["trainer.max_steps=20"]), tmp_path)
    path = tmp_path / "checkpoints/last.pt"
    payload = load_checkpoint(path)
    del payload["config"]["model"]["doc_length"]
    save_checkpoint(path, payload)
    m = train(make_cfg("train", synthetic_overrides + ["trainer.max_steps=30", "trainer.resume=true"]), tmp_path)
    assert m["step"] == 30
    with pytest.raises(CheckpointError, match=r"model\.inference\.autoregressive=False, but this run asks for "
                                              r"model\.inference\.autoregressive=True"):
        train(make_cfg("train", synthetic_overrides + ["trainer.max_steps=40", "trainer.resume=true",
                                                       "model.inference.autoregressive=true"]), tmp_path)


def test_a_run_stopped_early_goes_on_when_resumed_with_patience_left_or_none(tmp_path, synthetic_overrides,
                                                                              monkeypatch):
    """The NVIL paper's early stopping keeps the best parameters and does not end training: a run that a patience
    rule stopped goes on when resumed with ``trainer.patience=null`` (or a patience it has not used up), through
    the command line's path (``run_config``: the run's own config, then the safe overrides, null included)."""
    from nvil.app.resume import run_config
    scores = iter([-100.0 - i for i in range(100)])  # every validation worse than the first: no improvement
    monkeypatch.setattr("nvil.app.loop.validate", lambda *a, **k: {"val/elbo": next(scores)})
    first = train(make_cfg("train", synthetic_overrides + ["trainer.patience=2", "trainer.max_steps=200"]), tmp_path)
    assert first["stopped_early"] and first["step"] == 60  # validations at 20 (best), 40, 60: two without improving

    def resume(*extra):
        overrides = ["trainer.resume=true", *extra]
        cfg, resumed = run_config(make_cfg("train", overrides), tmp_path, overrides)
        assert resumed
        return train(cfg, tmp_path)

    same = resume()  # the broken variant: the run's own patience, used up, stops it again at once
    assert same["stopped_early"] and same["step"] == 60
    more = resume("trainer.patience=4")
    assert more["stopped_early"] and more["step"] == 100
    on = resume("trainer.patience=null")
    assert not on["stopped_early"] and on["step"] == 200
    assert load_checkpoint(tmp_path / "checkpoints" / "best.pt")["step"] == 20
