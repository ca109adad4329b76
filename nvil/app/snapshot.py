"""What a checkpoint of a training run holds: the loop's counters (``LoopState``) and everything a resumed run
needs (``write_checkpoint``); ``nvil.app.resume.restore`` reads it back."""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from nvil.app.build import Run
from nvil.app.divergence import DivergenceMonitor, check_finite, kept
from nvil.core import distributed
from nvil.core.checkpoint import save_checkpoint
from nvil.core.files import writing

log = logging.getLogger("nvil")


@dataclass
class LoopState:
    step: int = 0
    best_score: float = -math.inf
    best_step: int = -1
    evals_without_improvement: int = 0
    stopped_early: bool = False
    regressions: int = 0  # validation regression episodes warned of (nvil.app.divergence)



def write_checkpoint(path: Path, *, run: Run, state: LoopState, monitor: DivergenceMonitor, resolved: dict,
                     d: distributed.Dist, last_path: Path) -> None:
    """Everything a resumed run needs, written atomically by rank 0 (``nvil.core.checkpoint``). Under torchrun a
    collective: every rank comes here, with its own generators and particles."""
    check_finite(run, state.step, last_path)
    payload = {"divergence": monitor.state_dict(), "config": resolved, "model_name": resolved["model"]["name"],
               "n_visible": run.data.dim, "model": run.model.state_dict(),
               "inference": None if run.inference is None else run.inference.state_dict(),
               "learner": run.learner.learner_state(), "step": state.step, "best_score": state.best_score,
               "loop": asdict(state), "rng": {"torch": torch.get_rng_state()}}
    if d.enabled:
        payload["world_size"] = d.world_size
        payload["ranks"] = distributed.gather_objects(
            {"learner": run.learner.rank_state(), "torch_rng": torch.get_rng_state()})
    if d.is_main:
        with writing(path, "checkpoint", f"{kept(last_path)}; free space or make the directory writable, then "
                                         "resume with trainer.resume=true"):
            save_checkpoint(path, payload)
        log.info("step %d: saved %s", state.step, path)
