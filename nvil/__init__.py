"""nvil: learning and evaluating latent-variable models (NVIL, SAP, MCEM-HMC, AIS, Chib).

    import nvil
    from nvil.models import RBM
    from nvil.estimators import AIS

    run = nvil.train("model=rbm", "learner=sap", "trainer.max_steps=1000")   # what train.py does, in-process
    result = nvil.evaluate(run.checkpoint, "estimator=ais")                   # what evaluate.py does

Importing ``nvil`` imports nothing else and changes nothing in the process: ``nvil.train`` and ``nvil.evaluate``
load the application (``nvil.app.api``) on first use.
"""

from __future__ import annotations

import importlib

__version__ = "0.2.0"

_API = {"train": "nvil.app.api", "evaluate": "nvil.app.api", "Run": "nvil.app.api"}


def __getattr__(name: str):
    """``nvil.train``, ``nvil.evaluate``, ``nvil.Run`` (PEP 562): the application is imported when first asked for,
    so that ``import nvil.models`` does not import the training loop."""
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'nvil' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
