"""The static description of one maze: its wall map and where the agent and target start.

A `Layout` is what VisGym saves as an episode's initial state (`maze_map`, `agent_location`,
`target_location`) and what the protobuf `MazeLayout` carries (walls as row-major bytes,
1 = wall). Coordinates are (row, col) with (0, 0) the top-left cell, as in VisGym.

Every constructor validates, so a `Layout` that exists is always playable: odd dimensions in
the supported range, an unbroken outer wall, agent and target on floor, target reachable.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# The generator and the renderer are sized for these; larger maps would make observations
# larger than any model here can take, so reject them early with a clear message.
MIN_SIZE = 5
MAX_SIZE = 63

Position = tuple[int, int]

# Unit steps indexed by VisGym's move codes: 0=right, 1=up, 2=left, 3=down.
DIRECTION_DELTAS: tuple[Position, ...] = ((0, 1), (-1, 0), (0, -1), (1, 0))


class LayoutError(ValueError):
    """A wall map, agent or target that does not describe a playable maze."""


def check_dimension(value: Any, what: str = "size") -> int:
    """Return `value` as an int if it is an odd maze dimension in [MIN_SIZE, MAX_SIZE]."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise LayoutError(f"{what} must be an integer, got {type(value).__name__}")
    value = int(value)
    if value < MIN_SIZE or value > MAX_SIZE or value % 2 == 0:
        raise LayoutError(
            f"{what} must be odd and between {MIN_SIZE} and {MAX_SIZE} "
            f"(it counts the outer walls), got {value}"
        )
    return value


def _as_position(value: Any, what: str) -> Position:
    try:
        items = list(value)
    except TypeError:
        raise LayoutError(f"{what} must be a (row, col) pair, got {value!r}") from None
    if len(items) != 2 or any(
        isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in items
    ):
        raise LayoutError(f"{what} must be a (row, col) pair of integers, got {value!r}")
    return int(items[0]), int(items[1])


def _reachable(walls: np.ndarray, start: Position, goal: Position) -> bool:
    height, width = walls.shape
    seen = np.zeros_like(walls, dtype=bool)
    seen[start] = True
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            return True
        for dr, dc in DIRECTION_DELTAS:
            r, c = cell[0] + dr, cell[1] + dc
            if 0 <= r < height and 0 <= c < width and not walls[r, c] and not seen[r, c]:
                seen[r, c] = True
                queue.append((r, c))
    return False


@dataclass(frozen=True, eq=False)
class Layout:
    """An immutable, validated maze: `walls` (uint8, 1 = wall), `agent` and `target` (row, col).

    Build one with `Layout.from_walls`, `Layout.from_bytes`, `Layout.from_init_state` or
    `rlfleet.maze.generate_layout`; direct construction validates too.
    """

    walls: np.ndarray
    agent: Position
    target: Position

    def __post_init__(self) -> None:
        walls = np.asarray(self.walls)
        if walls.ndim != 2:
            raise LayoutError(f"wall map must be 2-D, got shape {walls.shape}")
        height, width = walls.shape
        check_dimension(height, "wall map height")
        check_dimension(width, "wall map width")
        if walls.dtype == bool:
            walls = walls.astype(np.uint8)
        if not np.issubdtype(walls.dtype, np.integer):
            raise LayoutError(f"wall map must hold integers 0/1, got dtype {walls.dtype}")
        if walls.size and (walls.min() < 0 or walls.max() > 1):
            raise LayoutError("wall map must hold only 0 (floor) and 1 (wall)")
        walls = np.ascontiguousarray(walls, dtype=np.uint8)
        border = np.concatenate([walls[0], walls[-1], walls[:, 0], walls[:, -1]])
        if not border.all():
            raise LayoutError("the outer border of the wall map must be all walls")
        agent = _as_position(self.agent, "agent")
        target = _as_position(self.target, "target")
        for what, (r, c) in (("agent", agent), ("target", target)):
            if not (0 <= r < height and 0 <= c < width):
                raise LayoutError(f"{what} {(r, c)} is outside the {height}x{width} map")
            if walls[r, c]:
                raise LayoutError(f"{what} {(r, c)} is on a wall")
        if not _reachable(walls, agent, target):
            raise LayoutError(f"target {target} cannot be reached from agent {agent}")
        # Read-only so that a Layout shared between episodes (and used as a cache key)
        # cannot be changed under them.
        walls.setflags(write=False)
        object.__setattr__(self, "walls", walls)
        object.__setattr__(self, "agent", agent)
        object.__setattr__(self, "target", target)

    # -- identity ---------------------------------------------------------------------------

    @property
    def height(self) -> int:
        return int(self.walls.shape[0])

    @property
    def width(self) -> int:
        return int(self.walls.shape[1])

    @property
    def key(self) -> tuple[int, int, bytes, Position, Position]:
        """A hashable identity: two layouts with equal keys are the same maze instance."""
        return (self.height, self.width, self.walls.tobytes(), self.agent, self.target)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Layout):
            return NotImplemented
        return self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"Layout({self.height}x{self.width}, agent={self.agent}, target={self.target})"

    # -- queries ----------------------------------------------------------------------------

    def is_floor(self, position: Position) -> bool:
        r, c = position
        return 0 <= r < self.height and 0 <= c < self.width and not self.walls[r, c]

    def floor_cells(self) -> list[Position]:
        """All floor cells in row-major order."""
        rows, cols = np.nonzero(self.walls == 0)
        return [(int(r), int(c)) for r, c in zip(rows, cols, strict=True)]

    def to_ascii(self, agent: Position | None = None) -> str:
        """'#' wall, ' ' floor, 'A' agent, 'T' target; handy in logs and test failures."""
        chars = np.where(self.walls == 1, "#", " ").astype("<U1")
        chars[self.target] = "T"
        chars[agent if agent is not None else self.agent] = "A"
        return "\n".join("".join(row) for row in chars)

    # -- constructors and serialisation ----------------------------------------------------

    @classmethod
    def from_walls(
        cls,
        walls: np.ndarray | Sequence[Sequence[int]],
        agent: Iterable[int],
        target: Iterable[int],
    ) -> Layout:
        """Build from an explicit wall map (1 = wall), e.g. one saved by VisGym."""
        try:
            array = np.asarray(walls)
        except (ValueError, TypeError) as exc:
            raise LayoutError(f"wall map is not a rectangular array: {exc}") from None
        if array.dtype == object:
            raise LayoutError("wall map is not a rectangular array of integers")
        return cls(array, tuple(agent), tuple(target))  # type: ignore[arg-type]

    def to_bytes(self) -> bytes:
        """Row-major wall bytes (one byte per cell, 1 = wall), as in protobuf `MazeLayout`."""
        return self.walls.tobytes()

    @classmethod
    def from_bytes(
        cls,
        height: int,
        width: int,
        walls_bytes: bytes,
        agent: Iterable[int],
        target: Iterable[int],
    ) -> Layout:
        """Inverse of `to_bytes`; `height`/`width` say how to fold the bytes into rows."""
        height = check_dimension(height, "height")
        width = check_dimension(width, "width")
        if not isinstance(walls_bytes, (bytes, bytearray, memoryview)):
            raise LayoutError(f"walls must be bytes, got {type(walls_bytes).__name__}")
        if len(walls_bytes) != height * width:
            raise LayoutError(
                f"walls has {len(walls_bytes)} bytes, expected height*width = {height * width}"
            )
        array = np.frombuffer(bytes(walls_bytes), dtype=np.uint8).reshape(height, width)
        return cls(array.copy(), tuple(agent), tuple(target))  # type: ignore[arg-type]

    def to_init_state(self) -> dict[str, list]:
        """VisGym's `get_init_state()` dict: maze_map, agent_location, target_location."""
        return {
            "maze_map": self.walls.astype(int).tolist(),
            "agent_location": list(self.agent),
            "target_location": list(self.target),
        }

    @classmethod
    def from_init_state(cls, state: dict[str, Any]) -> Layout:
        """Replay a VisGym saved initial state (the JSON its inference datasets store)."""
        missing = {"maze_map", "agent_location", "target_location"} - set(state)
        if missing:
            raise LayoutError(f"initial state lacks {sorted(missing)}")
        return cls.from_walls(state["maze_map"], state["agent_location"], state["target_location"])
