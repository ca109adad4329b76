"""Entry-point glue: validate group choices, run a Hydra task, turn ``UserError`` into one line."""

from __future__ import annotations

import sys
from typing import Callable

from nvil.config import check_group_choices
from nvil.errors import UserError


def run_task(task: Callable, hydra_main: Callable) -> None:
    """Run ``hydra_main`` (a ``@hydra.main`` function that calls ``task``); print user errors as one line."""
    try:
        check_group_choices(sys.argv[1:])
    except UserError as e:
        fail(e)
    hydra_main()


def fail(e: Exception) -> None:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


def guarded(task: Callable, *args, **kwargs):
    try:
        return task(*args, **kwargs)
    except UserError as e:
        fail(e)
