"""bench/extrapolate.py: the power-law fit behind the reproduction rows' extrapolations, on curves whose law is known."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from extrapolate import (fit_power_law, main, parse_points, read_curve, updates_to_reach,  # noqa: E402
                         window_means)


def write_run(tmp_path: Path, law, steps) -> Path:
    rows = [{"step": t, "train/elbo": -999.0} for t in steps]       # rows of other tags are ignored
    rows += [{"step": t, "val/elbo": -law(t)} for t in steps]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return tmp_path


def test_fit_recovers_a_known_power_law_and_its_budget(tmp_path):
    def law(t):
        return 110.0 + 7000.0 * t ** -0.45
    run = write_run(tmp_path, law, range(10_000, 3_000_001, 10_000))
    points = window_means(read_curve(run, "val/elbo"), 1, 100_000)    # every row its own window: exact points
    a, b, c, rss = fit_power_law(points)
    assert abs(c - 0.45) < 1e-9 and abs(a - 110.0) < 1e-6 and abs(b - 7000.0) < 1e-3 and rss < 1e-12
    t = updates_to_reach(a, b, c, 113.1)
    assert abs(law(t) - 113.1) < 1e-6
    assert updates_to_reach(a, b, c, 109.0) == math.inf             # below the fitted floor: never


def test_window_means_average_within_windows():
    curve = [(t, float(t)) for t in range(0, 1000, 100)]
    assert window_means(curve, 500, 0) == [(200.0, 200.0), (700.0, 700.0)]
    assert window_means(curve, 500, 600) == [(750.0, 750.0)]


def test_cli_prints_the_fit_and_refuses_bad_runs(tmp_path, capsys):
    run = write_run(tmp_path, lambda t: 100.0 + 500.0 * t ** -0.5, range(10_000, 1_000_001, 10_000))
    main([str(run), "--target", "100.5", "--window", "100000", "--from", "100000"])
    out = capsys.readouterr().out
    assert "fit: loss(t) = " in out and "reaches 100.5: " in out and "never" not in out
    with pytest.raises(SystemExit, match="no metrics.jsonl"):
        main([str(tmp_path / "missing")])
    with pytest.raises(SystemExit, match="the fit needs at least 3"):
        main([str(run), "--from", "950000"])


def test_points_fit_given_pairs_and_refuse_bad_ones(capsys):
    """--points fits the law to update:nats pairs (checkpoints' test-set figures); exact points of a known law give
    it back, and its budget to the target."""
    def law(t):
        return 118.9 + 12.3 * (t / 1e6) ** -0.43
    pairs = ",".join(f"{t}:{law(t)!r}" for t in (4_690_000, 1_340_000, 2_450_000, 3_530_000))  # any order
    points = parse_points(pairs)
    assert [t for t, _ in points] == [1.34e6, 2.45e6, 3.53e6, 4.69e6]
    a, b, c, rss = fit_power_law(points)
    assert abs(c - 0.43) < 1e-9 and abs(a - 118.9) < 1e-6 and rss < 1e-12
    main(["--points", pairs, "--target", "121.8"])
    out = capsys.readouterr().out
    assert "4 given points" in out and "reaches 121.8: " in out and "never" not in out
    with pytest.raises(SystemExit, match="update:nats pairs"):
        parse_points("1000:110.2,2000")
    with pytest.raises(SystemExit, match="the fit needs at least 3"):
        main(["--points", "1000:110,2000:109"])
    with pytest.raises(SystemExit):
        main(["/tmp", "--points", pairs])  # a run directory and points: one or the other
