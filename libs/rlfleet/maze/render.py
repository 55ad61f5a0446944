"""Draw a maze state as an RGB picture with VisGym's colours and geometry.

VisGym (pygame) paints each cell `cell_px` square (25 by default, so 225×225 for 9×9):
floor white, walls gray (169,169,169), the target as a full red cell, and the agent as a
blue disc drawn over the target when they share a cell. The disc is pygame's
``draw.circle`` shape for the centre and radius VisGym passes (``(cell + 0.5) * px`` and
``px / 4``, which pygame truncates to integers): the midpoint-circle scanlines of that
integer circle, so at 25 px a 12x12 disc of 104 pixels, centred on the pixel corner up
and left of the cell's middle. `tests/unit/test_maze_visgym.py` pins it against masks
pygame drew. A small `cell_px` (e.g. 16, one image token per cell for the tiny model)
keeps the same layout.

A frame is a pure function of (layout, agent position, cell_px): walls and target never
change within an episode. `render_frame` (and `render_png`, and `MazeEpisode.observe`)
therefore render and PNG-encode each distinct state once and keep the PNG, with its
sha256, in a bounded LRU (`FRAME_CACHE`); zlib is almost all the cost of a frame, and an
episode revisits states all the time (wall bumps, back-and-forth moves, the G episodes of
a GRPO group on one maze). `encode_frame` always renders afresh.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Generic, TypeVar

import numpy as np
from PIL import Image

from rlfleet.maze.layout import Layout, Position
from rlfleet.maze.png import encode_png_rows

FLOOR_RGB = (255, 255, 255)
WALL_RGB = (169, 169, 169)
TARGET_RGB = (255, 0, 0)
AGENT_RGB = (0, 0, 255)

DEFAULT_CELL_PX = 25
MIN_CELL_PX = 1
MAX_CELL_PX = 64

# Memory bounds of the two caches below, 64 MiB together. A 9×9 frame at 25 px is about
# 1 KiB of PNG, so 48 MiB holds tens of thousands of states: every state of thousands of
# mazes, far more than the episodes a service has open at once (each 9×9 maze has 31
# floor cells), while a long-running service still cannot grow without bound.
FRAME_CACHE_MAX_BYTES = 48 * 2**20
# Unencoded backgrounds (152 KiB for 9×9 at 25 px) are only needed to encode a new state,
# and rebuilding one costs a few percent of encoding it, so fewer of them are kept.
BACKGROUND_CACHE_MAX_BYTES = 16 * 2**20
# What an entry costs beside its payload: the Frame, its sha256 string, the key and value
# tuples, the LRU's own bookkeeping and a share of the Layout the key keeps alive (about
# 450 bytes measured with sys.getsizeof, plus ~600 per layout; rounded up).
_ENTRY_OVERHEAD_BYTES = 768


def check_cell_px(cell_px: object) -> int:
    """Return `cell_px` as an int if it is in [MIN_CELL_PX, MAX_CELL_PX]."""
    if isinstance(cell_px, bool) or not isinstance(cell_px, (int, np.integer)):
        raise ValueError(f"cell_px must be an integer, got {type(cell_px).__name__}")
    if not MIN_CELL_PX <= int(cell_px) <= MAX_CELL_PX:
        raise ValueError(f"cell_px must be between {MIN_CELL_PX} and {MAX_CELL_PX}, got {cell_px}")
    return int(cell_px)


@dataclass(frozen=True, slots=True)
class Frame:
    """One encoded observation: its bytes (PNG, or what `media_type` says: the visgym
    profile's are JPEG), their sha256 (hex) and the size in pixels."""

    png: bytes
    sha256: str
    width: int
    height: int
    media_type: str = "image/png"


@dataclass(frozen=True)
class CacheInfo:
    hits: int
    misses: int
    evictions: int
    entries: int
    bytes: int
    max_bytes: int

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedLRU(Generic[K, V]):
    """A thread-safe LRU bounded by the bytes its entries say they cost."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0

    def get(self, key: K) -> V | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return item[0]

    def put(self, key: K, value: V, nbytes: int) -> V:
        """Store `value` (unless it alone exceeds the bound); returns the stored value,
        which is an equal one already there when another thread got in first."""
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                return item[0]
            if nbytes > self.max_bytes:
                return value
            self._items[key] = (value, nbytes)
            self._bytes += nbytes
            while self._bytes > self.max_bytes:
                _, (_, old) = self._items.popitem(last=False)
                self._bytes -= old
                self.evictions += 1
            return value

    def info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(self.hits, self.misses, self.evictions, len(self._items),
                             self._bytes, self.max_bytes)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0
            self.hits = self.misses = self.evictions = 0

    def __len__(self) -> int:
        return len(self._items)


class FrameCache(BoundedLRU[tuple[Layout, Position, int], Frame]):
    """Encoded frames keyed by (layout, agent, cell_px)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes)
        # States being encoded right now: a second request for one waits for that encoding
        # instead of starting another.
        self._pending: dict[tuple[Layout, Position, int], Future[Frame]] = {}

    def frame(self, layout: Layout, agent: Position | None, cell_px: int) -> Frame:
        return self.submit(((layout, agent, cell_px),), inline=True)()[0]

    def frames(self, states: Sequence[tuple[Layout, Position | None, int]]) -> list[Frame]:
        """The frames of many states, in order (see `submit`)."""
        return self.submit(states, inline=len(states) == 1)()

    def submit(
        self, states: Sequence[tuple[Layout, Position | None, int]], *, inline: bool = False
    ) -> Callable[[], list[Frame]]:
        """Looks the states up now and starts encoding the new ones on `encode_pool()`
        threads (zlib releases the GIL, so they run beside the caller); returns what to
        call for the frames, in order. Each new state is encoded once, however often it
        appears here or in concurrent calls. `inline` encodes in the calling thread."""
        keys = []
        for layout, agent, cell_px in states:
            row, col = layout.agent if agent is None else agent
            keys.append((layout, (row, col), check_cell_px(cell_px)))
        out: list[Frame | Future[Frame]] = []
        new: list[tuple[tuple[Layout, Position, int], Future[Frame]]] = []
        with self._lock:
            items, move, pending = self._items, self._items.move_to_end, self._pending
            for key in keys:
                item = items.get(key)
                if item is not None:
                    move(key)
                    out.append(item[0])
                    continue
                future = pending.get(key)
                if future is None:
                    future = pending[key] = Future()
                    new.append((key, future))
                out.append(future)
            # A miss is a frame encoded; a state already on its way counts as a hit.
            self.misses += len(new)
            self.hits += len(keys) - len(new)
        if inline or ENCODE_THREADS == 1:
            for key, future in new:
                self._encode(key, future)
        else:
            pool = encode_pool()
            for key, future in new:
                pool.submit(self._encode, key, future)

        def collect() -> list[Frame]:
            return [f.result() if isinstance(f, Future) else f for f in out]

        return collect

    def _encode(self, key: tuple[Layout, Position, int], future: Future[Frame]) -> None:
        try:
            frame = encode_frame(*key)
        except BaseException as exc:
            with self._lock:
                self._pending.pop(key, None)
            future.set_exception(exc)
            return
        self.put(key, frame, len(frame.png) + _ENTRY_OVERHEAD_BYTES)
        with self._lock:
            self._pending.pop(key, None)
        future.set_result(frame)


# Threads that encode the new frames of one batch side by side; a few are plenty (zlib is
# the work, and the env service steps many batches at once anyway).
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
ENCODE_THREADS = max(1, min(8, _CPUS or 1))
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def encode_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(ENCODE_THREADS, thread_name_prefix="frame-encode")
        return _pool


FRAME_CACHE = FrameCache(FRAME_CACHE_MAX_BYTES)
_BACKGROUNDS: BoundedLRU[tuple[Layout, int], np.ndarray] = BoundedLRU(BACKGROUND_CACHE_MAX_BYTES)


def _after_fork_in_child() -> None:
    # A forked child has none of the parent's threads: a pool inherited from the parent
    # would accept work and never run it, and a lock some other thread held stays held.
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()
    FRAME_CACHE._lock = threading.Lock()
    FRAME_CACHE._pending = {}  # encodings the parent's threads were doing never finish here
    _BACKGROUNDS._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


@lru_cache(maxsize=64)
def _disc_mask(cell_px: int) -> np.ndarray:
    """The agent's pixels within its cell, as pygame fills a circle of integer centre
    ``c = int(cell_px / 2)`` and radius ``r = int(cell_px / 4)``: midpoint-circle steps,
    each filling the half-open spans [c - a, c + a) on the rows c - b and c + b - 1."""
    mask = np.zeros((cell_px, cell_px), dtype=bool)
    c, r = cell_px // 2, cell_px // 4
    x, y, err = 0, r, 1 - r
    while x < y:
        if err >= 0:
            y -= 1
            err += 2 * (x - y) + 3  # the midpoint fell outside: step inwards
        else:
            err += 2 * x + 3
        x += 1
        for half, rows in ((x, (c + y - 1, c - y)), (y, (c + x - 1, c - x))):
            for row in rows:
                if 0 <= row < cell_px:
                    mask[row, max(c - half, 0):min(c + half, cell_px)] = True
    mask.setflags(write=False)
    return mask


def _background_rows(layout: Layout, cell_px: int) -> np.ndarray:
    """Walls and target (they never change during an episode) as PNG scanlines: an
    (H*cell_px, 1 + 3*W*cell_px) uint8 array whose first column is filter type 0."""
    key = (layout, cell_px)
    rows = _BACKGROUNDS.get(key)
    if rows is None:
        palette = np.array([FLOOR_RGB, WALL_RGB], dtype=np.uint8)
        cells = palette[layout.walls]
        cells[layout.target] = TARGET_RGB
        # One scanline per row of cells (filter byte, then each cell cell_px times), then
        # each scanline cell_px times.
        lines = np.zeros((layout.height, 1 + 3 * layout.width * cell_px), dtype=np.uint8)
        lines[:, 1:] = np.repeat(cells, cell_px, axis=1).reshape(layout.height, -1)
        rows = np.repeat(lines, cell_px, axis=0)
        rows.setflags(write=False)
        rows = _BACKGROUNDS.put(key, rows, rows.nbytes + _ENTRY_OVERHEAD_BYTES)
    return rows


def _pixels(rows: np.ndarray) -> np.ndarray:
    """The (H, W, 3) RGB view of PNG scanlines (no copy)."""
    return rows[:, 1:].reshape(rows.shape[0], (rows.shape[1] - 1) // 3, 3)


def _agent_position(layout: Layout, agent: Position | None) -> Position:
    row, col = layout.agent if agent is None else agent
    if not layout.is_floor((row, col)):
        raise ValueError(f"agent {(row, col)} is not on a floor cell")
    return row, col


def _paint_agent(pixels: np.ndarray, agent: Position, cell_px: int) -> None:
    row, col = agent
    block = pixels[row * cell_px : (row + 1) * cell_px, col * cell_px : (col + 1) * cell_px]
    block[_disc_mask(cell_px)] = AGENT_RGB


def render_rgb(
    layout: Layout, agent: Position | None = None, cell_px: int = DEFAULT_CELL_PX
) -> np.ndarray:
    """An (H*cell_px, W*cell_px, 3) uint8 array; `agent` defaults to the layout's start."""
    cell_px = check_cell_px(cell_px)
    agent = _agent_position(layout, agent)
    image = _pixels(_background_rows(layout, cell_px)).copy()
    _paint_agent(image, agent, cell_px)
    return image


def render_image(
    layout: Layout, agent: Position | None = None, cell_px: int = DEFAULT_CELL_PX
) -> Image.Image:
    """The picture as a PIL RGB image (what chat processors take)."""
    # An (H, W, 3) uint8 array is RGB to Pillow; passing mode= is deprecated there.
    return Image.fromarray(render_rgb(layout, agent, cell_px))


def encode_frame(
    layout: Layout, agent: Position | None = None, cell_px: int = DEFAULT_CELL_PX
) -> Frame:
    """Render and encode afresh (no frame cache): the bytes `encode_png_rgb(render_rgb(...))`
    gives, without its copies."""
    cell_px = check_cell_px(cell_px)
    agent = _agent_position(layout, agent)
    rows = _background_rows(layout, cell_px).copy()
    _paint_agent(_pixels(rows), agent, cell_px)
    png = encode_png_rows(rows)
    return Frame(png, hashlib.sha256(png).hexdigest(), layout.width * cell_px,
                 layout.height * cell_px)


def render_frame(
    layout: Layout, agent: Position | None = None, cell_px: int = DEFAULT_CELL_PX
) -> Frame:
    """The state's PNG and its sha256, from `FRAME_CACHE` (encoded once per state)."""
    return FRAME_CACHE.frame(layout, agent, cell_px)


def render_frames(states: Sequence[tuple[Layout, Position | None, int]]) -> list[Frame]:
    """`render_frame` for many (layout, agent, cell_px) states at once: new ones are
    encoded in parallel."""
    return FRAME_CACHE.frames(states)


def submit_frames(
    states: Sequence[tuple[Layout, Position | None, int]], *, inline: bool = False
) -> Callable[[], list[Frame]]:
    """Starts `render_frames` for `states` in the background; call the result for them
    (see `FrameCache.submit`)."""
    return FRAME_CACHE.submit(states, inline=inline)


def render_png(
    layout: Layout, agent: Position | None = None, cell_px: int = DEFAULT_CELL_PX
) -> bytes:
    """The picture as PNG bytes that are identical for identical states in every process."""
    return render_frame(layout, agent, cell_px).png
