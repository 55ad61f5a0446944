"""Whether a turn limit lets every eval maze be solved.

A maze takes its shortest solution's moves plus the stop. A limit below that for some
eval mazes caps the solve rate the evaluation can show (the published seed run's 15
turns leave 14 of the 64 fixed 9×9 mazes, which need 17, unsolvable: at most 50/64),
so a config that plays such a limit on them is refused at the learner's start unless
it says the cap is known (`eval.accept_turn_cap`). Every cap, the held-out set's too, is
stated in the eval tables and warned about at start."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlfleet.config import ConfigError
from rlfleet.maze.difficulty import shortest_moves
from rlfleet.maze.episode import default_max_turns
from rlfleet.maze.tasks import TASKS

if TYPE_CHECKING:
    from rlfleet.learner_config import LearnerConfig


@dataclass(frozen=True)
class TurnCap:
    """An eval set under a turn limit: how many of its mazes the limit leaves
    unsolvable, and the limit that would let all of them be solved."""

    name: str
    mazes: int
    max_turns: int
    unsolvable: int
    turns_needed: int  # the longest shortest solution + the stop

    @property
    def ceiling(self) -> float:
        """The highest solve rate the limit allows."""
        return (self.mazes - self.unsolvable) / self.mazes if self.mazes else 0.0

    def describe(self) -> str:
        label = {"heldout": "held-out"}.get(self.name, self.name)
        return (f"{self.unsolvable} of the {self.mazes} {label} mazes cannot be solved "
                f"in {self.max_turns} turns (they need up to {self.turns_needed}; the "
                f"solve rate is capped at {100 * self.ceiling:.1f}%)")


def effective_max_turns(size: int, max_turns: int) -> int:
    """The limit the env plays: `max_turns`, or 0 for the size's default (VisGym's)."""
    return max_turns or default_max_turns(size)


def turn_cap(name: str, seeds: Sequence[int], size: int, max_turns: int) -> TurnCap:
    """The set `seeds` of `size` mazes under `max_turns` (0: the size's default)."""
    limit = effective_max_turns(size, max_turns)
    needed = [shortest_moves(s, size) + 1 for s in seeds]
    return TurnCap(name, len(needed), limit, sum(n > limit for n in needed),
                   max(needed, default=0))


def turn_caps(task: str, sets: dict[str, Sequence[int]], size: int, max_turns: int
              ) -> list[TurnCap]:
    """The sets whose mazes the limit leaves unsolvable (none for a task that is not a
    maze: its episodes have no shortest solution to check)."""
    if task not in TASKS:
        return []
    caps = [turn_cap(name, seeds, size, max_turns) for name, seeds in sets.items() if seeds]
    return [c for c in caps if c.unsolvable]


def check_turn_caps(caps: list[TurnCap], accept: bool, flag: str = "eval.accept_turn_cap"
                    ) -> list[str]:
    """ConfigError when the fixed eval set is capped, unless `accept`; else every cap's
    statement. A capped held-out set is stated, never refused: its longest mazes outgrow
    VisGym's own limits (9x9 at 20 turns leaves 15 of the 256), which the published
    numbers share."""
    fixed = [c for c in caps if c.name == "eval"]
    if fixed and not accept:
        (cap,) = fixed
        raise ConfigError(f"{cap.describe()}: set data.max_turns to {cap.turns_needed} or "
                          f"more, or set {flag}: true to evaluate under the cap knowingly")
    return [c.describe() for c in caps]


def config_turn_caps(cfg: LearnerConfig) -> list[TurnCap]:
    """The capped sets of a learner config (eval.eval_seeds and heldout_seeds at
    data.size and data.max_turns); ConfigError when the fixed eval set is capped, unless
    eval.accept_turn_cap."""
    from rlfleet.evaluation.play import eval_sets

    caps = turn_caps(cfg.data.task, eval_sets(cfg.eval.eval_seeds, cfg.eval.heldout_seeds),
                     cfg.data.size, cfg.data.max_turns)
    check_turn_caps(caps, cfg.eval.accept_turn_cap)
    return caps
