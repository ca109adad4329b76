"""Run logging: TensorBoard scalars and image grids under ``tb/``, and one JSON line per event in
``metrics.jsonl``. Tags are namespaced by what they measure: ``train/``, ``val/``, ``nvil/``,
``grad_norm/``, ``samples/``."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.utils.tensorboard import SummaryWriter


class RunLogger:
    def __init__(self, run_dir: Path, enabled: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.writer = SummaryWriter(str(self.run_dir / "tb")) if enabled else None
        self.jsonl = open(self.run_dir / "metrics.jsonl", "a")

    def scalars(self, step: int, metrics: dict[str, float]) -> None:
        if self.writer is not None:
            for tag, value in metrics.items():
                self.writer.add_scalar(tag, value, step)
        self.jsonl.write(json.dumps({"step": step, **{k: round(v, 6) for k, v in metrics.items()}}) + "\n")
        self.jsonl.flush()

    def image_grid(self, tag: str, images: torch.Tensor, step: int, image_shape: tuple[int, ...]) -> None:
        """``images`` [n, prod(image_shape)] in [0, 1], shown as one grid of 8 columns (``tile``)."""
        if self.writer is None:
            return
        self.writer.add_image(tag, tile(images.detach().float().cpu().reshape(-1, *image_shape)), step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.jsonl.close()


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
    image repeated to three), without importing torchvision (2.5 s at start-up)."""
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
