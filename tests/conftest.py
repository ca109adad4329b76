"""Shared fixtures: a tiny SBN with exact answers by enumeration, and Hydra config composition."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import runpy
import subprocess
import sys
import threading
import traceback
from pathlib import Path

from nvil.backend.cpu_kernels import choose_kernels

choose_kernels()  # as the entry points do, before torch's first operation: the tests run the scripts' kernel set

import pytest  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import nvil.app.main as app_main  # noqa: E402
from nvil.models import build_model  # noqa: E402
from nvil.models.dbn import DBN  # noqa: E402
from nvil.estimators.exact import enumerate_states, split_layers  # noqa: E402

CONFIG_DIR = ROOT / "configs"


def make_cfg(config_name: str = "train", overrides: list[str] = ()):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name, overrides=list(overrides))


def tiny_model(n_visible: int = 6, layers=(4, 3), seed: int = 0, scale: float = 1.0, q_scale: float = 0.3,
               name: str = "sbn", autoregressive_q: bool = False):
    """An SBN (weights ~ N(0, scale^2)) and an inference network (N(0, q_scale^2)), untrained.

    ``name="fdarn"`` gives one autoregressive layer of sum(layers) units. The small q_scale keeps q close to uniform over the 2^7 states, a proposal that covers the
    posterior, so importance sampling converges at moderate K.
    """
    torch.manual_seed(seed)
    size = {"n_latent": int(sum(layers))} if name == "fdarn" else {"layers": list(layers)}
    spec = {"name": name, **size, "inference": {"autoregressive": autoregressive_q}}
    model, inference = build_model(OmegaConf.create(spec), n_visible)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, scale)
        for p in inference.parameters():
            p.normal_(0.0, q_scale)
    return model, inference


def tiny_dbn(seed: int = 0):
    """A 12-6-8 DBN with weights ~ N(0, 1) and biases ~ N(0, 0.25): small enough to enumerate, sharp enough that
    AIS and its certificate have work to do."""
    torch.manual_seed(seed)
    dbn = DBN(12, [6, 8])
    with torch.no_grad():
        for rbm in dbn.rbms:
            rbm.W.normal_(0, 1.0)
            rbm.b.normal_(0, 0.5)
            rbm.c.normal_(0, 0.5)
    return dbn


def enumerated_elbo(model, inference, x: torch.Tensor) -> torch.Tensor:
    """Exact ELBO(x) = sum_h q(h | x) [log p(x, h) - log q(h | x)], differentiable in both networks."""
    h = enumerate_states(model.n_latent, 0, 2**model.n_latent, dtype=x.dtype)
    hs = [t.unsqueeze(1) for t in split_layers(h, model.layers)]
    log_p = model.log_joint(x.unsqueeze(0), hs)
    log_q = inference.log_prob(hs, x.unsqueeze(0))
    return (log_q.exp() * (log_p - log_q)).sum(0)


SYNTHETIC = ["data=synthetic", "trainer.device=cpu", "trainer.progress=false", "trainer.tensorboard=false",
             "print_config=false", "trainer.log_every=10", "trainer.val_every=20", "trainer.ckpt_every=20",
             "trainer.sample_every=1000", "trainer.val_num_examples=100", "model.layers=[4,3]",
             "final_eval.enabled=false"]


@pytest.fixture
def synthetic_overrides():
    return list(SYNTHETIC)


def assert_same_step(fast, slow, x: torch.Tensor, param_atol: float = 1e-12) -> None:
    """One logging step of two learners that should take the same update (a fast path and the autograd path): the
    same metrics, gradients and parameters after it, to float64 rounding (``param_atol``: Adam divides a gradient
    entry that is zero up to rounding, ~1e-17, by sqrt(v) + eps = 1e-8, so its step can differ by lr 1e-9)."""
    metrics_fast, metrics_slow = fast.step(x, diagnostics=True), slow.step(x, diagnostics=True)
    assert metrics_fast.keys() == metrics_slow.keys()
    for k in metrics_fast:
        torch.testing.assert_close(metrics_fast[k], metrics_slow[k], rtol=1e-10, atol=1e-10, msg=k)
    for (name, p), q in zip(fast.named_parameters(), slow.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12, msg=f"gradient of {name}")
        torch.testing.assert_close(p, q, rtol=1e-10, atol=param_atol, msg=f"{name} after the update")


def assert_same_parameters(fast, slow, msg: str = "", atol: float = 1e-12) -> None:
    for (name, p), q in zip(fast.named_parameters(), slow.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=atol, msg=f"{name} {msg}")


def chi_square(samples: torch.Tensor, log_probs: torch.Tensor) -> tuple[float, int]:
    """Pearson chi-square of binary samples [n, k] against the exact probabilities of all 2^k states.

    Returns (statistic, degrees of freedom)."""
    k = samples.shape[1]
    codes = (samples * (2 ** torch.arange(k - 1, -1, -1, dtype=torch.float32))).sum(1).long()
    observed = torch.bincount(codes, minlength=2**k).double()
    expected = samples.shape[0] * log_probs.double().exp()
    return ((observed - expected) ** 2 / expected).sum().item(), 2**k - 1


# chi-square quantiles at p = 0.001 (a fixed-seed test then fails only when the sampler is wrong)
CHI2_999 = {15: 37.70, 63: 103.44}


@pytest.fixture
def native_kernels():
    """Skips a test of the C kernels (``nvil.backend.native``) where they do not build (no C compiler)."""
    from nvil.backend import native
    try:
        native.library()
    except native.NativeUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The tests use small tensors, for which a second torch thread costs more than it gives (and
    on a busy 2-core machine, 20-100x more)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True, scope="session")
def cache_key(tmp_path_factory):
    """The log Z cache's secret key (``nvil.core.userkey``) in the session's temporary directory rather than the
    user's ~/.cache; the scripts the tests start inherit it."""
    saved = os.environ.get("NVIL_CACHE_KEY_FILE")
    os.environ["NVIL_CACHE_KEY_FILE"] = str(tmp_path_factory.mktemp("cache_key") / "log_z.key")
    yield
    if saved is None:
        os.environ.pop("NVIL_CACHE_KEY_FILE", None)
    else:
        os.environ["NVIL_CACHE_KEY_FILE"] = saved


# ---- the scripts, run in this process ------------------------------------------------------------------------
IN_PROCESS = threading.Lock()  # one script at a time: a run changes sys.argv, the directory, stdout and stderr


def run_script(script: str, *args: str, cwd=ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python SCRIPT *args`` (``train.py``, ``evaluate.py``, or ``-m nvil.app.merge``) as its process would run
    it, in this one: through the function the script and its console script call (``nvil.app.main.train_main``
    ...), its arguments in ``sys.argv``, ``cwd`` as the working directory, ``env`` added to ``os.environ`` (and HYDRA_FULL_ERROR=0),
    stdout and stderr captured, the exit code from ``SystemExit`` (an uncaught exception: 1, its traceback on
    stderr). Hydra's global state, the loggers' handlers, levels and disabled flags and the environment are put back
    afterwards. The
    process itself (start-up, signals, the CPU kernel set chosen before torch starts) is what the few subprocess
    tests are for."""
    out, err = io.StringIO(), io.StringIO()
    with IN_PROCESS:
        root = logging.getLogger()
        saved = sys.argv, os.getcwd(), dict(os.environ), list(root.handlers), root.level
        root.handlers = []  # handlers bound to streams the run does not own (pytest's, absl's) stay out of it
        # Hydra configures logging with dictConfig, which closes every handler the process holds; absl's (jax
        # imports it) would close the stream it holds, pytest's capture: the run sees none of them
        kept = logging._handlerList[:]
        del logging._handlerList[:]
        # evaluate.py's Hydra logging config (disabled) disables every existing logger, train.py's enables them
        loggers = {name: (lg.disabled, lg.level, lg.propagate) for name, lg in logging.Logger.manager.loggerDict.items()
                   if isinstance(lg, logging.Logger)}
        try:
            os.chdir(cwd)
            os.environ.update({"HYDRA_FULL_ERROR": "0", **(env or {})})  # Hydra's errors as the scripts print them
            sys.argv = [script, *args]
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    if script == "-m nvil.app.merge":
                        runpy.run_module("nvil.app.merge", run_name="__main__")
                    else:
                        getattr(app_main, {"train.py": "train_main", "evaluate.py": "evaluate_main"}[script])()
                    code = 0
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else int(e.code is not None)
                except BaseException:  # noqa: BLE001 - the command's failure, reported with its traceback
                    traceback.print_exc()
                    code = 1
        finally:
            sys.argv = saved[0]
            os.chdir(saved[1])
            os.environ.clear()
            os.environ.update(saved[2])
            GlobalHydra.instance().clear()
            for h in [h for h in root.handlers if h not in saved[3]]:
                h.close()
            root.handlers = saved[3]
            root.setLevel(saved[4])
            logging._handlerList[:0] = kept
            for name, (disabled, level, propagate) in loggers.items():
                lg = logging.getLogger(name)
                lg.disabled, lg.propagate = disabled, propagate
                lg.setLevel(level)
    return subprocess.CompletedProcess([script, *args], code, out.getvalue(), err.getvalue())
