"""The reward functions that ship with rlfleet: ``task``, ``format+task`` and ``progress``.

The first two work for any task: "task" is the env's own return (the maze: 1.0 exactly
for the solving stop), "format" the fraction of turns whose text was read as an action in
the episode's format. "progress" is the maze's: a solve, or partial credit for the way
covered towards the target.
"""

from __future__ import annotations

import math

from rlfleet.maze.oracle import distance_to_target
from rlfleet.reward import Episode, RewardFunction, Score
from rlfleet.tasks.maze import episode_from_spec

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


class ProgressReward(RewardFunction):
    """The way covered towards the target, turn by turn: each turn earns `PARTIAL` × the
    BFS distance it closed over the start distance (a step away loses as much, a bump or
    a stray word earns 0), and the solving stop earns the rest of 1.0. So a solve scores
    1.0, and an episode that ends elsewhere `PARTIAL` × (start - end distance) / start,
    below a solve and negative if it ended farther away than it began.

    Two uses: a group whose episodes all time out on a long maze still differs in how far
    each got (signal where the solve alone is all zeros), and `turn_rewards` lets a
    learner with per-turn credit train each move on the progress that followed it."""

    name = "progress"
    version = "1.0.0"
    components = ("task", "progress")
    tasks = ("maze_2d", "maze_2d_hard")
    reward_range = (-math.inf, 1.0)
    PARTIAL = 0.5

    def score(self, episode: Episode) -> Score:
        replay = episode_from_spec(episode.spec)
        start = distance_to_target(replay.layout)
        scale = self.PARTIAL / max(start, 1)
        turns: list[float] = []
        before = start
        for action in episode.actions:
            if replay.done:
                break
            outcome = replay.step(action)
            after = distance_to_target(replay.layout, replay.agent)
            turns.append(scale * (before - after) + (1.0 - self.PARTIAL) * outcome.solved)
            before = after
        turns += [0.0] * (len(episode.actions) - len(turns))  # actions after the end
        solved = episode.solved
        progress = (start - before) / start if start else 1.0
        reward = 1.0 if solved else self.PARTIAL * progress
        return Score(reward, {"task": float(solved), "progress": progress}, solved,
                     turn_rewards=tuple(turns))


BUILTIN_REWARDS: tuple[RewardFunction, ...] = (TaskReward(), FormatTaskReward(),
                                               ProgressReward())
