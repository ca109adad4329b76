"""Entry-point glue: validate group choices, run a Hydra task, turn ``UserError`` into one line."""

from __future__ import annotations

import os
import sys
import time
from typing import Callable

from nvil import distributed
from nvil.config import check_group_choices
from nvil.errors import ConfigError, UserError


def run_task(task: Callable, hydra_main: Callable, run_dir_root: str | None = None) -> None:
    """Run ``hydra_main`` (a ``@hydra.main`` function that calls ``task``); print user errors as one line.

    Under torchrun the ranks join their process group first; with ``run_dir_root`` (train.py's ``outputs``) they
    then agree on rank 0's run directory, since each would otherwise stamp its own time into
    ``hydra.run.dir``, and only rank 0 writes Hydra's own files there."""
    try:
        check_group_choices(sys.argv[1:])
        if "WORLD_SIZE" in os.environ and distributed.launched_world_size() > 1:  # torchrun
            sys.argv += torchrun_overrides(sys.argv[1:], run_dir_root)
    except UserError as e:
        fail(e)
    try:
        hydra_main()
    finally:
        distributed.cleanup()


def torchrun_overrides(argv: list[str], run_dir_root: str | None) -> list[str]:
    """The Hydra overrides that make the ranks of one torchrun job share one run directory."""
    if any(a in ("-m", "--multirun") or a.startswith("--multirun") for a in argv):
        raise ConfigError("torchrun runs one job, not a Hydra sweep (-m); sweep with hydra/launcher=submitit_slurm "
                          "and hydra.launcher.tasks_per_node=N instead")
    d = distributed.setup()
    extra = []
    if run_dir_root is not None and not any(a.startswith("hydra.run.dir=") for a in argv):
        stamp = distributed.broadcast(time.strftime("%Y-%m-%d/%H-%M-%S"))
        extra.append(f"hydra.run.dir={run_dir_root}/{stamp}")
    if not d.is_main:
        extra += ["hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    return extra


def fail(e: Exception) -> None:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(getattr(e, "exit_code", 2))


def guarded(task: Callable, *args, **kwargs):
    try:
        return task(*args, **kwargs)
    except UserError as e:
        fail(e)
