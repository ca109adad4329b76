"""Evaluation under storage faults and forged caches (nvil/app/evaluation.py, nvil/app/merge.py, estimators/log_z.py,
estimators/log_z_cache.py, nvil/core/files.py, nvil/core/userkey.py).
- A read-only checkpoint directory (a real read-only bind mount where the machine allows one, and an injected
  EROFS) and a full disk (a real small tmpfs, and an injected ENOSPC): the estimate (a DBN's, an RBM's) is printed
  and recorded in eval.output, each sidecar that could not be written (the log Z cache, the evaluation record) is
  one warning line, exit 0, eval.jsonl still parses.
- An RBM's certified log Z is cached beside its checkpoint as a DBN's is: reused on the second call with the same
  number, computed again for another seed.
- Three evaluators racing on one DBN checkpoint's log Z cache, as processes: every entry survives.
- Forged log Z cache entries (a re-digested edit, NaN, a non-list, a wrong MAC) of an RBM, and a re-digested edit
  of a DBN's, are never used as certified.
- Torn eval.jsonl lines are ended before the next record and skipped by the merge with a warning; a merge input
  that is not UTF-8 is one error line; an estimate beyond memory is one error line.
"""

from __future__ import annotations

import errno
import json
import math
import os
import resource
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import ROOT, run_script, tiny_dbn
from omegaconf import OmegaConf

from nvil.core import files
from nvil.core.checkpoint import save_checkpoint
from nvil.core.config import CONFIG_DIR
from nvil.core.userkey import KeyUnavailable, user_key
from nvil.estimators.certify import digest
from nvil.estimators.log_z_cache import mac
from nvil.models.rbm import BoltzmannMachine

CPU = ["eval.progress=false", "eval.device=cpu"]
DBN_ARGS = ["estimator=dbn_bound", "estimator.num_samples=10", "estimator.log_z.num_chains=20",
            "estimator.log_z.num_betas=100", "estimator.log_z.num_climb=8", *CPU]
RBM_ARGS = ["estimator=ais", "estimator.num_chains=20", "estimator.num_betas=100", "estimator.num_climb=8",
            "estimator.batch_size=10", *CPU]


def make_checkpoints(root: Path) -> Path:
    """dbn.pt (a 12-6-8 DBN) and rbm.pt (a 12-5 RBM) on 200 rows of data=synthetic, in ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    data = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "data" / "synthetic.yaml"))
    data.update(num_train=200, num_valid=20, num_test=20)
    dbn = tiny_dbn(0)
    save_checkpoint(root / "dbn.pt", {"config": {"model": {"name": "dbn", "layers": [6, 8]}, "data": data},
                                      "model_name": "dbn", "n_visible": 12, "model": dbn.state_dict()})
    rbm = {"name": "rbm", "n_hidden": 5, "visible": "binary", "labels": False}
    save_checkpoint(root / "rbm.pt", {"config": {"model": rbm, "data": data}, "model_name": "rbm", "n_visible": 12,
                                      "model": BoltzmannMachine(12, 5).state_dict()})
    return root


@pytest.fixture(autouse=True)
def key_file(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "key" / "log_z.key"
    monkeypatch.setenv("NVIL_CACHE_KEY_FILE", str(path))
    return path


def evaluate(tmp_path, *args):  # python evaluate.py *args, in this process
    return run_script("evaluate.py", *args, cwd=tmp_path)


def stdout_line(proc) -> dict:
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return json.loads(line)


def warning_lines(proc) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return [ln for ln in proc.stderr.splitlines() if ln.startswith("warning:")]


def assert_one_error(proc, *fragments) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    err = proc.stderr.strip()
    assert err.startswith("error:") and "\n" not in err and all(f in err for f in fragments), err


def assert_kept(proc, out: Path, *fragments) -> None:
    """Exit 0, the estimate on stdout and in ``out``, and exactly one warning, naming ``fragments``."""
    assert proc.returncode == 0, proc.stderr
    line = stdout_line(proc)
    assert math.isfinite(line["mean_log_p"])
    records, torn = files.read_json_lines(out)
    assert torn == [] and records[-1] == line
    (warning,) = warning_lines(proc)
    assert all(f in warning for f in fragments), warning


@contextmanager
def mounted(target: Path, *commands: list[str]):
    """Run the mount ``commands`` on ``target`` (skip where the machine does not allow them); unmount after."""
    target.mkdir(parents=True, exist_ok=True)
    done = 0
    try:
        for command in commands:
            try:
                proc = subprocess.run(command, capture_output=True, text=True)
            except OSError as e:  # no mount command
                proc = subprocess.CompletedProcess(command, 1, "", e.strerror)
            if proc.returncode != 0:
                pytest.skip(f"cannot {' '.join(command)}: {proc.stderr.strip() or proc.returncode}")
            done += 1
        yield target
    finally:
        if done:
            subprocess.run(["umount", str(target)], capture_output=True)


# ---- a read-only checkpoint directory, a full disk -----------------------------------------------------------


def test_a_read_only_checkpoint_directory_keeps_the_estimate(tmp_path):
    src = make_checkpoints(tmp_path / "src")
    ro = tmp_path / "ro"
    with mounted(ro, ["mount", "--bind", str(src), str(ro)], ["mount", "-o", "remount,ro,bind", str(ro)]):
        out = tmp_path / "out.jsonl"
        proc = evaluate(tmp_path, f"checkpoint={ro}/dbn.pt", *DBN_ARGS, f"eval.output={out}")
        assert_kept(proc, out, "cannot write the log Z cache", str(ro), "read-only")
        proc = evaluate(tmp_path, f"checkpoint={ro}/rbm.pt", *RBM_ARGS, f"eval.output={out}")
        assert_kept(proc, out, "cannot write the log Z cache", str(ro), "rbm.pt.log_z.json", "read-only")
        proc = evaluate(tmp_path, f"checkpoint={ro}/rbm.pt", *RBM_ARGS)
        assert proc.returncode == 0 and stdout_line(proc)["estimator"] == "ais", proc.stderr
        cache, record = warning_lines(proc)
        assert "cannot write the log Z cache" in cache and "read-only" in cache
        assert f"{ro}/rbm.pt.eval.jsonl" in record and "read-only" in record


def test_a_full_disk_keeps_the_estimate_and_every_whole_record(tmp_path):
    disk, page = tmp_path / "disk", os.sysconf("SC_PAGE_SIZE")  # tmpfs allocates whole pages
    with mounted(disk, ["mount", "-t", "tmpfs", "-o", f"size={16 * page}", "tmpfs", str(disk)]):
        make_checkpoints(disk)
        record = disk / "rbm.pt.eval.jsonl"
        old = json.dumps({"estimator": "ais", "note": ""})
        record.write_text(json.dumps({"estimator": "ais", "note": " " * (page - 1 - len(old))}) + "\n")  # one page
        with open(disk / "filler", "wb", buffering=0) as f, pytest.raises(OSError, match="No space left"):
            while True:  # fill the rest of the disk
                f.write(b"\0" * page)
        out = tmp_path / "out.jsonl"
        assert_kept(evaluate(tmp_path, f"checkpoint={disk}/dbn.pt", *DBN_ARGS, f"eval.output={out}"), out,
                    "cannot write the log Z cache", "disk is full")
        proc = evaluate(tmp_path, f"checkpoint={disk}/rbm.pt", *RBM_ARGS)
        assert proc.returncode == 0 and math.isfinite(stdout_line(proc)["mean_log_p"]), proc.stderr
        cache, warning = warning_lines(proc)
        assert "cannot write the log Z cache" in cache and "disk is full" in cache
        assert str(record) in warning and "disk is full" in warning
        assert files.read_json_lines(record) == ([json.loads(record.read_text())], [])


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC])
def test_an_injected_write_failure_is_one_warning(tmp_path, monkeypatch, code):
    ck = make_checkpoints(tmp_path / "ck")
    real_open, real_replace = os.open, os.replace

    def refuse(path):
        if Path(path).parent == ck:
            raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(os, "open", lambda path, *a, **k: refuse(path) or real_open(path, *a, **k))
    monkeypatch.setattr(os, "replace", lambda src, dst, *a, **k: refuse(dst) or real_replace(src, dst, *a, **k))
    reason = "read-only" if code == errno.EROFS else "disk is full"
    out = tmp_path / "out.jsonl"
    assert_kept(evaluate(tmp_path, f"checkpoint={ck}/dbn.pt", *DBN_ARGS, f"eval.output={out}"), out,
                "log Z cache", reason)
    assert_kept(evaluate(tmp_path, f"checkpoint={ck}/rbm.pt", *RBM_ARGS, f"eval.output={out}"), out,
                "log Z cache", reason)
    proc = evaluate(tmp_path, f"checkpoint={ck}/rbm.pt", *RBM_ARGS)
    assert proc.returncode == 0 and stdout_line(proc)["estimator"] == "ais", proc.stderr
    cache, record = warning_lines(proc)
    assert "log Z cache" in cache and reason in cache and "rbm.pt.eval.jsonl" in record and reason in record
    # eval.output named by the user and refused: the estimate is printed, then one error line
    proc = evaluate(tmp_path, f"checkpoint={ck}/rbm.pt", *RBM_ARGS, "estimator.cache=false",
                    f"eval.output={ck}/mine.jsonl")
    assert stdout_line(proc)["estimator"] == "ais"
    assert_one_error(proc, f"{ck}/mine.jsonl", reason)


# ---- an RBM's log Z cache ---------------------------------------------------------------------------------------


def test_an_rbm_log_z_is_cached_beside_its_checkpoint(tmp_path):
    ck = make_checkpoints(tmp_path / "ck")
    args = [f"checkpoint={ck}/rbm.pt", *RBM_ARGS]
    first = stdout_line(evaluate(tmp_path, *args))
    proc = evaluate(tmp_path, *args)
    second = stdout_line(proc)
    assert first["log_z_cached"] is False and second["log_z_cached"] is True and warning_lines(proc) == []
    for k in ("log_z", "log_z_stderr", "log_z_reverse", "log_z_lower_bound", "log_z_reverse_source", "mean_log_p",
              "certified"):
        assert second[k] == first[k], k  # the same number, not a recomputation
    assert first["certified"] is True
    (entry,) = json.loads((ck / "rbm.pt.log_z.json").read_text())
    assert entry["key"]["seed"] == 0 and entry["key"]["reverse_sources"] == ["forward", "particles"]
    other = stdout_line(evaluate(tmp_path, *args, "seed=1"))  # another seed: another key, computed and kept
    assert other["log_z_cached"] is False and other["log_z"] != first["log_z"]
    assert sorted(e["key"]["seed"] for e in json.loads((ck / "rbm.pt.log_z.json").read_text())) == [0, 1]
    assert stdout_line(evaluate(tmp_path, *args, "estimator.cache=false"))["log_z_cached"] is False


# ---- three evaluators on one cache --------------------------------------------------------------------------


@pytest.mark.slow
def test_racing_evaluators_keep_every_log_z_entry(tmp_path, key_file):
    ck = make_checkpoints(tmp_path / "ck")
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    args = [str(ROOT / "evaluate.py"), f"checkpoint={ck}/dbn.pt", *DBN_ARGS, "estimator.log_z.num_betas=3000"]
    procs = [subprocess.Popen([sys.executable, *args, f"estimator.log_z.seed={seed}"], cwd=tmp_path, env=env,
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for seed in range(3)]
    for p in procs:
        _, stderr = p.communicate(timeout=300)
        assert p.returncode == 0 and "warning" not in stderr, stderr
    entries = json.loads((ck / "dbn.pt.log_z.json").read_text())
    assert sorted(e["key"]["seed"] for e in entries) == [0, 1, 2]
    assert all(e["mac"] == mac(e, key_file.read_bytes()) for e in entries)  # one key, made by the first to come
    records, torn = files.read_json_lines(ck / "dbn.pt.eval.jsonl")
    assert len(records) == 3 and torn == []


# ---- forged cache entries -------------------------------------------------------------------------------------


def redigest(entries: list, edit) -> list:
    cert = entries[0]["certificate"]
    edit(cert)
    cert["digest"] = digest({k: v for k, v in cert.items() if k != "digest"})
    return entries


FORGERIES = {
    "log Z + 5": lambda e: redigest(e, lambda c: c["forward"].update(log_z=c["forward"]["log_z"] + 5)),
    "NaN": lambda e: redigest(e, lambda c: c["forward"].update(log_z=math.nan)),
    "not a list of entries": lambda e: [1, 2],
    "a wrong MAC": lambda e: [{**e[0], "mac": "0" * 64}],
}


@pytest.fixture(scope="module")
def certified_caches(tmp_path_factory) -> tuple[Path, Path, dict]:
    """dbn.pt and rbm.pt, each evaluated once so that its certified log Z is cached beside it, signed with a key of
    their own: (their directory, the key's file, each checkpoint's first JSON line). Tests take a copy of the
    directory; a copy's cache is trusted as it stands (checked here on one copy)."""
    root = tmp_path_factory.mktemp("certified")
    ck, key = make_checkpoints(root / "ck"), root / "key" / "log_z.key"
    firsts = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NVIL_CACHE_KEY_FILE", str(key))
        for name, model_args in (("dbn.pt", DBN_ARGS), ("rbm.pt", RBM_ARGS)):
            first = firsts[name] = stdout_line(evaluate(root, f"checkpoint={ck}/{name}", *model_args))
            assert first["log_z_cached"] is False and first["certified"] is True  # computed, then cached
        copy = Path(shutil.copytree(ck, root / "copy"))
        for name, model_args in (("dbn.pt", DBN_ARGS), ("rbm.pt", RBM_ARGS)):
            proc = evaluate(root, f"checkpoint={copy}/{name}", *model_args)
            assert stdout_line(proc)["log_z_cached"] is True and warning_lines(proc) == [], proc.stderr
    return ck, key, firsts


# Every forgery on the RBM's cache; on the DBN's, whose top-RBM log Z goes through the same cache code
# (estimators/log_z.py ``cached_log_z``), the re-digested edit.
FORGED = [pytest.param(forgery, "rbm.pt", RBM_ARGS, id=f"{forgery}-rbm") for forgery in FORGERIES] + [
    pytest.param("log Z + 5", "dbn.pt", DBN_ARGS, id="log Z + 5-dbn")]


@pytest.mark.parametrize("forgery, name, model_args", FORGED)
def test_a_forged_log_z_cache_is_never_certified(tmp_path, monkeypatch, certified_caches, forgery, name, model_args):
    source, key, firsts = certified_caches
    monkeypatch.setenv("NVIL_CACHE_KEY_FILE", str(key))  # the key that signed the cache
    ck = Path(shutil.copytree(source, tmp_path / "ck"))
    args = [f"checkpoint={ck}/{name}", *model_args]
    first, cache = firsts[name], ck / f"{name}.log_z.json"
    cache.write_text(json.dumps(FORGERIES[forgery](json.loads(cache.read_text()))))
    proc = evaluate(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr
    line = stdout_line(proc)
    assert line["log_z_cached"] is False and line["log_z"] == first["log_z"] and line["mean_log_p"] is not None
    (warning,) = warning_lines(proc)  # one line naming the cache and what is done instead
    assert str(cache) in warning and ("computing log Z again" in warning or "rewritten" in warning), warning
    assert stdout_line(evaluate(tmp_path, *args))["log_z_cached"] is True  # recomputed, rewritten and signed


def test_the_cache_key_is_private_and_made_once(tmp_path, key_file):
    key = user_key(key_file)
    assert len(key) == 32 and user_key(key_file) == key and (key_file.stat().st_mode & 0o777) == 0o600
    key_file.chmod(0o644)
    with pytest.raises(KeyUnavailable, match="open to other users"):
        user_key(key_file)
    ck = make_checkpoints(tmp_path / "ck")  # a key others can read: nothing trusted, nothing cached, one warning
    proc = evaluate(tmp_path, f"checkpoint={ck}/dbn.pt", *DBN_ARGS)
    assert proc.returncode == 0 and stdout_line(proc)["log_z_cached"] is False, proc.stderr
    (warning,) = warning_lines(proc)
    assert "open to other users" in warning and not (ck / "dbn.pt.log_z.json").exists()


# ---- torn lines, merge inputs ---------------------------------------------------------------------------------


def test_a_torn_record_is_ended_and_the_merge_skips_it(tmp_path):
    ck = make_checkpoints(tmp_path / "ck")
    record = ck / "rbm.pt.eval.jsonl"
    whole = stdout_line(evaluate(tmp_path, f"checkpoint={ck}/rbm.pt", *RBM_ARGS))
    with open(record, "a") as f:
        f.write('{"estimator": "ais", "mean_lo')  # a writer killed mid-line
    new = stdout_line(evaluate(tmp_path, f"checkpoint={ck}/rbm.pt", *RBM_ARGS))
    assert files.read_json_lines(record) == ([whole, new], [2])
    shards = tmp_path / "shards.jsonl"
    for shard in (0, 1):
        proc = evaluate(tmp_path, f"checkpoint={ck}/rbm.pt", *RBM_ARGS, "eval.num_shards=2", f"eval.shard={shard}",
                        f"eval.output={shards}")
        assert proc.returncode == 0, proc.stderr
        with open(shards, "a") as f:
            f.write('{"shard": 1, "sum_lo')
    proc = run_script("-m nvil.app.merge", str(shards))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["num_examples"] == 20
    (warning,) = warning_lines(proc)
    assert "skipped 2 torn lines" in warning and f"{shards}:2" in warning


def test_a_merge_input_that_is_not_json_lines_is_one_error_line(tmp_path):
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00\x01 not text\n\x89PNG\r\n")
    assert_one_error(run_script("-m nvil.app.merge", str(binary)), str(binary), "not UTF-8")
    for path, reason in ((tmp_path, "directory"), (tmp_path / "none", "No such file")):
        assert_one_error(run_script("-m nvil.app.merge", str(path)), str(path), reason)


# ---- an estimate beyond memory ------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_estimate_beyond_memory_is_one_error_line(tmp_path):
    ck = make_checkpoints(tmp_path / "ck")
    assert_one_error(evaluate(tmp_path, f"checkpoint={ck}/rbm.pt", *RBM_ARGS, "estimator.num_chains=1e9"),
                     "estimator.num_chains must be a positive integer")
    limit = 8 * 2**30  # the allocator's refusal, whatever the machine's memory and overcommit policy

    def cap_memory():
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))

    proc = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), f"checkpoint={ck}/rbm.pt", *RBM_ARGS,
                           "estimator.num_chains=10000000000"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "HYDRA_FULL_ERROR": "0"}, preexec_fn=cap_memory, timeout=300)
    assert_one_error(proc, "estimator=ais", "more memory", "estimator.num_chains=10000000000",
                     "estimator.batch_size=10")
