"""How hard a maze is: its shortest solution's length, in bands.

The bands are the ones results are reported in (solve rate by shortest-path length):
a policy that gains only on short mazes has learned less than its mean says. The mazes
run corner to corner, so their paths are long for their size: on 7x7 they are 8, 12 or
16 moves (the first band empty, the last about a tenth of them); on 9x9 all are 12 or
more.
"""

from __future__ import annotations

from collections.abc import Iterable

from rlfleet.maze.generate import generate_layout
from rlfleet.maze.oracle import distance_to_target

# (key, label, fewest moves, most moves) of each band, in order; the key names the band
# in metrics and JSON (e.g. heldout_moves_ge12), the label in tables and plots
BANDS: tuple[tuple[str, str, int, int | None], ...] = (
    ("moves_le7", "<= 7 moves", 0, 7),
    ("moves_8to11", "8-11 moves", 8, 11),
    ("moves_ge12", ">= 12 moves", 12, None),
)
LABELS = {key: label for key, label, _, _ in BANDS}


def shortest_moves(seed: int, size: int) -> int:
    """Moves of the shortest solution of the maze for `seed` (the stop not counted)."""
    return distance_to_target(generate_layout(seed, size))


def band(moves: int) -> str:
    """The band's key for a shortest solution of `moves` moves."""
    for key, _, low, high in BANDS:
        if moves >= low and (high is None or moves <= high):
            return key
    raise ValueError(f"a shortest path has >= 0 moves, got {moves}")


def by_band(seeds: Iterable[int], size: int) -> dict[str, list[int]]:
    """The seeds grouped by their maze's band (keys in BANDS order; empty bands left out)."""
    members: dict[str, list[int]] = {}
    for seed in seeds:
        members.setdefault(band(shortest_moves(seed, size)), []).append(seed)
    return {key: members[key] for key, _, _, _ in BANDS if key in members}
