"""bench/paired_bound.py: two checkpoints on the same images with the same draws from q, and their paired difference.

The pairing is what the script is for, so the tests check it where the answer is known: a checkpoint against itself
differs by exactly zero (independent draws for the two sides, the broken variant, would not), and two checkpoints of
one run give the difference of their own per-image bounds with a standard error far below the unpaired one. Data
that do not pair are refused in one line.
"""

from __future__ import annotations

import math
import shutil
import sys

import pytest

from conftest import ROOT, SYNTHETIC, make_cfg
from nvil.app.main import train

sys.path.insert(0, str(ROOT / "bench"))

import paired_bound  # noqa: E402


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Two checkpoints of one small SBN run on synthetic data (updates 20 and 200), and one of a run on other data."""
    root = tmp_path_factory.mktemp("paired")
    out = {}
    for name, steps, extra in (("early", 20, []), ("late", 200, []), ("other_data", 20, ["data.seed=5"])):
        train(make_cfg("train", SYNTHETIC + [f"trainer.max_steps={steps}", *extra]), root / name)
        out[name] = str(shutil.copy(root / name / "checkpoints" / "last.pt", root / f"{name}.pt"))
    return out


def run(capsys, *argv: str) -> str:
    paired_bound.main([*argv, "--num-examples", "300"])
    return capsys.readouterr().out


def difference(out: str) -> tuple[float, float | None]:
    line = next(line for line in out.splitlines() if line.startswith("B - A"))
    d = float(line.split(":")[1].split()[0])
    return d, float(line.split("±")[1].split()[0]) if "±" in line else None


def test_a_checkpoint_against_itself_differs_by_exactly_zero(checkpoints, capsys):
    out = run(capsys, checkpoints["late"], checkpoints["late"])
    assert difference(out) == (0.0, None) and "every image the same" in out


def test_independent_draws_would_not_pair(checkpoints, monkeypatch):
    """Power: with a different seed for the second side (what an unpaired comparison does) the same checkpoint
    differs from itself image by image."""
    args = paired_bound.parse_args([str(checkpoints["late"]), str(checkpoints["late"]), "--num-examples", "300"])
    a, _, _ = paired_bound.per_image(checkpoints["late"], args)
    args.seed = 1
    b, _, _ = paired_bound.per_image(checkpoints["late"], args)
    assert (a - b).abs().max() > 0.01


def test_two_checkpoints_pair_with_a_small_standard_error(checkpoints, capsys):
    out = run(capsys, checkpoints["early"], checkpoints["late"])
    d, d_se = difference(out)
    args = paired_bound.parse_args([str(checkpoints["early"]), str(checkpoints["late"]), "--num-examples", "300"])
    a, _, step_a = paired_bound.per_image(checkpoints["early"], args)
    b, _, step_b = paired_bound.per_image(checkpoints["late"], args)
    assert (step_a, step_b) == (20, 200) and f"{step_b:,}" in out
    diff = (b - a).double()
    assert d == pytest.approx(diff.mean().item(), abs=5e-4)
    assert d_se == pytest.approx((diff.std() / math.sqrt(diff.numel())).item(), abs=5e-4)
    unpaired = math.sqrt(paired_bound.mean_se(a)[1] ** 2 + paired_bound.mean_se(b)[1] ** 2)
    assert d_se < unpaired / 2  # the images' spread, shared by both sides, cancels


def test_checkpoints_of_other_data_are_refused(checkpoints):
    with pytest.raises(SystemExit, match="do not hold the same test images"):
        paired_bound.main([str(checkpoints["early"]), str(checkpoints["other_data"])])
    with pytest.raises(SystemExit, match="fewer than --num-examples"):
        paired_bound.main([str(checkpoints["early"]), str(checkpoints["late"]), "--num-examples", "100000"])
    with pytest.raises(SystemExit):
        paired_bound.parse_args([str(checkpoints["early"]), str(checkpoints["late"]), "--num-samples", "0"])
