"""Breadth-first-search oracle: the shortest way to the target from any floor cell.

Used to check that mazes are solvable within the turn limit, and to make SFT data from
every floor cell (not only the start), since a policy trained on the path alone is lost
as soon as it steps off it. The distance field is computed once per layout (cached). In a
perfect maze the shortest path is unique; for other explicit maps ties are broken by
VisGym's move order (right, up, left, down) so the oracle is deterministic.
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache

import numpy as np

from rlfleet.maze.actions import Action, ActionFormat, format_action
from rlfleet.maze.layout import DIRECTION_DELTAS, Layout, Position

UNREACHABLE = -1


@lru_cache(maxsize=512)
def distance_field(layout: Layout) -> np.ndarray:
    """Moves from each cell to the target (int32); UNREACHABLE for walls and cut-off cells."""
    dist = np.full(layout.walls.shape, UNREACHABLE, dtype=np.int32)
    dist[layout.target] = 0
    queue = deque([layout.target])
    while queue:
        r, c = queue.popleft()
        for dr, dc in DIRECTION_DELTAS:
            nr, nc = r + dr, c + dc
            if layout.is_floor((nr, nc)) and dist[nr, nc] == UNREACHABLE:
                dist[nr, nc] = dist[r, c] + 1
                queue.append((nr, nc))
    dist.setflags(write=False)
    return dist


def distance_to_target(layout: Layout, position: Position | None = None) -> int:
    """Shortest number of moves from `position` (default: the start) to the target."""
    return int(distance_field(layout)[_checked(layout, position)])


def _checked(layout: Layout, position: Position | None) -> Position:
    pos = layout.agent if position is None else (int(position[0]), int(position[1]))
    if not layout.is_floor(pos):
        raise ValueError(f"{pos} is not a floor cell of this maze")
    if distance_field(layout)[pos] == UNREACHABLE:
        raise ValueError(f"the target cannot be reached from {pos}")
    return pos


def oracle_action(layout: Layout, position: Position | None = None) -> Action:
    """The best action at `position`: stop on the target, else the first shortest-path move."""
    pos = _checked(layout, position)
    dist = distance_field(layout)
    here = dist[pos]
    if here == 0:
        return Action.stop()
    for direction, (dr, dc) in enumerate(DIRECTION_DELTAS):
        nxt = (pos[0] + dr, pos[1] + dc)
        if layout.is_floor(nxt) and dist[nxt] == here - 1:
            return Action.move(direction)
    raise AssertionError("a reachable cell always has a neighbour one step closer")


def shortest_path(layout: Layout, position: Position | None = None) -> list[Position]:
    """Cells from `position` (default: the start) to the target, both included."""
    pos = _checked(layout, position)
    path = [pos]
    while pos != layout.target:
        dr, dc = oracle_action(layout, pos).delta
        pos = (pos[0] + dr, pos[1] + dc)
        path.append(pos)
    return path


def oracle_actions(layout: Layout, position: Position | None = None) -> list[Action]:
    """The solving action sequence from `position`: shortest-path moves, then stop."""
    return [oracle_action(layout, cell) for cell in shortest_path(layout, position)]


def oracle_policy(layout: Layout) -> dict[Position, Action]:
    """The oracle action for every floor cell that can reach the target."""
    dist = distance_field(layout)
    return {
        cell: oracle_action(layout, cell)
        for cell in layout.floor_cells()
        if dist[cell] != UNREACHABLE
    }


def oracle_texts(
    layout: Layout,
    position: Position | None = None,
    fmt: ActionFormat | str = ActionFormat.LITERAL,
) -> list[str]:
    """`oracle_actions` written as model replies in `fmt`."""
    return [format_action(a, fmt) for a in oracle_actions(layout, position)]
