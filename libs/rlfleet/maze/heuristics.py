"""Hand-written reference policies that see what a ``frame_only`` policy sees.

A ``frame_only`` prompt shows the current frame and the last feedback sentence ("Moved
right.") and nothing older. The BFS oracle answers from the frame alone, but only by
tracing the maze's whole path; these two policies answer from local facts, and so mark
what a policy that has not learned to trace paths can reach:

- ``greedy``: the open move that lands closest to the target (Manhattan distance), ties
  broken right, up, left, down. It reads the frame only. Where the path must head away
  from the target it turns back and forth between two cells until the turn limit.
- ``no_reverse``: the same, except that it never undoes the last move unless that is the
  only open move (a dead end). It also reads the feedback sentence, the one bit of memory
  the context gives, and that breaks the back-and-forth loops: it runs into dead ends,
  turns round at their ends, and carries on.

On the 256 held-out 7x7 mazes (20 turns) greedy solves 49.2% and none of the 29 with 12 or
more moves; no_reverse solves 87.5% and 21 of those 29 (``tests/unit/test_maze_heuristics``
pins both). The tiny SFT policy's plateau (about 50%) sits on greedy's figure.
"""

from __future__ import annotations

from rlfleet.maze.layout import DIRECTION_DELTAS, Layout, Position

POLICIES = ("greedy", "no_reverse")


def _reverse(direction: int) -> int:
    return (direction + 2) % 4


def heuristic_move(layout: Layout, agent: Position, last_move: int | None,
                   policy: str) -> int:
    """The move code (0=right, 1=up, 2=left, 3=down) `policy` takes at `agent`, given the
    last move carried out (None: none yet, or the last turn moved nowhere)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    open_moves = [k for k, (dr, dc) in enumerate(DIRECTION_DELTAS)
                  if layout.is_floor((agent[0] + dr, agent[1] + dc))]
    if policy == "no_reverse" and last_move is not None and len(open_moves) > 1:
        open_moves = [k for k in open_moves if k != _reverse(last_move)]
    tr, tc = layout.target

    def distance_after(k: int) -> int:
        dr, dc = DIRECTION_DELTAS[k]
        return abs(agent[0] + dr - tr) + abs(agent[1] + dc - tc)

    return min(open_moves, key=lambda k: (distance_after(k), k))


def solves(layout: Layout, policy: str, max_turns: int) -> bool:
    """Whether `policy` stops on the target within `max_turns` turns (the stop is a turn;
    it stops as soon as it stands on the target)."""
    agent, last = layout.agent, None
    for _ in range(max_turns):
        if agent == layout.target:
            return True
        last = heuristic_move(layout, agent, last, policy)
        dr, dc = DIRECTION_DELTAS[last]
        agent = (agent[0] + dr, agent[1] + dc)
    return False
