"""The power of the certified AIS log Z (estimators/certify.py) on two RBMs whose log Z is enumerable, with fixed
seeds (bench/certificate_power.py measures it on more models and runs):

- a right estimate (enough betas: within 3 SE of the exact log Z) is certified, on an RBM trained by PCD, whose
  stored persistent chains are not equilibrium samples, and on a random RBM with strong weights; the broken
  variant, reverse chains from the stored particles alone, fails the same right estimates;
- a wrong one is flagged: a ladder too coarse (several nats low), and the right estimate moved by 2 nats either
  way; the broken variant, the same certificate without its reverse run, passes the estimate moved up;
- the kept reverse run is never one below the hard lower bound while another is consistent with it, a cached
  certificate whose kept run was swapped fails its re-check, and resampling draws the forward end states in
  proportion to their weights (the broken variant, uniform draws, does not);
- a certificate made on more rows than it probes passes the re-verification of a cached entry (its bound
  includes the fixed reference probes; the broken variant, a bound without them, does not);
- on a protocol model with binary latents (bench/certificate_power_models.py), the per-example certificate of
  ``evaluate_model`` with no settings (AIS or SMC within the budget) holds, its band holds the enumerated mean
  log p(x) and, moved by 2 nats either way, misses it, the estimate moved down fails ``above_iwae`` and
  ``reverse_gap``, moved up ``reverse_order``; the broken variant, the certificate without its IWAE comparison
  and reverse runs, passes both.
"""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from certificate_power import Case, case, certify, off, pcd_case, random_rbm, shifted  # noqa: E402
from certificate_power_models import BinaryVAE, band_holds, enumerated_log_p, run, simulate  # noqa: E402
from certificate_power_models import shifted as shifted_example  # noqa: E402

from nvil.estimators.ais_rbm import base_rate  # noqa: E402
from nvil.estimators.annealing import LogZ  # noqa: E402
from nvil.estimators.certify import (CertifiedLogZ, HardBound, ReverseRun, certified_log_z,  # noqa: E402
                                     choose_reverse, hard_lower_bound, reference_bound, resampled_end_states)
from nvil.estimators.log_z import recheck, verify  # noqa: E402
from nvil.estimators.settings import CertifySettings  # noqa: E402

SEEDS = (0, 1, 2)


@functools.cache
def model(name: str) -> Case:
    """Two test models, seeds apart from the bench's held-out ones."""
    if name == "pcd":
        return pcd_case(20, 4, 0.05, 10, 1000, 0.1, seed=7)
    rows = (torch.rand(500, 20, generator=torch.Generator().manual_seed(7)) < 0.1).float()
    return case("random", random_rbm(7), rows)


@functools.cache
def enough(name: str, seed: int, sources=None) -> CertifiedLogZ:
    c = model(name)
    return certify(c, "adaptive", 1000, 100, seed) if sources is None else certify(c, "adaptive", 1000, 100, seed,
                                                                                    sources)


@pytest.mark.parametrize("name", ["pcd", "random"])
def test_right_estimates_are_certified(name):
    c = model(name)
    for seed in SEEDS:
        r = enough(name, seed)
        assert not off(r, c.exact), (seed, r.forward, c.exact)  # right: within 3 SE (+ 0.01) of the exact log Z
        assert r.certified is True, (seed, r.warnings, r.reverse_choice)


def test_reverse_chains_from_the_stored_particles_alone_fail_right_estimates():
    """The broken variant: the PCD chains lag the model, so reverse AIS from them falls below the hard lower bound
    and inverts the sandwich, though the forward estimate is right."""
    c = model("pcd")
    for seed in SEEDS:
        r = enough("pcd", seed, ("particles",))
        assert not off(r, c.exact) and r.reverse_source == "particles"
        assert r.certified is False and "reverse_hard_lower_bound" in r.failed, r.failed


def test_a_ladder_too_coarse_is_flagged():
    """5 linear betas on the random RBM: every forward estimate several nats low, every one flagged."""
    c = model("random")
    for seed in SEEDS:
        r = certify(c, "linear", 5, 100, seed)
        assert r.forward.log_z < c.exact - 2 and off(r, c.exact), r.forward
        assert r.certified is False and {"hard_lower_bound", "sandwich_gap"} <= set(r.failed), r.failed


@pytest.mark.parametrize("name", ["pcd", "random"])
def test_right_estimates_moved_by_2_nats_are_flagged(name):
    for seed in SEEDS:
        up, down = shifted(enough(name, seed), 2.0), shifted(enough(name, seed), -2.0)
        assert up.certified is False and "sandwich_order" in up.failed, up.failed
        assert down.certified is False and {"hard_lower_bound", "sandwich_gap"} & set(down.failed), down.failed


def test_without_its_reverse_run_the_certificate_passes_an_estimate_moved_up():
    """The broken variant of the test above: the hard lower bound cannot see an over-estimate; the reverse run
    is what flags it."""
    r = enough("random", 0)
    blind = replace(r, reverse=None, reverse_init=None, reverse_source=None, reverse_choice=None, reverse_runs=[])
    assert shifted(blind, 2.0).certified is True


def logz(log_z: float, stderr: float, ess: float, chains: int = 100) -> LogZ:
    return LogZ(log_z, stderr, (log_z - 3 * stderr, log_z + 3 * stderr), ess, chains, 10, "reverse", 0.0, 1.0)


def test_the_kept_reverse_run_is_consistent_with_the_hard_bound_then_has_the_highest_ess():
    bound = HardBound(10.0, 10.0, "hill-climbed states", 5)
    runs = [ReverseRun("particles", "p", logz(9.0, 0.1, 99.0)),  # 9.3 < 10: below the bound, highest ESS
            ReverseRun("forward", "f", logz(10.2, 0.1, 60.0)), ReverseRun("data", "d", logz(10.1, 0.1, 80.0))]
    kept, why = choose_reverse(runs, bound)
    assert kept.source == "data" and why.startswith("data (consistent with the hard lower bound")
    assert "particles: ESS 0.99 of its chains, 0.70 nats below the hard lower bound" in why
    kept, why = choose_reverse(runs[:1] + [ReverseRun("data", "d", logz(8.0, 0.1, 90.0))], bound)
    assert kept.source == "particles" and "no source is consistent" in why  # the least far below
    assert choose_reverse(runs, None)[0].source == "particles"  # without a bound: the highest ESS


def test_a_cached_certificate_whose_kept_run_was_swapped_fails_its_recheck():
    c = CertifiedLogZ.from_dict(enough("pcd", 0).to_dict())
    assert recheck(c, CertifySettings()).certified is True
    other = next(r for r in c.reverse_runs if r.source != c.reverse_source)
    swapped = replace(c, reverse=other.estimate, reverse_init=other.init, reverse_source=other.source)
    with pytest.raises(ValueError, match="not the one its numbers choose"):
        recheck(swapped, CertifySettings())


def resampling_z_scores(draw) -> torch.Tensor:
    """(count - n p) / sqrt(n p (1 - p)) for each of 5 end states drawn n = 20,000 times by ``draw``."""
    x, log_w = torch.eye(5), torch.tensor([0.0, 1.0, 2.0, -1.0, 0.5], dtype=torch.float64)
    n, p = 20_000, torch.softmax(log_w, 0)
    counts = draw(x, log_w, n, torch.Generator().manual_seed(0)).sum(0).double()
    return (counts - n * p) / (n * p * (1 - p)).sqrt()


def test_resampling_draws_end_states_in_proportion_to_their_weights():
    assert resampling_z_scores(resampled_end_states).abs().max() < 4  # 5 counts, each within 4 SD
    uniform = lambda x, log_w, n, g: x[torch.randint(0, len(x), (n,), generator=g)]  # noqa: E731
    assert resampling_z_scores(uniform).abs().max() > 4 * math.sqrt(2)  # the broken variant: far outside


def test_a_certificate_on_more_rows_than_it_probes_passes_its_re_verification():
    """A cached certificate is checked against ``reference_bound`` (the first 1000 rows); its own data probes are a
    random 1000 of 5000 rows, here sorted best first, so only a bound that includes the reference probes is never
    exceeded by it. The broken variant, the bound of the random rows alone, fails the re-verification."""
    m = random_rbm(3, V=30, H=40, scale=0.1)  # weak weights: every row carries mass, the visible side dominates
    rows = (torch.rand(5000, 30, generator=torch.Generator().manual_seed(3)) < 0.5).float()
    rows = rows[(-m.free_energy(rows)).argsort(descending=True)]
    c = certified_log_z(m, base_rate(m, rows), {"num_chains": 50, "schedule": "linear", "num_betas": 50},
                        CertifySettings(), torch.Generator().manual_seed(0), data_rows=rows)
    verify(c, m, rows)
    probes = rows[torch.randperm(len(rows), generator=torch.Generator().manual_seed(1))[:1000]]
    own = hard_lower_bound(m, {"training rows": probes}, torch.Generator().manual_seed(0), num_climb=256)
    assert own.value < reference_bound(m, rows).value <= c.bound.value
    with pytest.raises(ValueError, match="fresh probe"):
        verify(replace(c, bound=own), m, rows)


@functools.cache
def binary_runs(estimator: str, **settings) -> tuple:
    """(the binary protocol model, its runs at SEEDS with ``evaluate_model``'s defaults and ``settings``), on rows
    apart from the bench's."""
    m = BinaryVAE()
    runs = []
    for seed in SEEDS:
        x = simulate(m, 16, 2000 + seed)
        runs.append(run(m, x, enumerated_log_p(m, x).mean().item(), seed, estimator=estimator, **settings))
    return m, runs


@pytest.mark.parametrize("estimator", ["ais", "smc"])
def test_a_protocol_models_band_holds_the_exact_mean_and_misses_it_moved_by_2_nats(estimator):
    m, runs = binary_runs(estimator)
    torch.testing.assert_close(enumerated_log_p(m, runs[0].x), m.brute_force_log_p(runs[0].x), rtol=0, atol=1e-4)
    again = shifted_example(runs[0], m, 0.0).result  # the checks run again on the unmoved estimate: the same
    assert (again.checks, again.failed, again.extras["mean_log_p_band"], again.extras["ais_minus_iwae"]) == (
        runs[0].result.checks, runs[0].result.failed, runs[0].result.extras["mean_log_p_band"],
        runs[0].result.extras["ais_minus_iwae"])
    for r in runs:
        assert r.result.certified is True, r.result.warnings
        assert band_holds(r), (r.result.extras["mean_log_p_band"], r.exact)
        down, up = shifted_example(r, m, -2.0), shifted_example(r, m, 2.0)
        assert not band_holds(down) and not band_holds(up), (down.result.extras["mean_log_p_band"], r.exact)
        assert down.result.certified is False and {"above_iwae", "reverse_gap"} <= set(down.result.failed)
        # moved up: above the reverse runs from the chains' (SMC: the weighted particles') final states
        assert up.result.certified is False and "reverse_order" in up.result.failed, up.result.failed


def test_without_its_iwae_comparison_and_reverse_runs_the_certificate_passes_a_moved_estimate():
    """The broken variant of the test above: without the IWAE comparison and the reverse runs nothing in the
    per-example certificate looks at the estimate's level on the rows themselves (BDMC checks the schedule on
    simulated data), and an estimate moved either way passes."""
    m, runs = binary_runs("ais", iwae_samples=0, reverse=False)
    for r in runs:
        assert r.result.certified is True and not {"above_iwae", "reverse_order"} & set(r.result.checks)
        assert shifted_example(r, m, -2.0).result.certified is True
        assert shifted_example(r, m, 2.0).result.certified is True
