"""Entry-point glue: check the command line, run a Hydra task, turn ``UserError`` into one line.

Every refusal is one ``error: ...`` line on stderr with exit code 2: the project's own checks, and Hydra's
(a misspelt key, a malformed override), which are found by composing the config before Hydra runs the job.
Ctrl-C outside the training loop (which saves a checkpoint first) is one line with exit code 130.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import sys
import time
from typing import Callable

from omegaconf import OmegaConf

from nvil.backend import gemm
from nvil.backend.accel import quiet_cpu_compile
from nvil.core import distributed
from nvil.core.config import CONFIG_DIR, check_group_choices
from nvil.core.errors import ConfigError, UserError
from nvil.core.files import check_writable

LAUNCHERS_NEEDING_SUBMITIT = ("local", "slurm", "submitit_local", "submitit_slurm")


def run_task(hydra_main: Callable, config_name: str, run_dir_root: str | None = None) -> None:
    """Run ``hydra_main`` (a ``@hydra.main`` function); print user errors as one line.

    Under torchrun the ranks join their process group first; with ``run_dir_root`` (train.py's ``outputs``) they
    then agree on rank 0's run directory, since each would otherwise stamp its own time into
    ``hydra.run.dir``, and only rank 0 writes Hydra's own files there."""
    try:
        if config_name == "evaluate":
            sys.argv[1:] = estimator_overrides(sys.argv[1:])
        argv = sys.argv[1:]
        check_group_choices(argv)
        check_launcher(argv)
        composed = check_composes(config_name, argv)
        if run_dir_root is not None and composed is not None and not multirun(argv):
            check_writable(OmegaConf.select(composed, "hydra.run.dir"), "the run directory",
                           "choose a writable hydra.run.dir")
        gemm.choose_backend()  # NVIL_GEMM, a bad value reported here
        if "WORLD_SIZE" in os.environ and distributed.launched_world_size() > 1:  # torchrun
            sys.argv += torchrun_overrides(argv, run_dir_root)
    except UserError as e:
        fail(e)
    try:
        with quiet_cpu_compile():  # Inductor's "No CUDA runtime is found" on every CPU compilation: noise here
            hydra_main()
    except KeyboardInterrupt:
        fail(UserInterrupt())
    finally:
        distributed.cleanup()


def estimator_overrides(argv: list[str]) -> list[str]:
    """``estimator.KEY=VALUE`` becomes ``++estimator.KEY=VALUE``: which keys an estimator takes depends on the model
    it scores (a user's model, or ``estimator=ais`` on a VAE: per-example AIS, ``nvil.estimators.ROUTES``),
    known only once the model is loaded, so the estimator's own settings refuse an unknown key in one line
    (``nvil.estimators.resolve``) rather than the config file's."""
    return [f"++{a}" if a.startswith("estimator.") else a for a in argv]


class UserInterrupt(UserError):
    exit_code = 130

    def __str__(self) -> str:
        return "interrupted (Ctrl-C)"


def check_launcher(argv: list[str]) -> None:
    """``hydra/launcher=local|slurm`` needs Hydra's submitit plugin, the ``[cluster]`` extra."""
    for arg in argv:
        if arg.startswith("hydra/launcher=") and arg.split("=", 1)[1] in LAUNCHERS_NEEDING_SUBMITIT:
            if not has_submitit():
                raise ConfigError(f"{arg} needs Hydra's submitit launcher, which is not installed; "
                                  "install it with: pip install -e '.[cluster]'")


def has_submitit() -> bool:
    """Whether Hydra's submitit launcher is installed. ``find_spec`` of a dotted name imports its parent, and
    ``hydra_plugins`` itself is absent where no Hydra plugin is installed: that is an answer, not an error."""
    try:
        return importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None
    except ModuleNotFoundError:
        return False


def multirun(argv: list[str]) -> bool:
    return any(a in ("-m", "--multirun") for a in argv)


def check_composes(config_name: str, argv: list[str]):
    """Compose the config as Hydra is about to (a sweep's first value for each swept key), so that Hydra's
    own errors become one line here instead of its multi-line report with exit code 1; the composed config (with
    Hydra's own), or None where Hydra's flags or a caller's Hydra context leave it to Hydra."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        return None  # Hydra's own flags (--cfg job, --info, --config-name ...): Hydra reads the rest itself
    args = [a for a in argv if not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except HydraException as e:
        raise ConfigError(f"cannot parse the command line: {_one_line(e)}") from None
    overrides = []
    for o in parsed:
        if o.is_sweep_override():
            first = next(iter(o.sweep_string_iterator()), None)
            if first is None:
                continue
            overrides.append(f"{o.get_key_element()}={first}")
        else:
            overrides.append(o.input_line)
    if GlobalHydra.instance().is_initialized():  # a caller (tests) composing configs of its own
        return None
    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            try:
                return compose(config_name, overrides=overrides, return_hydra_config=True)
            except (HydraException, OmegaConfBaseException) as e:
                raise ConfigError(explain(e, compose, config_name, overrides)) from None
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_one_line(e)) from None


def explain(e: Exception, compose, config_name: str, overrides: list[str]) -> str:
    """Hydra's message in one line; for an unknown key, the nearest known keys of its section."""
    text = str(e)
    m = re.search(r"Could not override '([^']+)'", text) or re.search(r"Key '([^']+)' is not in struct", text)
    if m and ("not in struct" in text or "To append to your config" in text):
        key = m.group(1)
        bad = next((o for o in overrides if o.split("=", 1)[0].lstrip("+~") == key), None)
        section, _, leaf = key.rpartition(".")
        known: list[str] = []
        try:
            cfg = compose(config_name, overrides=[o for o in overrides if o != bad])
            node = OmegaConf.select(cfg, section) if section else cfg
            known = [str(k) for k in node.keys()] if hasattr(node, "keys") else []
        except Exception:  # noqa: BLE001 - only for the hint
            pass
        near = difflib.get_close_matches(leaf, known, n=2)
        hint = f" (did you mean {' or '.join(f'{section}.{k}' if section else k for k in near)}?)" if near else ""
        value = bad.split("=", 1)[1] if bad and "=" in bad else "VALUE"
        return f"unknown config key {key}{hint}; to add a new key write +{key}={value}"
    return _one_line(e)


def _one_line(e: Exception) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip() and "HYDRA_FULL_ERROR" not in line
             and not line.strip().startswith(("full_key:", "object_type=", "reference_type="))]
    return "; ".join(lines)[:400] or type(e).__name__


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
    if not getattr(e, "quiet", False):
        print(f"error: {e}", file=sys.stderr)
    sys.exit(getattr(e, "exit_code", 2))


def guarded(task: Callable, *args, **kwargs):
    try:
        return task(*args, **kwargs)
    except UserError as e:
        fail(e)
