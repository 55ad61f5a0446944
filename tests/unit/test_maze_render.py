"""Rendering: geometry, VisGym colours at known pixels, deterministic PNG bytes."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from rlfleet.maze import generate_layout, render_image, render_png, render_rgb
from rlfleet.maze.render import AGENT_RGB, FLOOR_RGB, TARGET_RGB, WALL_RGB


def _px(image: np.ndarray, row: int, col: int) -> tuple[int, ...]:
    return tuple(int(v) for v in image[row, col])


def test_default_size_and_colours() -> None:
    layout = generate_layout(0, 9)  # agent (7,1), target (1,7); see test_maze_generate
    image = render_rgb(layout)
    assert image.shape == (225, 225, 3) and image.dtype == np.uint8
    assert _px(image, 0, 0) == WALL_RGB == (169, 169, 169)
    # Target: the whole cell is red, corners included.
    tr, tc = layout.target
    assert _px(image, tr * 25, tc * 25) == TARGET_RGB == (255, 0, 0)
    assert _px(image, tr * 25 + 24, tc * 25 + 24) == TARGET_RGB
    # Agent: pygame's disc of radius int(6.25) = 6 about the pixel corner (12, 12) of its
    # cell (tests/unit/test_maze_visgym.py has it pixel by pixel); the corner stays floor.
    ar, ac = layout.agent
    cy, cx = ar * 25 + 12, ac * 25 + 12
    assert _px(image, cy, cx) == AGENT_RGB == (0, 0, 255)
    assert _px(image, cy, cx + 5) == AGENT_RGB  # the disc spans columns 6..17
    assert _px(image, cy, cx + 6) == FLOOR_RGB
    assert _px(image, cy, cx - 6) == AGENT_RGB
    assert _px(image, ar * 25, ac * 25) == FLOOR_RGB == (255, 255, 255)
    blue = np.all(image == AGENT_RGB, axis=-1).sum()
    assert blue == 104


def test_only_palette_colours_used() -> None:
    image = render_rgb(generate_layout(3, 11), cell_px=16)
    colours = {tuple(c) for c in image.reshape(-1, 3).tolist()}
    assert colours <= {FLOOR_RGB, WALL_RGB, TARGET_RGB, AGENT_RGB}
    assert image.shape == (176, 176, 3)


def test_agent_position_override_and_on_target() -> None:
    layout = generate_layout(0, 9)
    tr, tc = layout.target
    image = render_rgb(layout, agent=layout.target, cell_px=16)
    assert _px(image, tr * 16 + 8, tc * 16 + 8) == AGENT_RGB  # agent drawn over target
    assert _px(image, tr * 16, tc * 16) == TARGET_RGB
    ar, ac = layout.agent
    assert _px(image, ar * 16 + 8, ac * 16 + 8) == FLOOR_RGB  # start cell now empty


def test_tiny_cells_hide_the_agent_as_pygame_does() -> None:
    # VisGym's radius px / 4 truncates to 0 below 4 px: pygame then draws no disc
    layout = generate_layout(2, 9)
    image = render_rgb(layout, cell_px=1)
    assert image.shape == (9, 9, 3)
    assert _px(image, *layout.agent) == FLOOR_RGB
    assert _px(image, *layout.target) == TARGET_RGB
    assert _px(render_rgb(layout, cell_px=4), layout.agent[0] * 4 + 1,
               layout.agent[1] * 4 + 1) == AGENT_RGB


def test_png_is_deterministic_and_decodes_to_the_pixels() -> None:
    layout = generate_layout(5, 9)
    first = render_png(layout)
    assert first == render_png(layout)
    assert first.startswith(b"\x89PNG\r\n\x1a\n")
    decoded = np.asarray(Image.open(io.BytesIO(first)).convert("RGB"))
    assert np.array_equal(decoded, render_rgb(layout))
    # No ancillary chunks (time, text) that could vary between runs.
    assert b"tIME" not in first and b"tEXt" not in first
    assert render_png(layout, agent=(1, 3) if layout.is_floor((1, 3)) else None) != b""


def test_pil_image() -> None:
    image = render_image(generate_layout(1, 9), cell_px=8)
    assert image.mode == "RGB" and image.size == (72, 72)


@pytest.mark.parametrize("cell_px", [0, 65, -1, 2.5, "25", True])
def test_bad_cell_px_rejected(cell_px: object) -> None:
    with pytest.raises(ValueError, match="cell_px"):
        render_rgb(generate_layout(0, 9), cell_px=cell_px)  # type: ignore[arg-type]


def test_agent_on_wall_rejected() -> None:
    with pytest.raises(ValueError, match="floor"):
        render_rgb(generate_layout(0, 9), agent=(0, 0))
