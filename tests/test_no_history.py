"""The project speaks of itself, not of the history of its making (git keeps that): no text file in the checkout
carries a work log's headings or phrases. Checked in every file git tracks or would add (``git ls-files --cached
--others --exclude-standard``), binaries and data files left out: an ordinal followed by the word for a stop or a
session of work, an issue number, a reference to the current (previous, next, last) session or stop, a period of work.
A chain, a signal or a loop that stops is not history, and the matcher's power is checked on both kinds of line. The
sample lines below are assembled from their words at run time (``sample``), so that this file holds none itself."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA_SUFFIXES = {".pt", ".pth", ".png", ".jpg", ".jpeg", ".gif", ".svg", ".pdf", ".npz", ".npy", ".gz", ".zip", ".pkl",
                 ".whl", ".jsonl", ".json", ".csv", ".ipynb", ".so", ".o"}
MAX_BYTES = 2_000_000

ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth"
            "|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|thirtieth|fortieth")
UNITS = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth"
HISTORY = re.compile(
    rf"\b(?:(?:{ORDINALS})|(?:twenty|thirty|forty)[- ](?:{UNITS})|\d+(?:st|nd|rd|th))\s+(?:stop|session)\b"  # an ordinal and the word
    r"|\b(?:this|previous|next|earlier|last)\s+(?:session|stop)\b"  # the current one
    r"|\bwork\s+periods?\b"
    r"|\bissues?\s+#?\d+\b",  # an issue number
    re.IGNORECASE)


def sample(*words: str) -> str:
    """A test line from its words (a work-log line written whole here would be one itself)."""
    return " ".join(words)


def history_phrases(line: str) -> list[str]:
    """The work-log phrases in one line of text."""
    return [m.group(0) for m in HISTORY.finditer(line)]


def text_files(root: Path = ROOT) -> list[Path]:
    """Every file git tracks or would add under ``root``, less binaries, data and files too large to be prose."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=root,
                             capture_output=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout (or no git): nothing to list")
    files = []
    for name in filter(None, out.decode().split("\0")):
        path = root / name
        if path.suffix.lower() in DATA_SUFFIXES or not path.is_file():
            continue
        if path.stat().st_size <= MAX_BYTES:
            files.append(path)
    return files


def offending_lines(paths: list[Path], root: Path = ROOT) -> list[str]:
    found = []
    for path in paths:
        raw = path.read_bytes()
        if b"\0" in raw[:8192]:
            continue  # a binary
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if phrases := history_phrases(line):
                found.append(f"{path.relative_to(root)}:{number}: {', '.join(phrases)}: {line.strip()[:120]}")
    return found


def test_no_text_file_speaks_of_the_history_of_its_making():
    paths = text_files()
    assert len(paths) > 50  # the listing found the checkout
    found = offending_lines(paths)
    assert not found, ("work-log text (git keeps the history; say what the code does, name hardware by class):\n"
                       + "\n".join(found[:40]) + (f"\n... and {len(found) - 40} more" if len(found) > 40 else ""))


@pytest.mark.parametrize("line", [
    sample("###", "Fourteenth", "stop", "(2026-11-27, CPU)"),
    sample("##", "Issue", "13:", "certified log Z"),
    sample("###", "Twenty-second", "session", "(2026-11-28, an older AMD EPYC)"),
    sample("Measured on the 2-core machine; no GPU", "this", "session."),
    sample("as the", "12th", "stop", "measured"),
    sample("the axis names", "(issue", "17)", "of the preset"),
    sample("one", "work", "period", "of three hours"),
    sample("the", "previous", "session's runs did not survive"),
])
def test_the_matcher_flags_work_log_lines(line):
    assert history_phrases(line)


@pytest.mark.parametrize("line", [
    "the chain stops when it reaches h*",
    "SIGTERM stops the run; the ranks agree on one stop step",
    "for start, stop in chunks(n, size):",
    '@pytest.fixture(autouse=True, scope="session")',
    "subprocess.Popen(argv, start_new_session=True)",
    "the first step of the session fixture; the second stops it",
    "issues a warning when the score falls",
    "the data file runs/2026-11-24/metrics.jsonl",
])
def test_the_matcher_leaves_ordinary_lines_alone(line):
    assert not history_phrases(line)


def test_the_check_finds_a_work_log_in_a_file(tmp_path):
    """The whole check, on a file that has a heading of a work log and one that has none."""
    heading = sample("##", "Sixth", "stop", "(2026-11-24, H100 lent)")
    (tmp_path / "log.md").write_text(f"# Results\n\n{heading}\n\nfigures\n")
    (tmp_path / "clean.md").write_text("# Results\n\nThe Markov chain stops at S steps.\n")
    found = offending_lines([tmp_path / "log.md", tmp_path / "clean.md"], root=tmp_path)
    assert len(found) == 1 and found[0].startswith("log.md:3:")
