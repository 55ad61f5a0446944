"""The frame_only reference policies: greedy (the frame only) and no_reverse (the frame and
the last move). Their solve rates on the held-out mazes are the figures the docs quote."""

from __future__ import annotations

import pytest

from rlfleet.maze import generate_layout
from rlfleet.maze.difficulty import shortest_moves
from rlfleet.maze.heuristics import heuristic_move, solves
from rlfleet.maze.layout import Layout
from rlfleet.maze.tasks import HELDOUT_SEEDS

# A 3x3-cell maze whose path must head away from the target (12 moves): from (1,1) down
# the left column, right to (5,3), up to (3,3) (away), right to (3,5), down to (5,5). The
# top row is a dead end that points at the target.
DETOUR = [
    "#######",
    "#.....#",
    "#.#####",
    "#.#...#",
    "#.#.#.#",
    "#...#.#",
    "#######",
]


def detour() -> Layout:
    walls = [[1 if ch == "#" else 0 for ch in row] for row in DETOUR]
    return Layout.from_walls(walls, agent=(1, 1), target=(5, 5))


def test_greedy_prefers_the_target_and_no_reverse_never_undoes_the_last_move() -> None:
    layout = detour()
    # at the start right and down both close 1: ties go right (code 0)
    assert heuristic_move(layout, (1, 1), None, "greedy") == 0
    # at the top row's dead end the only open move is back: both take it
    assert heuristic_move(layout, (1, 5), 0, "no_reverse") == 2
    # one cell back greedy heads for the target again (the loop); no_reverse goes on
    assert heuristic_move(layout, (1, 4), 2, "greedy") == 0
    assert heuristic_move(layout, (1, 4), 2, "no_reverse") == 2
    # back at the start, having moved left: no_reverse takes the other way, down
    assert heuristic_move(layout, (1, 1), 2, "greedy") == 0
    assert heuristic_move(layout, (1, 1), 2, "no_reverse") == 3


@pytest.mark.parametrize(("policy", "solved"), [("greedy", False), ("no_reverse", True)])
def test_only_no_reverse_finds_a_way_that_heads_away_from_the_target(policy: str,
                                                                     solved: bool) -> None:
    # no_reverse: 4 moves into the dead end, 4 back, the 12 of the path, the stop
    assert solves(detour(), policy, max_turns=21) is solved
    assert not solves(detour(), "no_reverse", max_turns=20)


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="policy must be one of"):
        heuristic_move(detour(), (1, 1), None, "oracle")


def test_the_held_out_figures_the_docs_quote() -> None:
    layouts = {s: generate_layout(s, 7) for s in HELDOUT_SEEDS}
    long = [s for s in HELDOUT_SEEDS if shortest_moves(s, 7) >= 12]
    for policy, total, on_long in (("greedy", 126, 0), ("no_reverse", 224, 21)):
        ok = {s for s, lay in layouts.items() if solves(lay, policy, 20)}
        assert (len(ok), len(ok & set(long))) == (total, on_long), policy
    assert len(long) == 29
