"""The reward functions that ship with rlfleet: ``task`` and ``format+task``.

Both work for any task: "task" is the env's own return (the maze: 1.0 exactly for the
solving stop), "format" the fraction of turns whose text was read as an action in the
episode's format.
"""

from __future__ import annotations

import math

from rlfleet.reward import Episode, RewardFunction, Score

# The env's own return is whatever its task pays (the maze 0 or 1, a SkyRL env its own
# scale): the built-ins declare no bound of their own; finiteness is still checked.
UNBOUNDED = (-math.inf, math.inf)


class TaskReward(RewardFunction):
    """The env's own reward: the maze pays 1.0 only for a true solve (stop on the target)."""

    name = "task"
    version = "1.0.0"
    components = ("task",)
    reward_range = UNBOUNDED

    def score(self, episode: Episode) -> Score:
        task = float(episode.env_return)
        return Score(task, {"task": task}, episode.solved)


class FormatTaskReward(RewardFunction):
    """0.8 × task + 0.2 × the fraction of turns written in the expected format (the
    VisGym SFT recipe's reward). Format credit is never a solve."""

    name = "format+task"
    version = "1.0.0"
    components = ("task", "format")
    reward_range = UNBOUNDED

    def score(self, episode: Episode) -> Score:
        task = float(episode.env_return)
        turns = episode.turns
        fmt = episode.format_ok_turns / turns if turns else 0.0
        return Score(0.8 * task + 0.2 * fmt, {"task": task, "format": fmt}, episode.solved)


BUILTIN_REWARDS: tuple[RewardFunction, ...] = (TaskReward(), FormatTaskReward())
