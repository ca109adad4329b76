"""Evaluate a checkpoint: rebuild the model from the registry, pick the data split, run an estimator,
print one JSON line and append it to ``<checkpoint>.eval.jsonl`` beside the checkpoint."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from estimators import build_estimator
from estimators.base import Result
from models import MODELS, build_model
from nvil.checkpoint import load_checkpoint, load_module_state
from nvil.config import positive_int, resolve_device
from nvil.data import build_model_data, take_rows
from nvil.errors import CheckpointError, ConfigError
from nvil.ops import mean_and_stderr


def load_model(path: Path, device: torch.device):
    """(model, inference network, checkpoint payload), rebuilt from ``models.MODELS``."""
    payload = load_checkpoint(path, map_location=device)
    name = payload["model_name"]
    if name not in MODELS:
        raise CheckpointError(f"checkpoint {path} holds a model {name!r} this version does not know "
                              f"(known: {', '.join(sorted(MODELS))})")
    model_cfg = OmegaConf.create(payload["config"]["model"])
    if model_cfg.get("name") != name:
        raise CheckpointError(f"checkpoint {path} is inconsistent: model_name={name!r} but its config "
                              f"names {model_cfg.get('name')!r}")
    try:
        model, inference = build_model(model_cfg, int(payload["n_visible"]))
    except ConfigError as e:
        raise CheckpointError(f"checkpoint {path} holds an unusable {name} config: {e}") from None
    load_module_state(model, payload["model"], f"{name} model", path)
    if payload.get("inference") is not None:
        load_module_state(inference, payload["inference"], "inference network", path)
    else:
        inference = None
    model.to(device).eval()
    if inference is not None:
        inference.to(device).eval()
    return model, inference, payload


def evaluate_checkpoint(path, estimator_cfg, *, split: str = "test", num_examples: int | None = None,
                        seed: int = 0, device: str = "auto", progress: bool = True,
                        data_overrides: dict | None = None, output: str | None = None) -> Result:
    path = Path(path)
    dev = resolve_device(device)
    positive_int(num_examples, "eval.num_examples", allow_none=True)
    estimator = build_estimator(estimator_cfg)
    model, inference, payload = load_model(path, dev)
    estimator.check(model, inference)  # refuse before any work starts
    data_cfg = OmegaConf.merge(OmegaConf.create(payload["config"]["data"]), OmegaConf.create(data_overrides or {}))
    data = build_model_data(data_cfg, OmegaConf.create(payload["config"]["model"]), dev)
    x = data.split(split)
    if x.shape[1] != model.n_visible:
        raise ConfigError(f"data has {x.shape[1]} visible units but the checkpoint's model has {model.n_visible}")
    if num_examples is not None:
        x = take_rows(x, 0, num_examples, dense=False)
    # Estimators that need more of the dataset than the rows (estimator=classify: labels, training split).
    inputs = estimator.dataset_inputs(model, data, split, x.shape[0]) if hasattr(estimator, "dataset_inputs") else {}
    generator = torch.Generator(device=dev).manual_seed(seed)
    with tqdm(total=x.shape[0], disable=not progress, desc=estimator.name, unit="example") as bar:
        result = estimator.estimate(model, x, inference=inference, generator=generator, seed=seed, progress=bar,
                                    **inputs)
    if getattr(model, "visible", None) == "multinomial":
        result.extras.update(perplexity(result, x, exact=estimator.name == "exact"))
    result.extras.update({"split": split, "checkpoint": str(path), "step": int(payload.get("step", -1))})
    line = result.to_json()
    print(line, flush=True)
    out = Path(output) if output else path.with_name(path.name + ".eval.jsonl")
    with open(out, "a") as f:
        f.write(line + "\n")
    return result



def perplexity(result: Result, docs: torch.Tensor, exact: bool) -> dict:
    """Perplexity per word, exp(-(1/N) sum_d log p(d) / L_d) (Mnih & Gregor 2014, Sec. 4.3), with a
    delta-method standard error. log p(d) counts each document as a sequence of L_d words (no
    multinomial coefficient). From a lower bound on log p(d) this is an upper bound on perplexity."""
    lengths = torch.sparse.sum(docs, 1).to_dense() if docs.is_sparse else docs.sum(1)
    per_word = result.log_p.double() / lengths.double().cpu().clamp(min=1)
    mean, se = mean_and_stderr(per_word)
    value = math.exp(-mean)
    return {"perplexity": round(value, 3), "perplexity_stderr": round(value * se, 3),
            "perplexity_is": "exact" if exact else "upper bound (from a lower bound on log p)"}
