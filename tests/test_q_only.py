"""bench/q_only.py: q trains alone from a checkpoint, the model's parameters stay put."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import ROOT, SYNTHETIC, make_cfg

sys.path.insert(0, str(ROOT / "bench"))

from q_only import main, q_only  # noqa: E402

from nvil.app.loop import fit  # noqa: E402


def trained_checkpoint(tmp_path: Path) -> Path:
    fit(make_cfg("train", [*SYNTHETIC, "trainer.max_steps=40"]), tmp_path / "run")
    return tmp_path / "run" / "checkpoints" / "last.pt"


def test_model_frozen_and_q_moves_only_at_a_nonzero_rate(tmp_path, capsys):
    checkpoint = trained_checkpoint(tmp_path)
    still = q_only(checkpoint, 0.0, updates=30, every=10, examples=50)   # q at rate 0 too: nothing may move
    assert [u for u, _ in still] == [0, 10, 20, 30]
    assert len({v for _, v in still}) == 1                             # the same seeded bound, exactly
    moved = q_only(checkpoint, 0.5, updates=30, every=10, examples=50)  # the failing variant: q trains
    assert moved[0][1] == still[0][1] and any(v != still[0][1] for _, v in moved[1:])
    main([str(checkpoint), "--q-lr", "0,0.5", "--updates", "20", "--every", "10", "--examples", "50"])
    out = capsys.readouterr().out
    assert "| q lr | 0 | 10 | 20 |" in out and "| 0.5 |" in out


def test_missing_checkpoint_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="no checkpoint at"):
        main([str(tmp_path / "absent.pt")])
