"""The first lines of ``train.py``, ``evaluate.py``, ``nvil-train`` and ``nvil-evaluate``: the process-wide choice
that must come before torch's first operation (which of torch's CPU kernel sets runs, ``trainer.cpu_kernels`` /
``eval.cpu_kernels``: ``nvil.backend.cpu_kernels``), then the job (``nvil.app.main``).

``nvil.app.main`` is imported only after the choice, by name: importing it imports torch and every model, and a
module-level tensor anywhere below would fix torch's kernel set before the choice could be made.
"""

from __future__ import annotations

import importlib
import sys
from importlib import metadata

from nvil.backend.cpu_kernels import CHOICES, choose_kernels, requested


def _version() -> bool:
    """Whether the command line is ``--version`` alone, in which case the package's version is printed (Hydra's
    own ``--version`` would name Hydra's), before torch or Hydra is imported."""
    if sys.argv[1:] != ["--version"]:
        return False
    print(f"nvil {metadata.version('nvil')}")
    return True


def _choose(key: str) -> None:
    choice = requested(sys.argv[1:], key)
    if choice not in CHOICES:
        print(f"error: {key} must be one of {', '.join(CHOICES)}, got {choice!r}", file=sys.stderr)
        sys.exit(2)
    choose_kernels(choice)


def train() -> None:
    """``nvil-train``: the same arguments as ``python train.py``, read from ``sys.argv``.

    ``--version`` alone prints the package's version and returns, before torch or Hydra is imported; otherwise
    torch's CPU kernel set is chosen from ``trainer.cpu_kernels=`` (``nvil.backend.cpu_kernels``), then the training
    job runs (``nvil.app.main.train_main``). An unknown kernel set is one line on stderr and exit status 2. From
    Python, ``nvil.train(*overrides, **settings)`` runs the same job in-process.

    Examples
    --------
    >>> import sys
    >>> from unittest import mock
    >>> from nvil.app.entry import train
    >>> with mock.patch.object(sys, "argv", ["nvil-train", "--version"]):
    ...     train()
    nvil ...
    """
    if _version():
        return
    _choose("trainer.cpu_kernels")
    importlib.import_module("nvil.app.main").train_main()


def evaluate() -> None:
    """``nvil-evaluate``: the same arguments as ``python evaluate.py``, read from ``sys.argv``.

    ``--version`` alone prints the package's version and returns, before torch or Hydra is imported; otherwise
    torch's CPU kernel set is chosen from ``eval.cpu_kernels=`` (``nvil.backend.cpu_kernels``), then the evaluation
    job runs (``nvil.app.main.evaluate_main``). An unknown kernel set is one line on stderr and exit status 2. From
    Python, ``nvil.evaluate(checkpoint, estimator=NAME, **settings)`` runs the same job in-process.

    Examples
    --------
    >>> import sys
    >>> from unittest import mock
    >>> from nvil.app.entry import evaluate
    >>> with mock.patch.object(sys, "argv", ["nvil-evaluate", "--version"]):
    ...     evaluate()
    nvil ...
    """
    if _version():
        return
    _choose("eval.cpu_kernels")
    importlib.import_module("nvil.app.main").evaluate_main()
