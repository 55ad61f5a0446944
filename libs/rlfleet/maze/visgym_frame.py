"""Frames as VisGym's harness sends them: its pygame picture, JPEG-encoded.

Two things differ from rlfleet's own frames (`rlfleet.maze.render`):

- **The white disc.** VisGym keeps one canvas per episode and, on every frame after a
  move, paints a white disc (the agent's disc shape) on the cell the agent left, before
  it draws the blue one. The target square is painted only when the canvas is made, so
  once the agent has stepped off the target a white disc stays in the red square for the
  rest of the episode (a blue disc of the same shape covers it while the agent is back
  on the target). On floor cells the white disc is invisible. A frame is therefore a
  pure function of (layout, agent, whether the agent has left the target), and is
  cached on that key.
- **JPEG.** ``Interactor._image_to_b64`` saves the frame with Pillow as JPEG without a
  quality (Pillow's default, 75) and resizes only frames longer than 336 px (LANCZOS);
  a 9x9 (225 px) or 11x11 (275 px) maze is sent at its own size. The bytes are Pillow's
  for that call, so they are equal wherever the same Pillow runs.
"""

from __future__ import annotations

import hashlib
import io

import numpy as np
from PIL import Image

from rlfleet.maze.layout import Layout, Position
from rlfleet.maze.render import (
    FLOOR_RGB,
    BoundedLRU,
    Frame,
    _disc_mask,
    render_rgb,
)
from rlfleet.maze.visgym import VISGYM_CELL_PX

JPEG_MEDIA_TYPE = "image/jpeg"
# `Interactor(max_long_side=...)` as run_inference.py sets it by default.
MAX_LONG_SIDE = 336
# 9x9 at 25 px is about 4 KiB of JPEG; 32 MiB holds every state of thousands of mazes.
VISGYM_CACHE_MAX_BYTES = 32 * 2**20
_ENTRY_OVERHEAD_BYTES = 768

VISGYM_FRAMES: BoundedLRU[tuple[Layout, Position, int, bool], Frame] = BoundedLRU(
    VISGYM_CACHE_MAX_BYTES)


def render_visgym_rgb(layout: Layout, agent: Position, left_target: bool,
                      cell_px: int = VISGYM_CELL_PX) -> np.ndarray:
    """The (H, W, 3) picture VisGym's canvas holds with the agent at ``agent``, after the
    agent has (``left_target``) or has not stepped off the target during the episode."""
    image = render_rgb(layout, agent, cell_px)
    if left_target and tuple(agent) != tuple(layout.target):
        row, col = layout.target
        block = image[row * cell_px:(row + 1) * cell_px, col * cell_px:(col + 1) * cell_px]
        block[_disc_mask(cell_px)] = FLOOR_RGB
    return image


def encode_jpeg(pixels: np.ndarray) -> bytes:
    """``pixels`` as VisGym's harness encodes a frame: resized (LANCZOS) only above
    `MAX_LONG_SIDE`, then Pillow's JPEG at its default quality."""
    image = Image.fromarray(pixels)
    width, height = image.size
    longest = max(width, height)
    if longest > MAX_LONG_SIDE:
        scale = MAX_LONG_SIDE / longest
        image = image.resize((int(width * scale), int(height * scale)),
                             Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    image.save(buf, format="JPEG")  # no quality given, as VisGym: Pillow's default (75)
    return buf.getvalue()


def visgym_frame(layout: Layout, agent: Position, left_target: bool,
                 cell_px: int = VISGYM_CELL_PX) -> Frame:
    """The JPEG frame of a state (encoded once per state, then from the cache)."""
    agent = (int(agent[0]), int(agent[1]))
    hole = bool(left_target) and agent != tuple(layout.target)
    key = (layout, agent, cell_px, hole)
    frame = VISGYM_FRAMES.get(key)
    if frame is not None:
        return frame
    pixels = render_visgym_rgb(layout, agent, hole, cell_px)
    data = encode_jpeg(pixels)
    with Image.open(io.BytesIO(data)) as img:
        width, height = img.size
    frame = Frame(data, hashlib.sha256(data).hexdigest(), width, height, JPEG_MEDIA_TYPE)
    return VISGYM_FRAMES.put(key, frame, len(data) + _ENTRY_OVERHEAD_BYTES)
