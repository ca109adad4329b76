"""Data parallelism across processes with ``torch.distributed``: torchrun, or SLURM tasks started by submitit.

    torchrun --nproc_per_node=4 train.py experiment=nvil_sbn200     # 4 ranks, trainer.batch_size split 4 ways
    torchrun --nproc_per_node=2 evaluate.py checkpoint=PATH estimator=ais   # the test set split 2 ways

Every rank holds the same model; ``DistributedDataParallel`` averages the gradients of the rank-local surrogate
losses, so a run with N ranks and per-rank batch B / N follows the gradient of the whole batch B, as one process
would. What is not a gradient is made global explicitly: NVIL's running moments c and v use the statistics of the
whole batch (``global_mean_var``), and logged metrics are averaged over ranks. Rank-local state (random
generators, SAP's persistent particles, a shard of the total) is gathered into rank 0's checkpoint, which only
rank 0 writes. The backend is gloo on CPU and nccl for CUDA tensors (one process group serves both).
"""

from __future__ import annotations

import gc
import inspect
import os
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from nvil.core.errors import ConfigError, UserError

# Between two collectives a rank may validate or evaluate alone (rank 0) for a while.
TIMEOUT = timedelta(minutes=60)


class RankTimeout(UserError):
    """A collective waited longer than its timeout for another rank."""


@dataclass(frozen=True)
class Dist:
    """This process's place in the job: ``rank`` of ``world_size``, ``local_rank`` on its node."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_world_size() -> int:
    """The world size a launcher asked for (torchrun sets WORLD_SIZE; submitit knows its tasks)."""
    if "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    if "SUBMITIT_EXECUTOR" in os.environ:  # a job started by submitit (hydra/launcher=submitit_*)
        from submitit import JobEnvironment

        return JobEnvironment().num_tasks
    return 1


def setup() -> Dist:
    """Join the process group when the process was launched as one of several ranks; idempotent.

    torchrun provides RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. A SLURM job with several tasks started by
    submitit (``hydra/launcher=submitit_slurm hydra.launcher.tasks_per_node=N``) gets them from
    ``submitit.helpers.TorchDistributedEnvironment``.
    """
    if dist.is_available() and dist.is_initialized():
        return current()
    if launched_world_size() <= 1:
        return Dist()
    if not dist.is_available():
        raise ConfigError("this PyTorch build has no torch.distributed; run a single process")
    if "RANK" not in os.environ:  # a task of a submitit job
        from submitit.helpers import TorchDistributedEnvironment

        TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend, timeout=TIMEOUT)
    return current()


@contextmanager
def collective_timeout(seconds: float, d: Dist):
    """While the block runs, a collective that waits more than ``seconds`` for another rank (one stopped or hung)
    fails with ``RankTimeout``, instead of after the process group's ``TIMEOUT``."""
    if not d.enabled:
        yield
        return
    from torch.distributed.distributed_c10d import _set_pg_timeout

    _set_pg_timeout(timedelta(seconds=seconds))
    try:
        yield
    except (RuntimeError, dist.DistError) as e:
        if "timeout" not in str(e).lower() and "timed out" not in str(e).lower():
            raise
        raise RankTimeout(f"rank {d.rank}: another rank did not answer within trainer.dist_timeout={seconds:g} s "
                          "(a stopped, hung or lost process); the last good checkpoint is kept") from None
    finally:
        try:
            _set_pg_timeout(TIMEOUT)
        except RuntimeError:  # the group is already broken: the error above says why
            pass


def current() -> Dist:
    if not (dist.is_available() and dist.is_initialized()):
        return Dist()
    local = int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", 0)))
    return Dist(dist.get_rank(), dist.get_world_size(), local)


def rank_device(device: torch.device, d: Dist) -> torch.device:
    """Each rank of a CUDA job drives the GPU numbered by its local rank."""
    if device.type != "cuda" or not d.enabled:
        return device
    if d.local_rank >= torch.cuda.device_count():
        raise ConfigError(f"rank {d.rank} has local rank {d.local_rank} but this node has "
                          f"{torch.cuda.device_count()} GPUs: launch at most one process per GPU")
    torch.cuda.set_device(d.local_rank)
    return torch.device("cuda", d.local_rank)


def rank_seed(seed: int, d: Dist) -> int:
    """Rank 0 keeps ``seed`` (a one-rank job is the single-process run); the others get their own streams."""
    return seed + 1_000_003 * d.rank


def per_rank(n: int, d: Dist, what: str) -> int:
    """Each rank's equal share of ``n`` (a global minibatch, or a total of particles)."""
    if n % d.world_size:
        raise ConfigError(f"{what}={n} must be divisible by the number of processes ({d.world_size})")
    return n // d.world_size


def local_rows(n: int, d: Dist, what: str) -> slice:
    """The rows of rank d.rank's share of ``n``."""
    per = per_rank(n, d, what)
    return slice(d.rank * per, (d.rank + 1) * per)


def wrap(module: nn.Module, device: torch.device) -> nn.Module:
    """``DistributedDataParallel`` over ``module``, whose ``forward`` returns the loss to differentiate.

    Buffers are not broadcast: the only ones are NVIL's moments, which every rank updates with the same global
    statistics."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters:  # newer PyTorch
        return DistributedDataParallel(module, device_ids=ids, forward_sync_buffers=False)
    return DistributedDataParallel(module, device_ids=ids, broadcast_buffers=False)


def global_mean_var(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and (biased) variance of ``x`` over every rank's elements, from one all-reduce of
    (count, sum, sum of squares) in float64; on the device, with no host sync."""
    stats = torch.stack([torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device),
                         x.double().sum(), x.double().pow(2).sum()])
    dist.all_reduce(stats)
    mean = stats[1] / stats[0]
    var = (stats[2] / stats[0] - mean**2).clamp(min=0.0)
    return mean.to(x.dtype), var.to(x.dtype)


def average_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Scalar metrics averaged over the ranks that report them (a rank may lack a diagnostic another has);
    every rank calls it at the same steps, and every rank gets the same dict."""
    every = gather_objects(metrics)
    keys = sorted(set().union(*every))
    return {k: sum(m[k] for m in every if k in m) / sum(k in m for m in every) for k in keys}


def all_reduce_max(tensor: torch.Tensor) -> None:
    """``tensor`` (on the CPU: the gloo side of the group) replaced in place by its maximum over the ranks."""
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)


def barrier() -> None:
    dist.barrier()


def gather_objects(obj):
    """Every rank's ``obj`` (tensors moved to the CPU first), as a list indexed by rank, on every rank."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, to_cpu(obj))
    return out


def broadcast(obj, src: int = 0):
    """Rank ``src``'s ``obj`` on every rank."""
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def broadcast_(tensor: torch.Tensor, src: int = 0) -> None:
    """Overwrite ``tensor`` in place with rank ``src``'s."""
    dist.broadcast(tensor, src=src)


def gather_rows(rows: torch.Tensor) -> torch.Tensor:
    """The concatenation over ranks of equally shaped ``rows`` (all-gather on the rows' device)."""
    parts = [torch.empty_like(rows) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, rows.contiguous())
    return torch.cat(parts)


def to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def cleanup() -> None:
    """Leave the process group. DistributedDataParallel wrappers sit in reference cycles and keep the Gloo group
    alive past ``destroy_process_group``; destroyed later, during interpreter shutdown, Gloo aborted a finished
    run (SIGABRT, "terminate called without an active exception") in 4 of 78 two-rank exits of
    tests/ddp_worker.py. Collect them first, so the group goes while the interpreter is whole."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
