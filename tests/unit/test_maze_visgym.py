"""Frames drawn as VisGym's maze_2d draws them (pygame): the agent disc, pixel for pixel.

The masks below were drawn with pygame 2.6.1, exactly as VisGym's ``_render_frame`` calls
it: ``pygame.draw.circle(canvas, (0, 0, 255), (cell + 0.5) * px, px / 4)`` on a white
canvas, cropped to the agent's cell. (pygame is not a dependency of rlfleet; the masks
are the record of what it drew.)
"""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.maze import generate_layout
from rlfleet.maze.render import AGENT_RGB, FLOOR_RGB, TARGET_RGB, render_rgb

PYGAME_DISCS = {
    8: (
        "........",
        "........",
        "...##...",
        "..####..",
        "..####..",
        "...##...",
        "........",
        "........",
    ),
    13: (
        ".............",
        ".............",
        ".............",
        ".....##......",
        "....####.....",
        "...######....",
        "...######....",
        "....####.....",
        ".....##......",
        ".............",
        ".............",
        ".............",
        ".............",
    ),
    16: (
        "................",
        "................",
        "................",
        "................",
        ".......##.......",
        ".....######.....",
        ".....######.....",
        "....########....",
        "....########....",
        ".....######.....",
        ".....######.....",
        ".......##.......",
        "................",
        "................",
        "................",
        "................",
    ),
    25: (
        ".........................",
        ".........................",
        ".........................",
        ".........................",
        ".........................",
        ".........................",
        "..........####...........",
        ".........######..........",
        "........########.........",
        ".......##########........",
        "......############.......",
        "......############.......",
        "......############.......",
        "......############.......",
        ".......##########........",
        "........########.........",
        ".........######..........",
        "..........####...........",
        ".........................",
        ".........................",
        ".........................",
        ".........................",
        ".........................",
        ".........................",
        ".........................",
    ),

}


@pytest.mark.parametrize("px", sorted(PYGAME_DISCS))
def test_the_agent_disc_is_pygames(px: int) -> None:
    layout = generate_layout(0, 9)
    frame = render_rgb(layout, layout.agent, px)
    row, col = layout.agent
    cell = frame[row * px:(row + 1) * px, col * px:(col + 1) * px]
    want = np.array([[ch == "#" for ch in line] for line in PYGAME_DISCS[px]])
    assert ((cell == AGENT_RGB).all(-1) == want).all()
    assert ((cell == FLOOR_RGB).all(-1) == ~want).all()  # the start cell is floor


def test_visgym_default_size_disc_is_104_pixels_offset_up_and_left() -> None:
    want = np.array([[ch == "#" for ch in line] for line in PYGAME_DISCS[25]])
    assert want.sum() == 104
    rows, cols = np.nonzero(want)
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (6, 17, 6, 17)


def test_the_agent_is_drawn_over_the_target() -> None:
    layout = generate_layout(3, 7)
    frame = render_rgb(layout, layout.target, 16)
    row, col = layout.target
    cell = frame[row * 16:(row + 1) * 16, col * 16:(col + 1) * 16]
    want = np.array([[ch == "#" for ch in line] for line in PYGAME_DISCS[16]])
    assert ((cell == AGENT_RGB).all(-1) == want).all()
    assert ((cell == TARGET_RGB).all(-1) == ~want).all()


def test_known_difference_visgym_leaves_a_hole_in_the_target_after_the_agent_leaves() -> None:
    """A known difference, left as it is (a trained checkpoint depends on rlfleet's frames).

    VisGym's ``_render_frame`` keeps one canvas per episode and, on each frame after a
    move, paints a *white* disc where the agent was before the move (the same disc shape,
    ``pygame.draw.circle(canvas, (255, 255, 255), prev_cell_centre, px / 4)``) before it
    draws the blue one; the target square is drawn only once, when the canvas is made. So
    after the agent steps off the red target, VisGym shows a white disc-shaped hole in it
    until the agent comes back. (Also: ``reset()`` returns an observation drawn before it
    drops the previous episode's canvas; VisGym's harness re-renders, so it sees a fresh
    frame.) rlfleet draws every frame from (layout, agent) alone: a frame is a pure
    function of the state (the frame cache relies on it), and the target square is always
    whole when the agent is elsewhere.
    """
    layout = generate_layout(3, 7)
    row, col = layout.target
    beside = next(
        (row + dr, col + dc) for dr, dc in ((0, 1), (-1, 0), (0, -1), (1, 0))
        if layout.is_floor((row + dr, col + dc))
    )
    frame = render_rgb(layout, beside, 16)
    cell = frame[row * 16:(row + 1) * 16, col * 16:(col + 1) * 16]
    assert (cell == TARGET_RGB).all()  # VisGym: PYGAME_DISCS[16] would be white here
