"""Bands of shortest-path length, as results are reported in."""

from __future__ import annotations

import pytest

from rlfleet.maze.difficulty import BANDS, band, shortest_moves
from rlfleet.maze.generate import generate_layout
from rlfleet.maze.oracle import oracle_actions
from rlfleet.maze.tasks import HELDOUT_SEEDS


@pytest.mark.parametrize(("moves", "key"), [(0, "moves_le7"), (7, "moves_le7"),
                                              (8, "moves_8to11"), (11, "moves_8to11"),
                                              (12, "moves_ge12"), (40, "moves_ge12")])
def test_bands_cover_every_length_once(moves: int, key: str) -> None:
    assert band(moves) == key


def test_shortest_moves_is_the_oracles_path_without_the_stop() -> None:
    for seed in (64, 65, 66):
        assert shortest_moves(seed, 9) == len(oracle_actions(generate_layout(seed, 9))) - 1


def test_7x7_heldout_mazes_are_8_or_at_least_12_moves_and_9x9_ones_at_least_12() -> None:
    # corner-to-corner perfect mazes: 7x7 paths are 8, 12 or 16 moves; 9x9 ones 12 and up
    def counts(size: int) -> dict[str, int]:
        out = {key: 0 for key, _, _, _ in BANDS}
        for seed in HELDOUT_SEEDS:
            out[band(shortest_moves(seed, size))] += 1
        return out

    assert counts(7) == {"moves_le7": 0, "moves_8to11": 227, "moves_ge12": 29}
    assert counts(9) == {"moves_le7": 0, "moves_8to11": 0, "moves_ge12": 256}
