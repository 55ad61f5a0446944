"""Task presets and the seed split between evaluation, held-out and training mazes.

Seed split (fixed; every component agrees on it):
- EVAL_SEEDS = 0..63: the 64 fixed evaluation mazes of the published run.
- HELDOUT_SEEDS = 64..319: 256 more mazes for a less noisy measurement (with 64 mazes the
  standard error of a solve rate is about ±6 points).
- Training seeds are TRAIN_SEED_BASE (1_000_000) + cursor, cursor = 0, 1, 2, ... kept in
  the learner's checkpointed data cursor. They never equal an eval or held-out seed, and
  `train_seeds` also skips any training seed whose maze is the *same instance* as an eval
  or held-out maze of that size: small sizes have few distinct mazes (7×7: 192 mazes × 4
  corner pairs), so distinct seeds alone would not keep eval mazes out of training.

Turns needed on EVAL_SEEDS (our generator reproduces the maze VisGym draws for each seed
through gymnasium's `np_random`, see `generate.py`; a "turn" is one action, and solving
takes the shortest-path moves plus one stop):
- 9×9: 50 mazes need 12 moves, 14 need 16 moves (seeds 1 4 6 8 14 17 20 23 25 29 34 36
  59 62), i.e. 13 or 17 turns. All fit the 20-turn limit; those 14 cannot be solved in
  the published run's 15 turns, so 50/64 is the ceiling there.
- 11×11: 16/20/24/28/32 moves for 35/20/7/1/1 mazes; seed 21 needs 32 moves + stop =
  33 turns, more than the 30-turn limit, so 63/64 is the ceiling at 11×11.
(`tests/unit/test_maze_oracle.py` prints these numbers.)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from rlfleet.maze.actions import ActionFormat
from rlfleet.maze.episode import MazeEpisode, default_max_turns
from rlfleet.maze.generate import generate_layout
from rlfleet.maze.render import DEFAULT_CELL_PX

EVAL_SEEDS = range(0, 64)
HELDOUT_SEEDS = range(64, 320)
TRAIN_SEED_BASE = 1_000_000
_MAX_SKIPS = 2000


@dataclass(frozen=True)
class TaskSpec:
    """Defaults for one task; a request may override size, turns, format and picture size."""

    name: str
    size: int
    max_turns: int
    action_format: ActionFormat = ActionFormat.LITERAL
    cell_px: int = DEFAULT_CELL_PX


TASKS: dict[str, TaskSpec] = {
    "maze_2d": TaskSpec("maze_2d", size=9, max_turns=default_max_turns(9)),
    "maze_2d_hard": TaskSpec("maze_2d_hard", size=11, max_turns=default_max_turns(11)),
}


def get_task(name: str) -> TaskSpec:
    """The preset called `name`; ValueError naming the known tasks otherwise."""
    try:
        return TASKS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}") from None


def new_episode(
    task: str,
    seed: int,
    *,
    size: int | None = None,
    max_turns: int | None = None,
    action_format: ActionFormat | str | None = None,
    cell_px: int | None = None,
) -> MazeEpisode:
    """A fresh episode of `task` on the maze for `seed`, with optional overrides.

    A size override without a turn override gets that size's default limit.
    """
    spec = get_task(task)
    layout = generate_layout(seed, spec.size if size is None else size)
    if max_turns is None:
        max_turns = spec.max_turns if size is None else default_max_turns(layout.height)
    return MazeEpisode(
        layout,
        max_turns=max_turns,
        action_format=spec.action_format if action_format is None else action_format,
        cell_px=spec.cell_px if cell_px is None else cell_px,
    )


def seed_split(seed: int) -> str:
    """ "eval", "heldout", "train", or "unassigned" (320..999_999: free for ad-hoc use)."""
    if seed in EVAL_SEEDS:
        return "eval"
    if seed in HELDOUT_SEEDS:
        return "heldout"
    if seed >= TRAIN_SEED_BASE:
        return "train"
    return "unassigned"


@lru_cache(maxsize=16)
def _reserved_keys(size: int) -> frozenset:
    seeds = list(EVAL_SEEDS) + list(HELDOUT_SEEDS)
    return frozenset(generate_layout(s, size).key for s in seeds)


class SeedBatch(NamedTuple):
    seeds: list[int]
    next_cursor: int


def train_seeds(cursor: int, count: int, size: int | None = None) -> SeedBatch:
    """The next `count` training seeds from `cursor`, and the cursor after them.

    With `size`, seeds whose maze equals an eval or held-out maze of that size are
    skipped (the returned cursor moves past them), so training never sees those mazes.
    """
    if isinstance(cursor, bool) or not isinstance(cursor, int) or cursor < 0:
        raise ValueError(f"cursor must be a non-negative integer, got {cursor!r}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be a non-negative integer, got {count!r}")
    reserved = _reserved_keys(size) if size is not None else frozenset()
    seeds: list[int] = []
    skipped_in_a_row = 0
    while len(seeds) < count:
        seed = TRAIN_SEED_BASE + cursor
        cursor += 1
        if size is not None and generate_layout(seed, size).key in reserved:
            # 5×5 has only 16 maze instances, all of them reserved: fail, never spin.
            skipped_in_a_row += 1
            if skipped_in_a_row >= _MAX_SKIPS:
                raise ValueError(f"no training mazes left at size {size}: all are reserved")
            continue
        skipped_in_a_row = 0
        seeds.append(seed)
    return SeedBatch(seeds, cursor)
