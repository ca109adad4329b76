"""Build a run from its config, in one place: the data, the model and its inference network, and the learner,
ready for the first step. ``nvil.app.loop.fit`` starts from here, and so do the bench scripts that drive a learner
themselves:

    run = build(cfg, device)
    metrics = run.learner.step(run.data.split("train")[:20])

The order of the random draws is fixed (the seed, then the data, then the parameters, then the learner's own
generator), so the same seed builds the same run wherever it is built.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from nvil.backend.threads import choose_threads, model_work
from nvil.core import distributed
from nvil.data import Dataset, build_model_data, check_model_fits_data
from nvil.learners import build_learner
from nvil.learners.base import Learner
from nvil.models import build_model

log = logging.getLogger("nvil")


@dataclass
class Run:
    data: Dataset
    model: nn.Module
    inference: nn.Module | None
    learner: Learner


def build(cfg, device: torch.device, check: Callable | None = None) -> Run:
    """The run ``cfg`` describes, on ``device``. ``check(model, inference, data)``, if given, runs once the model
    is built and before it moves to the device (train.py: the final evaluation accepts this model). Under
    torchrun each rank's learner draws from its own stream (``distributed.rank_seed``)."""
    torch.manual_seed(cfg.seed)
    data = build_model_data(cfg.data, device, labels=bool(cfg.model.get("labels", False)))
    model, inference = build_model(cfg.model, data.dim)
    check_model_fits_data(model, data)
    if check is not None:
        check(model, inference, data)
    model.to(device)
    model.init_visible_bias(data.train_mean())
    if inference is not None:
        inference.to(device)
        inference.set_input_mean(data.train_mean())
    seed = distributed.rank_seed(cfg.seed, distributed.current())  # rank 0 (and a single process): cfg.seed
    learner = build_learner(cfg.learner, model, inference, device, seed)
    steps = cfg.trainer.get("max_steps")
    learner.accelerate(cfg.trainer.get("accel", "none"), device, steps=None if steps is None else int(steps))
    learner.bind_data(data.split("train"))  # per-example state (MCEM's persistent chains), sized before a resume
    return Run(data, model, inference, learner)


def set_threads(run: Run, cfg, rows: int) -> int:
    """torch's intra-op threads for training (``trainer.threads``; ``auto``: by the work of a step on ``rows``
    examples and the learner's persistent particles, nvil/backend/threads.py)."""
    rows += int(cfg.learner.get("num_particles", 0) or 0)
    threads = choose_threads(cfg.trainer.get("threads", "auto"), model_work((run.model, run.inference), rows),
                             "trainer.threads")
    torch.set_num_threads(threads)
    log.info("%d intra-op thread%s", threads, "" if threads == 1 else "s")
    return threads
