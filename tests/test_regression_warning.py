"""A validation score that falls far below its best is said (once per episode), and the run goes on: RELAX's
protocol run fell 34 nats late in training and nothing said so (nvil/app/divergence.py, ``DivergenceMonitor.regression``).
"""

from __future__ import annotations

import json
import statistics
import logging

import pytest
import torch

from conftest import ROOT, make_cfg
from nvil.core.checkpoint import load_checkpoint
from nvil.app.divergence import DivergenceMonitor
from test_first_hour import FAST
from nvil.app.main import train


def healthy_curve(n: int = 60, seed: int = 0) -> list[float]:
    """A validation -ELBO curve like NVIL's: a power-law improvement plus the fixed-seed estimate's noise (0.3)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(1, n + 1, dtype=torch.float64)
    return (-113.0 - 40.0 * t.pow(-0.7) + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)).tolist()


def warnings_along(monitor: DivergenceMonitor, scores: list[float]) -> list[int]:
    """The indices of ``scores`` at which ``monitor`` warns, fed as the loop feeds it (best so far, before each)."""
    best, best_i, said = float("-inf"), -1, []
    for i, score in enumerate(scores):
        if monitor.regression("val/elbo", score, best, best_i):
            said.append(i)
        if score > best:
            best, best_i = score, i
    return said


def test_a_late_fall_is_said_once_and_a_healthy_curve_never():
    curve = healthy_curve()
    spike = curve + [-147.4, -140.0, -125.0, -116.0, -114.2, -113.6] + [-150.0, -113.5]
    for seed in range(5):
        assert warnings_along(DivergenceMonitor(), healthy_curve(seed=seed)) == []
    # the fall at 60 is said once while it lasts (61, 62, 63 are below too), and the second fall at 66 again
    assert warnings_along(DivergenceMonitor(), spike) == [60, 66]
    # broken variants, so the assertions above have power: no rule says nothing; a factor of 0.5 sees noise as falls
    assert warnings_along(DivergenceMonitor(regression=None), spike) == []
    assert any(warnings_along(DivergenceMonitor(regression=0.5), healthy_curve(seed=seed)) for seed in range(5))


@pytest.mark.parametrize("run", ["nvil_sbn200_sgd", "nvil_fdarn200", "ws_sbn200_lr0.001",
                                 "nvil_sbn200_ar", "nvil_sbn200_ar_lr0.003", "ws_sbn200_q1"])
def test_the_committed_runs_real_curves_are_not_called_regressions(run):
    """The validation curves of the committed reproduction runs (134 to 1,054 validations each, to 10.5M updates): none
    fell, and none is said to; at a factor of 3 (the broken variant) their noise is, in all but one."""
    rows = [json.loads(line) for line in (ROOT / "bench" / "checkpoints" / f"{run}.val.jsonl").open()]
    scores = [r["val/elbo"] for r in rows if "val/elbo" in r]
    assert len(scores) > 100 and warnings_along(DivergenceMonitor(), scores) == []
    if run != "nvil_sbn200_ar":
        assert warnings_along(DivergenceMonitor(regression=3), scores)


def test_the_wake_sleep_runs_validation_dip_is_said_where_it_is():
    """ws_sbn200, trained to 7.05M updates: its 100-image validation score dipped ~0.3 nats below its best around
    updates 4.0-4.13M (the test figure kept improving: docs/reproductions.md, row 4 and note 1.2), more than 10 of
    the run's median validation-to-validation changes. The rule says so there and only in that stretch; the dip,
    measured from the data, is that deep."""
    rows = [json.loads(line) for line in (ROOT / "bench" / "checkpoints" / "ws_sbn200.val.jsonl").open()]
    steps, scores = [r["step"] for r in rows], [r["val/elbo"] for r in rows]
    said = [steps[i] for i in warnings_along(DivergenceMonitor(), scores)]
    assert said and all(3_960_000 <= s <= 4_200_000 for s in said)
    i = steps.index(said[0])
    changes = [abs(b - a) for a, b in zip(scores[max(0, i - 100):i], scores[max(1, i - 99):i + 1])]
    assert max(scores[:i]) - scores[i] > 10 * statistics.median(changes)


def test_relaxs_real_fall_is_said():
    """RELAX under its published protocol, updates 1,448,000-2,000,000 (committed curve): its control variate's
    temperature ran from 0.28 to 320 at update ~1.811M and the validation -ELBO(10) went from 113.3 to 159.8 before
    recovering. The rule says so at the first validation after the fall, once; with the rule off nothing is said."""
    rows = [json.loads(line) for line in (ROOT / "bench" / "checkpoints" / "discrete_relax_relax_s0.val.jsonl").open()]
    steps, scores = [r["step"] for r in rows], [r["val/elbo"] for r in rows]
    assert [steps[i] for i in warnings_along(DivergenceMonitor(), scores)] == [1_812_000]
    assert warnings_along(DivergenceMonitor(regression=None), scores) == []


def test_the_rule_survives_a_resume_and_reads_older_checkpoints():
    curve = healthy_curve() + [-147.4, -140.0]
    whole = DivergenceMonitor()
    assert warnings_along(whole, curve) == [60]
    first, second = DivergenceMonitor(), DivergenceMonitor()
    warnings_along(first, curve[:61])
    second.load_state_dict(first.state_dict())
    assert second.changes == first.changes and second.regressing  # still in the episode: -140 is not said again
    assert second.regression("val/elbo", -140.0, max(curve[:61]), 0) is None
    old = DivergenceMonitor()
    old.load_state_dict({"train/elbo": [-550.0, -110.0]})  # a checkpoint written before the rule
    assert old.range == {"train/elbo": (-550.0, -110.0)} and old.changes == [] and not old.regressing


def test_a_training_run_warns_in_its_log_and_counts_the_episode(tmp_path, monkeypatch, caplog):
    scripted = iter(healthy_curve(8) + [-200.0, -190.0, -200.0])  # validations at steps 20, 40, ..., 220

    def validate(*args, **kwargs):
        return {"val/elbo": next(scripted)}

    monkeypatch.setattr("nvil.app.loop.validate", validate)
    with caplog.at_level(logging.WARNING, logger="nvil"):
        # the scripted scores are MNIST's, below the floor of 12 binary pixels: that rule is off here
        result = train(make_cfg("train", FAST + ["trainer.max_steps=220", "trainer.divergence_floor=null"]), tmp_path)
    said = [r.getMessage() for r in caplog.records if "below its best" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("step 180: val/elbo fell to -200")
    assert result["val/regressions"] == 1
    assert load_checkpoint(tmp_path / "checkpoints" / "last.pt")["loop"]["regressions"] == 1
    assert load_checkpoint(tmp_path / "checkpoints" / "best.pt")["step"] == 160  # best.pt keeps the best
