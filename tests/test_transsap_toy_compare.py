"""bench/transsap_toy_compare.py: the toy's comparison at equal Gibbs steps, on curves whose answer is known."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from transsap_toy_compare import curve_in_gibbs_steps, main, window_means  # noqa: E402


def write_row(path: Path, values, sweeps=None) -> None:
    """metrics.jsonl of one row: train/log_p_exact = values(update) every 1,000 updates to 10,000, and
    ``sweeps(update)`` logged every 100 updates where given (exact ML logs 0)."""
    path.mkdir(parents=True)
    rows = []
    for t in range(100, 10_001, 100):
        if sweeps is not None:
            rows.append({"step": t, "mcmc/gibbs_sweeps": sweeps(t)})
        if t % 1000 == 0:
            rows.append({"step": t, "train/log_p_exact": values(t)})
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def toy_seed(tmp_path: Path, tt_offset: float) -> Path:
    """Exact ML at -t/1000, SAP 2 nats below it at every Gibbs step, Trans-SAP ``tt_offset`` below it at every
    Gibbs step while its tempered transitions add 1 sweep per update from update 5,000."""
    def ml(g):
        return -g / 1000

    def tt_sweeps(t):
        return t + max(0, t - 5000)

    write_row(tmp_path / "exact_ml", ml, lambda t: 0)
    write_row(tmp_path / "sap", lambda t: ml(t) - 2.0, lambda t: t)
    write_row(tmp_path / "trans_sap", lambda t: ml(tt_sweeps(t)) - tt_offset, tt_sweeps)
    return tmp_path


def test_trans_sap_is_compared_at_equal_gibbs_steps(tmp_path):
    seed = toy_seed(tmp_path, tt_offset=0.5)
    assert curve_in_gibbs_steps(seed / "trans_sap")[-1] == (15_000.0, -15.5)   # 10,000 updates + 5,000 TT sweeps
    m = window_means(seed, [float(g) for g in range(2000, 10_001, 500)])
    assert m["sap"] - m["exact_ml"] == pytest.approx(-2.0)
    assert m["trans_sap"] - m["exact_ml"] == pytest.approx(-0.5)   # plotted by updates it would be far below


def test_cli_pairs_gaps_over_seeds(tmp_path, capsys):
    seeds = [toy_seed(tmp_path / f"s{i}", tt_offset=off) for i, off in enumerate((0.5, 1.5))]
    main([str(s) for s in seeds] + ["--start", "2000", "--end", "10000", "--every", "500"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "-2.000 ± 0.000" in last and "-1.000 ± 0.500" in last and "1.000 ± 0.500" in last
    with pytest.raises(SystemExit, match="not found"):
        main([str(tmp_path / "missing")])


def test_seeds_without_exact_ml_still_give_trans_sap_minus_sap(tmp_path, capsys):
    with_ml = toy_seed(tmp_path / "s0", tt_offset=0.5)
    without = toy_seed(tmp_path / "s1", tt_offset=1.5)
    write_row(without / "exact_ml_part", lambda t: -t / 1000, lambda t: 0)   # an exact ML stopped early:
    (without / "exact_ml" / "metrics.jsonl").write_text(                      # its curve ends before the window
        "\n".join(ln for ln in (without / "exact_ml_part" / "metrics.jsonl").read_text().splitlines()[:50]) + "\n")
    main([str(with_ml), str(without), "--start", "2000", "--end", "10000", "--every", "500"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert "not complete" in lines[-2] and "+0.500" in lines[-2]           # seed 1: Trans-SAP - SAP = 2.0 - 1.5
    assert "1 seeds with exact ML; 2 in all" in lines[-1] and "1.000 ± 0.500" in lines[-1]
