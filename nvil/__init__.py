"""nvil: learning and evaluating latent-variable models (NVIL, SAP, MCEM-HMC, AIS, Chib).

    import nvil
    from nvil.models import RBM
    from nvil.estimators import AIS

    run = nvil.train(model="rbm", learner="sap", **{"trainer.max_steps": 1000})  # what train.py does, in-process
    result = nvil.evaluate(run.checkpoint, estimator="ais", num_chains=200)     # what evaluate.py does
    model = nvil.load(run.checkpoint)                                            # the model, on the CPU
    x, h = model.sample(64)                                                      # every family samples
    result = nvil.evaluate(model, x_test, estimator="ais")                       # rows of the caller's own
    d = nvil.compare(run.checkpoint, other, estimator="iwae")                    # paired difference

    class MyVAE(nn.Module):                                                   # a model of the user's own
        latent = nvil.Latent.continuous(50)
        def log_prior(self, z): ...
        def log_likelihood(self, x, z): ...
    result = nvil.evaluate_model(MyVAE(), x_test, estimator="ais")           # certified log p(x)

Importing ``nvil`` imports nothing else and changes nothing in the process: ``nvil.train`` and ``nvil.evaluate``
load the application (``nvil.app.api``) on first use, and ``nvil.__version__`` reads the installed distribution's
version (``importlib.metadata``, from pyproject.toml's ``version``) when first asked for.
"""

from __future__ import annotations

import importlib

_API = {"train": "nvil.app.api", "evaluate": "nvil.app.api", "Run": "nvil.app.api", "load": "nvil.app.api",
        "compare": "nvil.app.api", "Latent": "nvil.models.protocol",
        "evaluate_model": "nvil.estimators"}


def __getattr__(name: str):
    """``nvil.train``, ``nvil.evaluate``, ``nvil.load``, ``nvil.compare``, ``nvil.Run``, ``nvil.Latent``,
    ``nvil.evaluate_model`` and
    ``nvil.__version__`` (PEP 562): each is looked up when
    first asked for, so that ``import nvil.models`` imports neither the training loop nor package metadata."""
    if name == "__version__":
        metadata = importlib.import_module("importlib.metadata")
        try:
            version = metadata.version("nvil")
        except metadata.PackageNotFoundError:  # a checkout on sys.path that was never installed
            version = "0+unknown"
        globals()["__version__"] = version
        return version
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'nvil' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API, "__version__"])
