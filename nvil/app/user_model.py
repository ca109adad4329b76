"""``evaluate.py model_module=PATH:NAME``: score a model of the user's own (``nvil.models.protocol``) from the
command line, as ``nvil.estimators.evaluate_model`` does from Python.

    python evaluate.py model_module=my_vae.py:VAE checkpoint=vae.pt data.name=mnist estimator=ais
    python evaluate.py model_module=my_vae.py:VAE 'model_kwargs={latent_dim: 50}' checkpoint=vae.pt \\
        data_file=x_test.pt estimator=iwae estimator.num_samples=5000

The module is imported only because the user named it (a file path, or a dotted module name on ``sys.path``);
``NAME`` is a class or a function called with ``model_kwargs``, then given the weights in ``checkpoint`` (a state
dict, or a dict holding one under ``state_dict`` / ``model_state_dict`` / ``model``) read with
``torch.load(weights_only=True)``. The data: ``data.name=`` one of the package's datasets (configs/data/, with
``data.split``) or ``data_file=`` a tensor [N, ...] saved with ``torch.save``. The estimator's settings are the
``estimator.KEY=VALUE`` overrides given, over the defaults of the estimator's class (``nvil.estimators.resolve``: the
package's estimator files hold the settings of its own models and do not apply); without ``estimator=`` it is ``ais``.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from nvil.app.evaluation import EVAL_ROWS, _report
from nvil.app.memory import out_of_memory
from nvil.estimators import DRIVER_KEYS, protocol_names, resolve
from nvil.estimators.budget import resolve_budget, within_budget
from nvil.backend.threads import choose_threads, model_work, restored_threads
from nvil.core.checkpoint import load_weights_only
from nvil.core.config import CONFIG_DIR, positive_int, resolve_device
from nvil.core.errors import CertificateFailed, CheckpointError, ConfigError, OutOfMemory
from nvil.data import build_model_data

STATE_KEYS = ("state_dict", "model_state_dict", "model")
OVERRIDE = re.compile(r"^\+{0,2}estimator\.([A-Za-z_][A-Za-z0-9_]*)=")


def import_user_object(spec: str):
    """``PATH.py:NAME`` or ``package.module:NAME`` -> the object NAME, the module imported for this call only."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ConfigError(f"model_module must be FILE.py:NAME or package.module:NAME, got {spec!r}")
    where, name = spec.split(":")
    if where.endswith(".py") or "/" in where:
        path = Path(where)
        if not path.is_file():
            raise ConfigError(f"model_module: no such file {path}")
        module_name = f"nvil_user_model_{abs(hash(str(path.resolve())))}"
        loader = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader)
        sys.modules[module_name] = module  # dataclasses and pickling look their module up by name
        try:
            loader.loader.exec_module(module)
        except Exception as e:
            sys.modules.pop(module_name, None)
            raise ConfigError(f"model_module: importing {path} failed: {type(e).__name__}: {e}") from None
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise ConfigError(f"model_module: cannot import {where}: {e}") from None
    if not hasattr(module, name):
        raise ConfigError(f"model_module: {where} defines no {name}")
    return getattr(module, name)


def build_user_model(spec: str, kwargs: dict | None, checkpoint: str | None, device: torch.device):
    """The user's model: ``NAME(**kwargs)`` with the weights of ``checkpoint`` (if given), on ``device``, in eval mode."""
    factory = import_user_object(spec)
    if not callable(factory):
        raise ConfigError(f"model_module: {spec} is not a class or a function")
    try:
        model = factory(**(kwargs or {}))
    except Exception as e:
        raise ConfigError(f"model_module: {spec}(**model_kwargs) failed: {type(e).__name__}: {e}") from None
    if checkpoint:
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"checkpoint= holds weights, but {spec} built a {type(model).__name__}, not an nn.Module")
        state = load_weights_only(checkpoint, map_location=device)
        state = next((state[k] for k in STATE_KEYS if isinstance(state, dict) and isinstance(state.get(k), dict)),
                     state)
        if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
            raise CheckpointError(f"checkpoint {checkpoint} is not a state dict (nor a dict holding one under "
                                  f"{', '.join(STATE_KEYS)})")
        try:
            model.load_state_dict(state)
        except RuntimeError as e:
            raise CheckpointError(f"checkpoint {checkpoint} does not match {spec}: "
                                  f"{' '.join(str(e).split())[:300]}") from None
    if isinstance(model, torch.nn.Module):
        model.to(device).eval()
    return model


def user_data(cfg: DictConfig, device: torch.device) -> torch.Tensor:
    """The rows to score: ``data_file`` (a tensor saved with torch.save) or the package's dataset ``data.name``."""
    data_file = cfg.get("data_file")
    name = cfg.data.get("name")
    if data_file and name:
        raise ConfigError("give data_file= or data.name=, not both")
    if data_file:
        x = load_weights_only(data_file, map_location=device)
        if not torch.is_tensor(x) or x.dim() < 1 or x.shape[0] == 0:
            raise ConfigError(f"data_file {data_file} must hold one tensor [N, ...] with N >= 1")
        return x
    if not name:
        raise ConfigError("a user's model needs its data: data.name=mnist (the package's binarised MNIST, "
                          "data.split=test) or data_file=PATH.pt (a tensor [N, ...] saved with torch.save)")
    group = Path(CONFIG_DIR) / "data"
    if not (group / f"{name}.yaml").is_file():
        known = sorted(p.stem for p in group.glob("*.yaml"))
        raise ConfigError(f"unknown data.name {name!r}; known: {', '.join(known)}")
    data_cfg = OmegaConf.merge(OmegaConf.load(group / f"{name}.yaml"),
                               {k: v for k, v in OmegaConf.to_container(cfg.data, resolve=True).items() if k != "split"})
    return build_model_data(data_cfg, device).split(cfg.data.split)


def given_keys(overrides) -> list[str]:
    """The estimator settings ``overrides`` set (``estimator.KEY=VALUE``, with or without Hydra's ``+`` / ``++``)."""
    return [m.group(1) for o in overrides if (m := OVERRIDE.match(o))]


def user_estimator_settings(cfg: DictConfig, overrides: list[str]) -> tuple[str, dict]:
    """(estimator name, its settings): the name ``estimator=`` chose (ais where none was given) and the values of
    the ``estimator.KEY=`` overrides, as the config resolved them."""
    chosen = any(o.lstrip("+").startswith("estimator=") for o in overrides)
    name = str(cfg.estimator.get("name")) if chosen else "ais"
    if name not in protocol_names():
        raise ConfigError(f"estimator={name} does not take a user's model; use one of {', '.join(protocol_names())}")
    keys = given_keys(overrides)
    settings = {}
    for key in keys:
        if key in DRIVER_KEYS:
            continue
        value = cfg.estimator.get(key)
        settings[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return name, settings


def evaluate_user_model(cfg: DictConfig, overrides: list[str]):
    """One ``evaluate.py model_module=...`` job: the JSON line printed and appended to ``eval.output`` (default:
    ``<checkpoint>.eval.jsonl``, or ``evaluate.jsonl`` in the working directory without a checkpoint)."""
    device = resolve_device(cfg.eval.device)
    name, settings = user_estimator_settings(cfg, overrides)
    kwargs = cfg.get("model_kwargs")
    kwargs = OmegaConf.to_container(kwargs, resolve=True) if OmegaConf.is_config(kwargs) else (kwargs or {})
    if not isinstance(kwargs, dict):
        raise ConfigError(f"model_kwargs must be a mapping such as '{{latent_dim: 50}}', got {kwargs!r}")
    model = build_user_model(cfg.model_module, kwargs, cfg.get("checkpoint"), device)
    built = resolve({"name": name, **settings}, model, given=set(settings))
    estimator = built[0](**built[1])
    estimator.check(model)
    modules = [model] if isinstance(model, torch.nn.Module) else []
    with restored_threads():
        torch.set_num_threads(choose_threads(cfg.eval.get("threads", "auto"), model_work(modules, EVAL_ROWS),
                                             "eval.threads"))
        return _score(cfg, name, estimator, model, device, built, given_keys(overrides))


def _score(cfg: DictConfig, name: str, estimator, model, device: torch.device, built: tuple[type, dict],
           given: list[str]):
    x = user_data(cfg, device)
    n = positive_int(cfg.eval.num_examples, "eval.num_examples", allow_none=True)
    x = x[:n] if n else x
    seed = cfg.seed
    try:
        # no estimator.budget= given: auto (a budget where the estimator anneals and no schedule was given)
        budget = resolve_budget(*built, cfg.estimator.get("budget") if "budget" in given else "auto")
        if budget is None:
            result = estimator.estimate(model, x, seed=seed)
        else:  # estimator.budget=SECONDS: grown from small until certified (nvil.estimators.budget)
            result = within_budget(*built, budget,
                                   lambda est, round_seed: est.estimate(model, x, seed=round_seed), seed)
    except (MemoryError, RuntimeError) as e:
        if not out_of_memory(e):
            raise
        raise OutOfMemory(f"estimator={name} needs more memory than this machine has; lower estimator.batch_size "
                          "or estimator.num_chains / num_samples") from None
    result.extras.update({"model_module": cfg.model_module, "checkpoint": cfg.get("checkpoint"),
                          "data": cfg.get("data_file") or f"{cfg.data.name}:{cfg.data.split}"})
    checkpoint = cfg.get("checkpoint")
    out = (Path(cfg.eval.output) if cfg.eval.get("output")
           else Path(checkpoint).with_name(Path(checkpoint).name + ".eval.jsonl") if checkpoint
           else Path("evaluate.jsonl"))
    _report(result, name, out, explicit=bool(cfg.eval.get("output")))
    if cfg.estimator.get("strict", False) and result.certified is False:
        raise CertificateFailed(f"estimator={name} is not certified: {result.warnings[0]}")
    return result
