"""Every experiment preset composes, builds its model, and carries the paper's protocol."""

from __future__ import annotations

import re

import pytest

from conftest import CONFIG_DIR, SYNTHETIC, make_cfg
from models import build_model
from train import train

PRESETS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("name", PRESETS)
def test_preset_composes_and_builds(name):
    cfg = make_cfg("train", [f"experiment={name}"])
    model, inference = build_model(cfg.model, 784)
    if name == "nvil_mnist_paper":
        return
    kind, arch = re.match(r"(nvil|ws)_(\w+?)(?:_ar)?$", name).groups()
    assert cfg.learner.name == {"nvil": "nvil", "ws": "wake_sleep"}[kind]
    assert cfg.model.name == ("fdarn" if arch.startswith("fdarn") else "sbn")
    assert bool(cfg.model.inference.autoregressive) == name.endswith("_ar")
    expected = {"200": [200], "500": [500], "200x2": [200, 200], "200x3": [200, 200, 200], "200_200_500": [200, 200, 500]}
    assert model.layers == expected[arch.removeprefix("sbn").removeprefix("fdarn")]
    assert (cfg.trainer.batch_size, cfg.data.holdout_valid, cfg.learner.optimizer) == (20, 100, "sgd")
    assert cfg.learner.inference_lr_scale == 0.2
    assert re.search(r"test -ELBO \d+\.\d nats", (CONFIG_DIR / "experiment" / f"{name}.yaml").read_text())


@pytest.mark.parametrize("extra", [["model=fdarn", "model.n_latent=5"], ["learner=wake_sleep"],
                                   ["model.inference.autoregressive=true"]], ids=["fdarn", "wake_sleep", "ar_q"])
def test_variants_train_and_resume(tmp_path, extra):
    base = [o for o in SYNTHETIC if not o.startswith("model.layers")] + extra
    if "model=fdarn" not in extra:
        base.append("model.layers=[4,3]")
    m1 = train(make_cfg("train", base + ["trainer.max_steps=40"]), tmp_path)
    m2 = train(make_cfg("train", base + ["trainer.max_steps=60", "trainer.resume=true"]), tmp_path)
    assert (m1["step"], m2["step"]) == (40, 60)
    assert m2["val/best"] > -20  # sanity: on 12 binary pixels even a uniform model scores -8.3 nats
