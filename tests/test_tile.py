"""``nvil.app.logging.tile`` draws the TensorBoard image grids without importing torchvision at start-up; it must
draw exactly what ``torchvision.utils.make_grid`` draws."""

from __future__ import annotations

import pytest
import torch
from torchvision.utils import make_grid

from nvil.app.logging import tile


@pytest.mark.parametrize("n", [1, 5, 8, 9, 64])
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 5, 7)])
def test_tile_draws_what_make_grid_draws(n, shape):
    images = torch.rand(n, *shape, generator=torch.Generator().manual_seed(n))
    assert torch.equal(tile(images), make_grid(images, nrow=8, padding=2))


def test_the_comparison_has_power():
    """A grid whose images are out of order, or transposed, is told apart."""
    images = torch.rand(9, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    reference = make_grid(images, nrow=8, padding=2)
    assert not torch.equal(tile(images.flip(0)), reference)
    assert not torch.equal(tile(images.transpose(2, 3)), reference)
