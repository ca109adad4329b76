"""Evaluation progress: the per-example estimators advance the bar in fractions of an example within a batch
(after every sweep or AIS step), end at exactly the number of examples, name their log Z phase on the bar, and
give bit-identical estimates with or without a bar (the bar only counts; it draws no random numbers)."""

from __future__ import annotations

import io

import pytest
import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from conftest import tiny_model
from nvil.estimators import build_estimator
from nvil.estimators.base import BatchProgress
from nvil.models.dbn import DBN
from nvil.models.gaussian import GaussianBeliefNet

N, BATCH = 6, 3  # two batches of three examples


class RecordingBar:
    """What the estimators see of tqdm: ``n``, ``total``, ``update``, ``reset``, ``set_description``, ``disable``;
    every call recorded."""

    disable = False

    def __init__(self, total: float) -> None:
        self.n, self.total = 0, total
        self.updates: list[float] = []      # each update's n
        self.trace: list[float] = []        # bar.n after each update
        self.descriptions: list[str] = []
        self.resets = 0

    def update(self, n: float = 1) -> None:
        self.updates.append(n)
        self.n += n
        self.trace.append(self.n)

    def reset(self, total=None) -> None:
        self.n, self.resets = 0, self.resets + 1
        if total is not None:
            self.total = total

    def set_description(self, desc=None, refresh=True) -> None:
        self.descriptions.append(desc)


def binary_data(n_visible: int, seed: int = 3) -> torch.Tensor:
    return (torch.rand(N, n_visible, generator=torch.Generator().manual_seed(seed)) < 0.5).float()


def tiny_dbn() -> DBN:
    torch.manual_seed(0)
    dbn = DBN(8, [5, 6])
    with torch.no_grad():
        for rbm in dbn.rbms:
            rbm.W.normal_(0, 0.5)
    return dbn


def tiny_gbn() -> GaussianBeliefNet:
    torch.manual_seed(0)
    return GaussianBeliefNet(6, [2, 2], nonlinearity="tanh", sigma=0.5, init_scale=0.5)


LOG_Z = {"num_chains": 20, "schedule": "adaptive", "num_betas": 60, "seed": 0, "cache": False, "num_climb": 8,
         "num_data_probes": 50}
CASES = {  # estimator config, model; small settings that still take many steps per batch
    "chib": ({"name": "chib", "num_steps": 6, "num_runs": 2, "max_hill_climb_sweeps": 20}, "sbn"),
    "chib_dbn": ({"name": "chib", "num_steps": 6, "num_runs": 2, "log_z": LOG_Z}, "dbn"),
    "ais_posterior": ({"name": "ais_posterior", "num_betas": 40, "num_runs": 2, "schedule": "adaptive",
                       "pilot_fraction": 0.1}, "sbn"),
    "harmonic": ({"name": "harmonic", "num_samples": 8, "burn_in": 2, "num_runs": 2}, "sbn"),
    "dbn_bound": ({"name": "dbn_bound", "num_samples": 10, "log_z": LOG_Z}, "dbn"),
    "iwae": ({"name": "iwae", "num_samples": 40, "max_elements": 300}, "sbn"),  # chunks of 300 // (3 x 13) = 7
    "elbo": ({"name": "elbo", "num_samples": 40, "max_elements": 300}, "sbn"),
    "ais_hmc": ({"name": "ais_hmc", "num_betas": 10, "num_runs": 2, "num_leapfrog": 2}, "gbn"),
    "chib_mh": ({"name": "chib_mh", "num_steps": 5, "num_runs": 2, "adapt_steps": 5, "hill_climb_steps": 5}, "gbn"),
    "bdmc": ({"name": "bdmc", "num_simulated": N, "num_betas": 10, "num_chains": 2, "schedule": "adaptive"}, "sbn"),
}


MIN_UPDATES_PER_BATCH = {"dbn_bound": 2}  # one vectorised draw: the draw, then log P* (its long phase is log Z)


def setup(case: str):
    cfg, kind = CASES[case]
    cfg = OmegaConf.create({**cfg, "batch_size": BATCH})
    if kind == "sbn":
        model, inference = tiny_model(n_visible=6, layers=(4, 3))
        return build_estimator(cfg), model, inference, binary_data(6), {}
    if kind == "dbn":
        dbn = tiny_dbn()
        train = (torch.rand(100, 8, generator=torch.Generator().manual_seed(1)) < 0.4).float()
        return build_estimator(cfg), dbn, None, binary_data(8), {"train": train}
    return build_estimator(cfg), tiny_gbn(), None, binary_data(6), {}


def run(case: str, bar):
    est, model, inference, x, inputs = setup(case)
    return est.estimate(model, x, inference=inference, generator=torch.Generator().manual_seed(0), seed=7,
                        progress=bar, **inputs)


@pytest.mark.parametrize("case", list(CASES))
def test_bar_moves_within_each_batch_ends_exactly_and_changes_no_estimate(case):
    bar = RecordingBar(N)
    with_bar = run(case, bar)
    without = run(case, None)
    assert torch.equal(with_bar.log_p, without.log_p), "the bar changed an estimate"
    if with_bar.run_log_p is not None:
        assert torch.equal(with_bar.run_log_p, without.run_log_p)
    assert bar.n == N, f"the bar ends at {bar.n!r}, not {N}"  # exact: no 5.9999 / 6
    assert all(n > -1e-12 for n in bar.updates) and max(bar.trace) <= N + 1e-12, "the bar went back or overshot"
    # many updates, not one per batch; and some of them strictly inside a batch (a fractional count)
    batches = N // BATCH
    assert len(bar.updates) >= MIN_UPDATES_PER_BATCH.get(case, 4) * batches > batches, \
        f"{len(bar.updates)} updates for {batches} batches"
    inside = [n for n in bar.trace if abs(n - round(n)) > 1e-9]
    assert len(inside) >= N // BATCH
    # each batch ends on its boundary
    assert BATCH in bar.trace and N in bar.trace


@pytest.mark.parametrize("case", ["chib_dbn", "dbn_bound"])
def test_log_z_phase_names_itself_then_the_clock_restarts_for_the_examples(case):
    bar = RecordingBar(N)
    run(case, bar)
    steps = [d for d in bar.descriptions if d and "log Z (" in d]
    name = CASES[case][0]["name"]
    assert f"{name}: log Z (pilot AIS, 1/4)" in steps and f"{name}: log Z (forward AIS, 2/4)" in steps
    assert f"{name}: log Z (reverse AIS, 4/4)" in steps
    assert bar.descriptions[-1] == name  # back to the estimator's name for the per-example work
    assert bar.resets == 1


def test_rbm_ais_names_its_log_z_phases():
    from nvil.models.rbm import BoltzmannMachine

    torch.manual_seed(0)
    rbm = BoltzmannMachine(8, 5)
    train = (torch.rand(100, 8, generator=torch.Generator().manual_seed(1)) < 0.4).float()
    ais_keys = {k: v for k, v in LOG_Z.items() if k not in ("seed", "cache")}  # the log Z block's own keys
    cfg = OmegaConf.create({"name": "ais", **ais_keys, "schedule": "linear", "batch_size": 4})
    bar = RecordingBar(N)
    est = build_estimator(cfg)
    r = est.estimate(rbm, binary_data(8), generator=torch.Generator().manual_seed(0), seed=0, progress=bar, train=train)
    assert "ais: log Z (forward AIS, 1/3)" in bar.descriptions and "ais: log Z (reverse AIS, 3/3)" in bar.descriptions
    assert bar.descriptions[-1] == "ais" and bar.n == N and r.log_p.numel() == N


def test_batch_progress_with_a_real_tqdm_ends_exactly_and_prints_fractions():
    """Thirds and sevenths do not add up to whole numbers in floating point; ``finish`` makes them."""
    out = io.StringIO()
    with tqdm(total=10, file=out, mininterval=0, miniters=0, ascii=True,
              bar_format="{l_bar}{bar}| {n:.1f}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]") as bar:
        for rows, units in ((3, 7), (3, 3), (4, 11)):
            share = BatchProgress(bar, rows, units)
            for _ in range(units):
                share.advance()
            assert bar.n <= 10
            share.finish()
    assert bar.n == 10
    text = out.getvalue()
    assert "10.0/10" in text and "0.4/10" in text  # 3/7 of an example shows as 0.4


def test_batch_progress_never_overshoots_and_waits_after_a_raised_plan():
    bar = RecordingBar(5)
    share = BatchProgress(bar, 5, units=4)
    share.advance(3)
    assert bar.n == pytest.approx(3.75)
    share.plan(8)  # more work than planned: the bar waits until the work catches up
    share.advance(2)
    assert bar.n == pytest.approx(3.75)
    share.advance(10)  # past the plan: held at the batch's end
    assert bar.n == pytest.approx(5) and bar.n <= 5
    share.finish()
    assert bar.n == 5
    BatchProgress(None, 5).finish()  # no bar: nothing to do
