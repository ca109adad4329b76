"""Merge the JSON lines of a sharded evaluation into one result.

    python evaluate.py checkpoint=C estimator=chib eval.shard=0 eval.num_shards=4 eval.output=shards.jsonl
    ... (shards 1-3, on other machines or jobs) ...
    python -m nvil.app.merge shards.jsonl            # prints one JSON line, as an unsharded run would
                                                     # (and on stderr its human line, nvil.app.report)

Each shard's line carries its sums (``sum_log_p``, ``sum_sq_log_p``, per-run sums); the merge checks that the
lines come from one estimator, checkpoint, split and seed, and that every shard appears exactly once. A line that
is not a JSON object (torn by a writer killed mid-line) is skipped, all of them named in one warning; a file with no
JSON line at all (not UTF-8, not JSON lines), a directory or a missing file is a one-line error.
"""

from __future__ import annotations

import json
import math
import sys

from nvil.app.cli import guarded
from nvil.app.report import headline
from nvil.core.errors import ConfigError
from nvil.core.files import read_json_lines

SAME = ("estimator", "checkpoint", "split", "seed", "num_shards", "step")


def merge(lines: list[dict]) -> dict:
    """The shards' JSON lines merged into the one line an unsharded evaluation would print.

    Each shard's line carries its sums (``sum_log_p``, ``sum_sq_log_p``, per-run ``run_sums``); the mean, the
    standard error over examples (with the estimate's shared term, such as log Z's, added in quadrature) and the
    per-run spread are recomputed from them. A shard evaluated twice counts with its latest line. The certificate is
    the whole's: every shard's checks and warnings, a failed check on any shard failing the merge.

    Parameters
    ----------
    lines : list of dict
        The JSON objects of the shards' lines (lines without ``shard`` are ignored).

    Returns
    -------
    dict
        The merged line: ``estimator``, ``mean_log_p``, ``stderr``, ``num_examples``, ``seconds`` (summed), ``seed``,
        the shards' other keys, ``checks``, ``warnings``, ``failed_checks``, ``certified`` (None without checks) and
        ``merged_shards``; with per-run sums also ``num_runs``, ``run_spread`` and ``mean_log_p_per_run``.

    Raises
    ------
    ConfigError
        If no line is a shard's, the lines come from more than one evaluation (estimator, checkpoint, split, seed,
        num_shards, step), or a shard is missing.

    Examples
    --------
    >>> from nvil.app.merge import merge
    >>> common = {"estimator": "ais", "checkpoint": "c.pt", "split": "test", "seed": 0, "num_shards": 2, "step": 100,
    ...           "seconds": 1.0, "num_examples": 2}
    >>> lines = [{**common, "shard": 0, "sum_log_p": -10.0, "sum_sq_log_p": 52.0},    # log p = -4, -6
    ...          {**common, "shard": 1, "sum_log_p": -14.0, "sum_sq_log_p": 100.0}]   # log p = -6, -8
    >>> out = merge(lines)
    >>> out["mean_log_p"], out["stderr"], out["num_examples"], out["merged_shards"]
    (-6.0, 0.8165, 4, 2)
    >>> merge(lines[:1])
    Traceback (most recent call last):
    ...
    nvil.core.errors.ConfigError: shards [1] of 2 are missing
    """
    shards = [d for d in lines if "shard" in d]
    if not shards:
        raise ConfigError("no sharded evaluation lines (with eval.num_shards) to merge")
    last = {}
    for d in shards:  # a shard evaluated twice: its latest line counts
        last[(tuple(d.get(k) for k in SAME), d["shard"])] = d
    groups = {key for key, _ in last}
    if len(groups) > 1:
        raise ConfigError(f"the lines come from {len(groups)} different evaluations (estimator, checkpoint, split, "
                          "seed, num_shards, step); merge one at a time")
    d0 = next(iter(last.values()))
    n_shards = d0["num_shards"]
    missing = sorted(set(range(n_shards)) - {s for _, s in last})
    if missing:
        raise ConfigError(f"shards {missing} of {n_shards} are missing")
    parts = [last[(next(iter(groups)), s)] for s in range(n_shards)]
    n = sum(p["num_examples"] for p in parts)
    total = sum(p["sum_log_p"] for p in parts)
    mean = total / n
    var = max(sum(p["sum_sq_log_p"] for p in parts) - n * mean**2, 0.0) / max(n - 1, 1)
    se_examples = math.sqrt(var / n)
    shared = parts[0].get("shared_stderr", 0.0)
    out = {"estimator": d0["estimator"], "mean_log_p": round(mean, 4),
           "stderr": round(math.sqrt(se_examples**2 + shared**2), 4), "num_examples": n,
           "seconds": round(sum(p["seconds"] for p in parts), 3), "seed": d0["seed"]}
    if shared:
        out["stderr_examples"] = round(se_examples, 4)
    if "run_sums" in parts[0]:
        run_means = [sum(r) / n for r in zip(*(p["run_sums"] for p in parts))]
        k = len(run_means)
        centre = sum(run_means) / k
        out["num_runs"] = k
        out["run_spread"] = round(math.sqrt(sum((m - centre) ** 2 for m in run_means) / (k - 1)), 4) if k > 1 else 0.0
        out["mean_log_p_per_run"] = round(centre, 4)
    skip = set(out) | {"shard", "rows", "sum_log_p", "sum_sq_log_p", "run_sums", "shared_stderr", "num_shards",
                       "stderr_examples", "num_runs", "run_spread", "mean_log_p_per_run"}
    out.update({k: v for k, v in d0.items() if k not in skip})
    # The certificate of the whole: every shard's checks and warnings (a failure on any shard fails the merge).
    out["checks"] = sorted({c for p in parts for c in p.get("checks", [])})
    out["warnings"] = [w for i, p in enumerate(parts) for w in p.get("warnings", [])
                       if w not in [v for q in parts[:i] for v in q.get("warnings", [])]]
    out["failed_checks"] = sorted({c for p in parts for c in p.get("failed_checks", [])})
    out["certified"] = (not out["failed_checks"]) if out["checks"] else None
    out["merged_shards"] = n_shards
    return out


def load(path: str) -> tuple[list[dict], list[int]]:
    r"""The JSON objects of a file's lines and the numbers of its torn lines.

    A line that is not a JSON object (torn by a writer killed mid-line) is left out and its number returned.

    Parameters
    ----------
    path : str
        A JSON-lines file of shards' results (``eval.output``).

    Returns
    -------
    records : list of dict
        The JSON objects, in the file's order.
    torn : list of int
        The (1-based) numbers of the lines that are not JSON objects.

    Raises
    ------
    ConfigError
        If the file cannot be read (missing, a directory) or holds no JSON line at all (not UTF-8, not JSON lines).

    Examples
    --------
    >>> import os, tempfile
    >>> from nvil.app.merge import load
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = os.path.join(d, "shards.jsonl")
    ...     with open(path, "w") as f:
    ...         _ = f.write('{"shard": 0}\n{"shard": 1}\n{"sha')
    ...     load(path)
    ([{'shard': 0}, {'shard': 1}], [3])
    """
    try:
        records, torn = read_json_lines(path)
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    if torn and not records:
        try:
            with open(path, encoding="utf-8") as f:
                f.read()
            why = f"line {torn[0]} is not a JSON object"
        except UnicodeDecodeError as e:
            why = f"it is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})"
        raise ConfigError(f"{path} is not JSON lines: {why}")
    return records, torn


def main(argv: list[str]) -> None:
    r"""``python -m nvil.app.merge SHARDS.jsonl [MORE.jsonl ...]``: print the merged result as one JSON line.

    The lines of every file are merged (``merge``); the merged line goes to stdout, as an unsharded run would print
    it, and its human line (``nvil.app.report``) to stderr. Torn lines are skipped, all of them named in one warning
    on stderr.

    Parameters
    ----------
    argv : list of str
        The paths of the JSON-lines files (the command line's arguments).

    Raises
    ------
    ConfigError
        If no path is given, a file cannot be read, or the lines do not merge (``merge``).

    Examples
    --------
    >>> import json, os, tempfile
    >>> from nvil.app.merge import main
    >>> common = {"estimator": "ais", "checkpoint": "c.pt", "split": "test", "seed": 0, "num_shards": 2, "step": 100,
    ...           "seconds": 1.0, "num_examples": 2}
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = os.path.join(d, "shards.jsonl")
    ...     with open(path, "w") as f:
    ...         for i, s in enumerate([(-10.0, 52.0), (-14.0, 100.0)]):
    ...             _ = f.write(json.dumps({**common, "shard": i, "sum_log_p": s[0], "sum_sq_log_p": s[1]}) + "\n")
    ...     main([path])
    {"estimator": "ais", "mean_log_p": -6.0, "stderr": 0.8165, "num_examples": 4, ..., "merged_shards": 2}
    """
    if not argv:
        raise ConfigError("usage: python -m nvil.app.merge SHARDS.jsonl [MORE.jsonl ...]")
    lines, skipped = [], []
    for path in argv:
        records, torn = load(path)
        lines += records
        skipped += [f"{path}:{n}" for n in torn]
    if skipped:
        what = "torn lines that are not JSON objects" if len(skipped) > 1 else "torn line that is not a JSON object"
        print(f"warning: skipped {len(skipped)} {what} "
              f"({', '.join(skipped[:5])}{', ...' if len(skipped) > 5 else ''})", file=sys.stderr, flush=True)
    merged = merge(lines)
    print(json.dumps(merged), flush=True)
    print(headline(merged), file=sys.stderr, flush=True)  # the human line, as evaluate.py prints it


if __name__ == "__main__":
    guarded(main, sys.argv[1:])
