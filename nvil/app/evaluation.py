"""Evaluate a checkpoint: rebuild the model from the registry, pick the data split, run an estimator,
print one JSON line and append it to ``<checkpoint>.eval.jsonl`` beside the checkpoint.

Under torchrun every rank evaluates its shard of the examples (whole estimator batches, as ``eval.shard`` does
for separate jobs); rank 0 gathers the per-example estimates and reports the result of the whole set.

The result is printed before it is recorded: a record beside the checkpoint that cannot be written (a read-only
directory, a full disk) is one warning and the estimate stands; an ``eval.output`` that cannot be written is a
one-line ``StorageError`` after the printed line. An estimate that asks for more memory than there is becomes a
one-line ``OutOfMemory`` naming the settings to lower."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from nvil.app.memory import memory_advice, out_of_memory
from nvil.app.report import headline
from nvil.backend import gemm
from nvil.backend.accel import accelerate_sampling
from nvil.backend.cpu_kernels import capability
from nvil.backend.denormals import flushed_denormals
from nvil.backend.threads import choose_threads, model_work, restored_threads
from nvil.core import distributed
from nvil.core.checkpoint import load_checkpoint, load_module_state
from nvil.core.config import positive_int, resolve_device
from nvil.core.errors import CertificateFailed, CheckpointError, ConfigError, DataError, OutOfMemory, StorageError
from nvil.core.files import append_line, describe_write_failure
from nvil.core.ops import mean_and_stderr
from nvil.data import build_model_data, take_rows
from nvil.estimators import ROUTES, build_estimator, resolve
from nvil.estimators.base import Result, progress_interval
from nvil.estimators.budget import check_budget, resolve_budget, size_keys, within_budget
from nvil.models import MODELS, build_model


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


def shard_rows(num_rows: int, shard: int | None, num_shards: int | None, block: int) -> tuple[int, int]:
    """Rows [start, stop) of shard ``shard`` of ``num_shards``: contiguous runs of whole blocks of ``block``
    rows (the estimator's batch), so a sharded evaluation draws the same random numbers per example."""
    if shard is None and num_shards is None:
        return 0, num_rows
    positive_int(num_shards, "eval.num_shards")
    if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < num_shards:
        raise ConfigError(f"eval.shard must be an integer in [0, {num_shards}), got {shard!r}")
    blocks = math.ceil(num_rows / block)
    lo, hi = (shard * blocks) // num_shards, ((shard + 1) * blocks) // num_shards
    return min(lo * block, num_rows), min(hi * block, num_rows)


EVAL_ROWS = 1000  # rows (chains, samples, examples) an estimator puts through one product: the work per thread


@dataclass(frozen=True)
class EvalSpec:
    """What ``evaluate_checkpoint`` evaluates on and how: evaluate.py's ``data.split``, ``seed`` and ``eval.*``."""

    split: str = "test"
    num_examples: int | None = None  # None: the whole split
    seed: int = 0
    device: str = "auto"
    progress: bool = True
    data_overrides: dict | None = None  # data config keys that differ from the checkpoint's
    output: str | None = None  # the JSON lines file; None: <checkpoint>.eval.jsonl beside the checkpoint
    shard: int | None = None  # shard ``shard`` of ``num_shards`` (separate jobs; python -m nvil.app.merge)
    num_shards: int | None = None
    per_class: int | None = None  # the first ``per_class`` examples of each class
    strict: bool = False  # an estimate that is not certified raises ``CertificateFailed``
    flush_denormal: bool = True  # flush denormal floats to zero on the CPU (nvil/backend/denormals.py)
    threads: int | str = "auto"  # torch's intra-op threads (nvil/backend/threads.py)
    given: tuple[str, ...] | None = None  # the estimator settings the user set (None: those unlike the defaults)

    @property
    def sharded(self) -> bool:
        return self.shard is not None or self.num_shards is not None


def evaluate_checkpoint(path, estimator_cfg, spec: EvalSpec = EvalSpec()) -> Result:
    """Estimate log p(v) of ``spec.split`` under the checkpoint at ``path`` with the estimator ``estimator_cfg``
    describes; print the JSON line, append it to the output file and return the ``Result``."""
    with flushed_denormals(spec.flush_denormal, "eval.flush_denormal"), restored_threads():
        return _evaluate_checkpoint(Path(path), estimator_cfg, spec)


def _evaluate_checkpoint(path: Path, estimator_cfg, spec: EvalSpec) -> Result:
    d = distributed.setup()
    dev = distributed.rank_device(resolve_device(spec.device), d)
    positive_int(spec.num_examples, "eval.num_examples", allow_none=True)
    if d.enabled and spec.sharded:
        raise ConfigError("eval.shard / eval.num_shards split the work between separate jobs; under torchrun the "
                          "ranks already share the examples, so leave them unset")
    if estimator_cfg.get("name") not in ROUTES:  # a route's settings are known once the model is
        build_estimator(estimator_cfg)  # a bad setting is refused before the checkpoint is read
    model, inference, payload = load_model(path, dev)
    built = resolve(estimator_cfg, model, spec.given, inference)
    estimator = built[0](**built[1])
    if estimator.simulates_own_data and (d.enabled or spec.sharded):
        raise ConfigError(f"estimator={estimator.name} simulates its own examples, so sharding it (torchrun, eval.shard) "
                          "would repeat them on every shard; run it in one process")
    estimator.check(model, inference)  # refuse before any work starts
    budget = estimator_cfg.get("budget")
    if budget is not None:
        check_budget(budget)
        size_keys(built[0])
        # auto: a budget unless the user set part of the schedule (nvil.estimators.budget.resolve_budget)
        budget = resolve_budget(built[0], dict.fromkeys(spec.given or ()), budget)
    if budget is not None:
        if d.enabled or spec.sharded:
            raise ConfigError("estimator.budget grows one estimate until its certificate holds; its rounds cannot be "
                              "split between processes: run it in one (no torchrun, no eval.shard)")
    # estimators batch ~EVAL_ROWS chains, samples or examples per product: threads by that work
    torch.set_num_threads(choose_threads(spec.threads, model_work((model, inference), EVAL_ROWS), "eval.threads"))
    accelerate_sampling(str(estimator_cfg.get("accel", "auto")), model, inference)  # autoregressive draws in C
    data_cfg = OmegaConf.merge(OmegaConf.create(payload["config"]["data"]), OmegaConf.create(spec.data_overrides or {}))
    data = build_model_data(data_cfg, dev, labels=bool(payload["config"]["model"].get("labels", False)))
    x = data.split(spec.split)
    if x.shape[1] != model.n_visible:
        raise ConfigError(f"data has {x.shape[1]} visible units but the checkpoint's model has {model.n_visible}")
    if spec.per_class is not None:
        x = first_per_class(x, data, spec.split, positive_int(spec.per_class, "eval.per_class"), estimator.name)
    total = data.rows_to_evaluate(x, spec.split, spec.num_examples)
    start, stop = shard_rows(total, d.rank if d.enabled else spec.shard, d.world_size if d.enabled else spec.num_shards,
                             int(getattr(estimator, "batch_size", None) or estimator_cfg.get("batch_size") or 100))
    x = take_rows(x, start, stop, dense=False)
    # What estimators need beyond the rows (classify: labels; AIS: training marginals; DBNs: the log Z cache).
    inputs = estimator.dataset_inputs(model, data, spec.split, (start, stop), checkpoint=path, payload=payload)
    if estimator.row_offset_aware:
        inputs["row_offset"] = start
    try:
        if budget is None:
            result = _estimate(estimator, model, inference, x, inputs, spec, dev, d)
        else:
            result = within_budget(*built, budget, lambda est, round_seed: _estimate(
                est, model, inference, x, inputs, replace(spec, seed=round_seed), dev, d), spec.seed)
    except (MemoryError, RuntimeError) as e:  # torch.OutOfMemoryError is a RuntimeError
        if not out_of_memory(e):
            raise
        raise OutOfMemory(memory_advice(estimator.name, estimator_cfg, e)) from None
    # Word counts (documents: the data of multinomial-visible models) are also scored per word.
    lengths = doc_lengths(x) if data.binarize == "counts" else None
    if d.enabled:
        result, lengths = gather_result(result, lengths)
    if lengths is not None:
        result.extras.update(perplexity(result, lengths, exact=estimator.name == "exact"))
    result.extras.update({"split": spec.split, "checkpoint": str(path), "step": int(payload.get("step", -1)),
                          "cpu_kernels": capability(), "gemm": gemm.backend(),
                          "threads": torch.get_num_threads()})  # torch's CPU kernel set (nvil/backend/cpu_kernels.py)
    if spec.num_shards is not None:
        result.extras.update(shard_sums(result, spec.shard, spec.num_shards, (start, stop)))
    if d.is_main:
        _report(result, estimator.name, Path(spec.output) if spec.output else path.with_name(path.name + ".eval.jsonl"),
                explicit=bool(spec.output))
    if spec.strict and result.certified is False:
        raise CertificateFailed(f"estimator={estimator.name} is not certified: {result.warnings[0]}")
    return result


def _estimate(estimator, model, inference, x: torch.Tensor, inputs: dict, spec: EvalSpec, dev: torch.device,
              d: distributed.Dist) -> Result:
    generator = torch.Generator(device=dev).manual_seed(spec.seed)
    if x.shape[0] == 0:  # more ranks than estimator batches: this one has nothing to do
        return Result(estimator.name, torch.empty(0), 0.0, spec.seed)
    # The estimators advance the bar in fractions of an example (every sweep or AIS step of a batch), so it
    # moves and gives an ETA from the first seconds; miniters=0: each redraw waits only for mininterval, which
    # is ten seconds where stderr is a file (a SLURM log) rather than a terminal.
    with tqdm(total=x.shape[0], disable=not (spec.progress and d.is_main), desc=estimator.name, unit="example",
              mininterval=progress_interval(), miniters=0,
              bar_format="{l_bar}{bar}| {n:.1f}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]") as bar:
        return estimator.estimate(model, x, inference=inference, generator=generator, seed=spec.seed, progress=bar,
                                  **inputs)


def _report(result: Result, name: str, out: Path, explicit: bool = False) -> None:
    """The JSON line on stdout, then appended to ``out`` as one whole line (``nvil.core.files.append_line``); each
    warning of estimator ``name``, loud, as one line on stderr (the JSON keeps every number either way), and last the
    human line (``nvil.app.report.headline``: the estimate, its examples and its certificate in words). An ``out``
    that cannot be written is a warning, or with ``explicit`` (the user's ``eval.output``) a ``StorageError``, the
    command's one error line in place of the human line."""
    line = result.to_json()
    print(line, flush=True)
    for warning in result.warnings:
        print(f"warning: {name}: {warning}", file=sys.stderr, flush=True)
    try:
        append_line(out, line)
    except OSError as e:
        problem = describe_write_failure(e, out, "the evaluation record")
        if explicit:
            raise StorageError(f"{problem}; the result is the JSON line printed above") from None
        print(f"warning: {problem}; the result is the JSON line on stdout", file=sys.stderr, flush=True)
    summary = json.loads(line)
    human = headline(summary)
    if sweeping() and summary.get("checkpoint"):  # a -m sweep prints one line per job: say whose it is
        human = f"{summary['checkpoint']}: {human}"
    print(human, file=sys.stderr, flush=True)


def sweeping() -> bool:
    """Whether this job is one of a Hydra multirun (``-m``)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def gather_result(result: Result, lengths: torch.Tensor | None) -> tuple[Result, torch.Tensor | None]:
    """Every rank's per-example estimates (and document lengths), in shard order, as one ``Result`` of the whole
    set: the result one process would give, where each example's random numbers depend only on its batch.
    Shared terms (an AIS log Z, computed alike on every rank from the same seed) and the extras are rank 0's;
    the time is the slowest rank's."""
    parts = distributed.gather_objects({"log_p": result.log_p, "run_log_p": result.run_log_p,
                                        "seconds": result.seconds, "lengths": lengths,
                                        "certificate": (result.checks, result.failed, result.warnings)})
    whole = Result(result.estimator, torch.cat([p["log_p"] for p in parts]), max(p["seconds"] for p in parts),
                   result.seed, extras=dict(result.extras), shared_stderr=result.shared_stderr)
    if result.run_log_p is not None:
        whole.run_log_p = torch.cat([p["run_log_p"] for p in parts], dim=1)
    whole.extras["num_processes"] = len(parts)
    for rank, p in enumerate(parts):  # every rank's checks; a failure on any rank's shard fails the whole
        checks, failed, warnings = p["certificate"]
        whole.carry(Result(result.estimator, torch.empty(0), 0.0, result.seed, checks=checks, failed=failed,
                           warnings=[w if rank == 0 else f"(rank {rank}) {w}" for w in warnings]))
    return whole, None if lengths is None else torch.cat([p["lengths"] for p in parts])


def first_per_class(x, data, split: str, k: int, estimator: str):
    """The first k rows of each class, class by class (Murray & Salakhutdinov 2009: 5 test cases per class)."""
    labels = data.labels.get(split)
    if labels is None:
        raise DataError(f"eval.per_class needs labels, and data={data.name} has none for the {split} split")
    if estimator == "classify":
        raise ConfigError("eval.per_class does not combine with estimator=classify")
    labels = labels.to(x.device)
    rows = torch.cat([torch.nonzero(labels == c).flatten()[:k] for c in torch.unique(labels)])
    return take_rows(x, 0, x.shape[0])[rows]


def shard_sums(result: Result, shard: int, num_shards: int, rows: tuple[int, int]) -> dict:
    """What ``python -m nvil.app.merge`` needs to combine shards exactly: sums, not means."""
    lp = result.log_p.double()
    out = {"shard": shard, "num_shards": num_shards, "rows": list(rows), "sum_log_p": lp.sum().item(),
           "sum_sq_log_p": (lp**2).sum().item(), "shared_stderr": result.shared_stderr}
    if result.run_log_p is not None:
        out["run_sums"] = result.run_log_p.double().sum(1).tolist()
    return out


def doc_lengths(docs: torch.Tensor) -> torch.Tensor:
    """L_d, the words in each document (dense or sparse counts)."""
    return (torch.sparse.sum(docs, 1).to_dense() if docs.is_sparse else docs.sum(1)).cpu()


def perplexity(result: Result, lengths: torch.Tensor, exact: bool) -> dict:
    """Perplexity per word, exp(-(1/N) sum_d log p(d) / L_d) (Mnih & Gregor 2014, Sec. 4.3), with a
    delta-method standard error. log p(d) counts each document as a sequence of L_d words (no
    multinomial coefficient). From a lower bound on log p(d) this is an upper bound on perplexity."""
    per_word = result.log_p.double() / lengths.double().cpu().clamp(min=1)
    mean, se = mean_and_stderr(per_word)
    value = math.exp(-mean)
    return {"perplexity": round(value, 3), "perplexity_stderr": round(value * se, 3),
            "perplexity_is": "exact" if exact else "upper bound (from a lower bound on log p)"}
