"""Run logging: TensorBoard scalars and image grids under ``tb/``, and one JSON line per event in
``metrics.jsonl``. Tags are namespaced by what they measure: ``train/``, ``val/``, ``nvil/``,
``grad_norm/``, ``samples/``; at the end, the run's config and its final evaluation (``eval/``) in TensorBoard's
hparams view (``log_hparams``)."""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

from nvil.core.files import describe_write_failure, is_write_failure, writing



class RunLogger:
    """``metrics.jsonl`` and TensorBoard's event files in the run directory; a write the storage refuses is a
    ``StorageError`` naming the file (TensorBoard's writes happen on its own thread and surface at the next call)."""

    def __init__(self, run_dir: Path, enabled: bool = True) -> None:
        self.run_dir = Path(run_dir)
        with writing(self.run_dir, "the run's logs in", self.advice):
            self.writer = SummaryWriter(str(self.run_dir / "tb")) if enabled else None
            self.jsonl = open(self.run_dir / "metrics.jsonl", "a")

    def advice(self) -> str:
        last = self.run_dir / "checkpoints" / "last.pt"
        kept = f"the last good checkpoint is kept at {last}" if last.exists() else "no checkpoint was written yet"
        return f"{kept}; free space or make the directory writable, then resume with trainer.resume=true"

    def scalars(self, step: int, metrics: dict[str, float]) -> None:
        with writing(self.run_dir / "tb", "TensorBoard's log", self.advice):
            if self.writer is not None:
                for tag, value in metrics.items():
                    self.writer.add_scalar(tag, value, step)
        with writing(self.run_dir / "metrics.jsonl", "the metrics log", self.advice):
            self.jsonl.write(json.dumps({"step": step, **{k: round(v, 6) for k, v in metrics.items()}}) + "\n")
            self.jsonl.flush()

    def image_grid(self, tag: str, images: torch.Tensor, step: int, image_shape: tuple[int, ...]) -> None:
        """``images`` [n, prod(image_shape)] in [0, 1], shown as one grid of 8 columns (``tile``)."""
        if self.writer is None:
            return
        with writing(self.run_dir / "tb", "TensorBoard's log", self.advice):
            self.writer.add_image(tag, tile(images.detach().float().cpu().reshape(-1, *image_shape)), step)

    def close(self) -> None:
        """Flush and close; a refused write is raised only when no other error is on its way out."""
        failing = sys.exc_info()[0] is not None
        try:
            with writing(self.run_dir, "the run's logs in", self.advice):
                if self.writer is not None:
                    self.writer.close()
                self.jsonl.close()
        except Exception:
            if not failing:
                raise


@contextmanager
def storage_faults_reported():
    """While the block runs, a refused write on TensorBoard's writer thread is not printed as a thread's traceback
    (``threading.excepthook``): the writer raises it again at its next call, where it becomes one line."""
    previous = threading.excepthook

    def hook(args) -> None:
        if not is_write_failure(args.exc_value):
            previous(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        threading.excepthook = previous


class RunLogFile(logging.FileHandler):
    """The run's ``train.log`` (Hydra's job logging, configs/hydra/job_logging/nvil.yaml): a write the storage
    refuses is one warning line on stderr, once, and the run goes on (its checkpoint writes report their own)."""

    warned = False

    def handleError(self, record: logging.LogRecord) -> None:
        e = sys.exc_info()[1]
        if not is_write_failure(e):
            return super().handleError(record)
        if not self.warned:
            self.warned = True
            print(f"warning: {describe_write_failure(e, self.baseFilename, 'the run log')}", file=sys.stderr)


def log_hparams(run_dir: Path, config: dict, metrics: dict) -> None:
    """The run's resolved ``config`` (flattened: ``learner.lr``, ``model.layers``) as its hyperparameters, and its
    final scores as the metrics of TensorBoard's hparams view: written into ``tb/`` itself, the run the training
    scalars are in (not a subdirectory of its own, as ``SummaryWriter.add_hparams`` would make), at the last step.
    A write the storage refuses is a ``StorageError`` naming the directory."""
    scores = final_scores(metrics)
    tb = Path(run_dir) / "tb"
    with storage_faults_reported(), writing(tb, "TensorBoard's hparams log"):
        writer = SummaryWriter(str(tb))
        try:
            for summary in hparams(flatten(config), scores):
                writer.file_writer.add_summary(summary, metrics.get("step"))
            for tag, value in scores.items():
                writer.add_scalar(tag, value, metrics.get("step"))
        finally:
            writer.close()


def final_scores(metrics: dict) -> dict[str, float]:
    """``eval/<estimator>/mean_log_p`` and ``/stderr`` (``/error_rate`` for classify) of each final estimator, and
    the best validation score under the loop's own tag (``val/elbo_best``): those that are finite numbers."""
    out = {}
    for key in ("final_eval", "final_eval_then"):
        line = metrics.get(key) or {}
        for name in ("mean_log_p", "stderr", "error_rate"):
            out[f"eval/{line.get('estimator')}/{name}"] = line.get(name)
    if metrics.get("val/tag"):
        out[f"{metrics['val/tag']}_best"] = metrics.get("val/best")
    return {k: float(v) for k, v in out.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def flatten(config: dict, prefix: str = "") -> dict:
    """Dotted keys to the values TensorBoard's hparams take (numbers, strings): booleans, null and lists as a
    command line writes them (``true``, ``null``, ``[200, 200]``); torch would log a boolean as the number 1."""
    out = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, (int, float, str)) and not isinstance(value, bool):
            out[name] = value
        else:
            out[name] = json.dumps(value)
    return out


class NullLogger:
    """What ranks other than 0 log under data parallelism: nothing."""

    def scalars(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def image_grid(self, tag: str, images: torch.Tensor, step: int, image_shape: tuple[int, ...]) -> None:
        pass

    def close(self) -> None:
        pass


def tile(images: torch.Tensor, nrow: int = 8, padding: int = 2) -> torch.Tensor:
    """[n, C, H, W] -> one [3, rows (H + padding) + padding, cols (W + padding) + padding] image on a black
    background, row-major (one image: itself): what ``torchvision.utils.make_grid(images, nrow, padding)`` draws (a one-channel
    image repeated to three), without importing torchvision (seconds at start-up)."""
    n, c, height, width = images.shape
    if c == 1:
        images = images.expand(n, 3, height, width)
    if n == 1:  # make_grid returns a single image unpadded
        return images[0].clone()
    cols = min(nrow, n)
    rows = -(-n // cols)
    grid = images.new_zeros(3, rows * (height + padding) + padding, cols * (width + padding) + padding)
    for k in range(n):
        y, x = divmod(k, cols)
        top, left = y * (height + padding) + padding, x * (width + padding) + padding
        grid[:, top:top + height, left:left + width] = images[k]
    return grid
