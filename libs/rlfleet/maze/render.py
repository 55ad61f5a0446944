"""Draw a maze state as an RGB picture with VisGym's colours and geometry.

VisGym (pygame) paints each cell `cell_px` square (25 by default, so 225×225 for 9×9):
floor white, walls gray (169,169,169), the target as a full red cell, and the agent as a
blue disc of radius cell_px/4 centred in its cell, drawn over the target when they share
a cell. Here the disc is the set of pixels whose centres lie within the radius, which
matches pygame's shape up to anti-aliasing-free edge pixels. A small `cell_px` (e.g. 16,
one image token per cell for the tiny model) keeps the same layout.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from PIL import Image

from rlfleet.maze.layout import Layout, Position
from rlfleet.maze.png import encode_png_rgb

FLOOR_RGB = (255, 255, 255)
WALL_RGB = (169, 169, 169)
TARGET_RGB = (255, 0, 0)
AGENT_RGB = (0, 0, 255)

DEFAULT_CELL_PX = 25
MIN_CELL_PX = 1
MAX_CELL_PX = 64


def check_cell_px(cell_px: object) -> int:
    """Return `cell_px` as an int if it is in [MIN_CELL_PX, MAX_CELL_PX]."""
    if isinstance(cell_px, bool) or not isinstance(cell_px, (int, np.integer)):
        raise ValueError(f"cell_px must be an integer, got {type(cell_px).__name__}")
    if not MIN_CELL_PX <= int(cell_px) <= MAX_CELL_PX:
        raise ValueError(f"cell_px must be between {MIN_CELL_PX} and {MAX_CELL_PX}, got {cell_px}")
    return int(cell_px)


@lru_cache(maxsize=64)
def _disc_mask(cell_px: int) -> np.ndarray:
    # Pixel centres at i+0.5; disc centre at cell_px/2; radius cell_px/4 (6.25 px at 25).
    centres = np.arange(cell_px) + 0.5 - cell_px / 2
    dist2 = centres[:, None] ** 2 + centres[None, :] ** 2
    mask = dist2 <= (cell_px / 4) ** 2
    mask.setflags(write=False)
    return mask


@lru_cache(maxsize=256)
def _background(layout: Layout, cell_px: int) -> np.ndarray:
    # Walls and target never change during an episode: draw them once per layout and size.
    palette = np.array([FLOOR_RGB, WALL_RGB], dtype=np.uint8)
    cells = palette[layout.walls]
    cells[layout.target] = TARGET_RGB
    image = np.repeat(np.repeat(cells, cell_px, axis=0), cell_px, axis=1)
    image.setflags(write=False)
    return image


def render_rgb(
    layout: Layout, agent: Position | None = None, cell_px: int = DEFAULT_CELL_PX
) -> np.ndarray:
    """An (H*cell_px, W*cell_px, 3) uint8 array; `agent` defaults to the layout's start."""
    cell_px = check_cell_px(cell_px)
    row, col = layout.agent if agent is None else agent
    if not layout.is_floor((row, col)):
        raise ValueError(f"agent {(row, col)} is not on a floor cell")
    image = _background(layout, cell_px).copy()
    block = image[row * cell_px : (row + 1) * cell_px, col * cell_px : (col + 1) * cell_px]
    block[_disc_mask(cell_px)] = AGENT_RGB
    return image


def render_image(
    layout: Layout, agent: Position | None = None, cell_px: int = DEFAULT_CELL_PX
) -> Image.Image:
    """The picture as a PIL RGB image (what chat processors take)."""
    # An (H, W, 3) uint8 array is RGB to Pillow; passing mode= is deprecated there.
    return Image.fromarray(render_rgb(layout, agent, cell_px))


def render_png(
    layout: Layout, agent: Position | None = None, cell_px: int = DEFAULT_CELL_PX
) -> bytes:
    """The picture as PNG bytes that are identical for identical states in every process."""
    return encode_png_rgb(render_rgb(layout, agent, cell_px))
