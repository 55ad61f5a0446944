"""Seeded generation of perfect mazes, reproducing VisGym's maze_2d draw for a given seed.

How a seed becomes a maze (the same steps VisGym's `Maze2DEnv.reset(seed=s)` takes, so that
`generate_layout(s, 9)` is the maze VisGym's `maze_2d/easy` shows for seed s):

1. `rng = numpy.random.default_rng(seed)` — a private PCG64 generator (what gymnasium's
   `seeding.np_random` builds); no global random state is read or written.
2. `wilson_seed = rng.integers(2**32)`; the interior (size-2)×(size-2) grid is carved by
   Wilson's algorithm (loop-erased random walks) driven by `random.Random(wilson_seed)`,
   consuming that generator call for call as VisGym's `WilsonMazeGenerator` does.
3. `corner = rng.integers(0, 4)` picks one of four start/goal pairs in opposite interior
   corners: 0: (1,1)→(n-2,n-2), 1: (n-2,n-2)→(1,1), 2: (n-2,1)→(1,n-2), 3: (1,n-2)→(n-2,1).
   So the seed, not a fixed rule, picks the diagonal and the direction (as in VisGym).

The result is a perfect maze: the floor cells form a tree (connected, no cycles), so the
shortest path between any two cells is unique. Same seed → same maze in every process
(PCG64 and `random.Random` streams are fixed by their seeds).
"""

from __future__ import annotations

import random
from functools import lru_cache

import numpy as np

from rlfleet.maze.layout import Layout, Position, check_dimension

# Wilson walks move two grid squares at a time (cell to cell, jumping the wall between);
# VisGym's order of directions, which fixes how random draws map to moves.
_WALK_DIRECTIONS: tuple[Position, ...] = ((0, 1), (1, 0), (0, -1), (-1, 0))


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be a non-negative integer, got {type(seed).__name__}")
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    return seed


def wilson_interior(height: int, width: int, rng: random.Random) -> np.ndarray:
    """Carve an odd `height`×`width` interior with Wilson's algorithm; returns 1 = floor.

    Cells sit at even (row, col); odd positions are the walls between them. The order of
    `unvisited` and of the random draws follows VisGym's generator exactly, which is why
    this keeps a list (its order is part of the result) next to a set (for fast lookups).
    """
    grid = np.zeros((height, width), dtype=np.uint8)
    unvisited = [(r, c) for r in range(0, height, 2) for c in range(0, width, 2)]
    visited: set[Position] = set()

    def in_grid(cell: Position, d: int) -> bool:
        r, c = cell[0] + 2 * _WALK_DIRECTIONS[d][0], cell[1] + 2 * _WALK_DIRECTIONS[d][1]
        return 0 <= r < height and 0 <= c < width

    first = unvisited.pop(rng.randint(0, len(unvisited) - 1))
    visited.add(first)
    grid[first] = 1
    while unvisited:
        start = unvisited[rng.randint(0, len(unvisited) - 1)]
        # Random walk until it hits the tree; remembering only the last exit direction of
        # each cell is what erases the loops.
        exits: dict[Position, int] = {}
        cell = start
        while True:
            d = rng.randint(0, 3)
            while not in_grid(cell, d):
                d = rng.randint(0, 3)
            exits[cell] = d
            dr, dc = _WALK_DIRECTIONS[d]
            cell = (cell[0] + 2 * dr, cell[1] + 2 * dc)
            if cell in visited:
                break
        # Replay the loop-erased path from the start, adding it to the tree.
        cell = start
        while cell not in visited:
            visited.add(cell)
            unvisited.remove(cell)
            grid[cell] = 1
            dr, dc = _WALK_DIRECTIONS[exits[cell]]
            grid[cell[0] + dr, cell[1] + dc] = 1
            cell = (cell[0] + 2 * dr, cell[1] + 2 * dc)
    return grid


def corner_pairs(height: int, width: int) -> tuple[tuple[Position, Position], ...]:
    """The four (agent, target) pairs in opposite interior corners, in VisGym's order."""
    last_r, last_c = height - 2, width - 2
    return (
        ((1, 1), (last_r, last_c)),
        ((last_r, last_c), (1, 1)),
        ((last_r, 1), (1, last_c)),
        ((1, last_c), (last_r, 1)),
    )


def generate_layout(seed: int, size: int = 9) -> Layout:
    """The perfect `size`×`size` maze (outer walls included) for `seed`; see module doc.

    Raises ValueError for a size that is not odd in 5..63 or a negative/non-int seed.
    """
    return _generate(_check_seed(seed), check_dimension(size, "size"))


# Cached behind the validation above (so that e.g. True never hits the entry for 1):
# layouts are immutable and eval sets ask for the same seeds again and again.
@lru_cache(maxsize=4096)
def _generate(seed: int, size: int) -> Layout:
    rng = np.random.default_rng(seed)
    wilson_seed = int(rng.integers(2**32))
    walls = np.ones((size, size), dtype=np.uint8)
    walls[1:-1, 1:-1] = 1 - wilson_interior(size - 2, size - 2, random.Random(wilson_seed))
    agent, target = corner_pairs(size, size)[int(rng.integers(0, 4))]
    return Layout(walls, agent, target)
