"""What the figure scripts (bench/figure_*.py) share: matplotlib without a screen, the PNGs' resolution, and the
command line that draws a script's figures into docs/figures."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402,F401  (the scripts draw with it)

ROOT = Path(__file__).resolve().parent.parent
DPI = 100


def draw_all(doc: str, figures: dict[str, Callable[[Path], None]]) -> None:
    """``python bench/figure_X.py [--out DIR]``: each ``draw(path)`` of ``figures`` (file name -> function) writes
    its PNG into DIR (default docs/figures); the sizes are printed."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "docs" / "figures"), help="folder of the PNGs (default docs/figures)")
    out = Path(p.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    for name, draw in figures.items():
        draw(out / name)
        print(f"{out / name}: {(out / name).stat().st_size // 1024} KB")
