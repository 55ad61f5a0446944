"""The reward functions that ship with rlfleet: ``task``, ``format+task``, ``progress``
and ``novelty``.

The first two work for any task: "task" is the env's own return (the maze: 1.0 exactly
for the solving stop), "format" the fraction of turns whose text was read as an action in
the episode's format. "progress" is the maze's: a solve, or partial credit for the way
covered towards the target. "novelty" is the maze's too: a solve, less a little for every
turn spent on a cell the episode had already stood on.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from rlfleet.maze.episode import MazeEpisode, StepOutcome
from rlfleet.maze.oracle import distance_to_target
from rlfleet.reward import Episode, RewardFunction, Score
from rlfleet.tasks.maze import episode_from_spec

# The env's own return is whatever its task pays (the maze 0 or 1, a SkyRL env its own
# scale): the built-ins declare no bound of their own; finiteness is still checked.
UNBOUNDED = (-math.inf, math.inf)


def replayed_turns(episode: Episode) -> tuple[MazeEpisode, Iterator[StepOutcome]]:
    """The maze replayed from the episode's spec (at its start), and the outcome of each of
    the episode's actions in turn, stepped as they are consumed, up to the end of the
    maze episode (actions after it are not played: they earn 0 in a split)."""
    replay = episode_from_spec(episode.spec)

    def steps() -> Iterator[StepOutcome]:
        for action in episode.actions:
            if replay.done:
                return
            yield replay.step(action)

    return replay, steps()


def padded(turns: list[float], episode: Episode) -> tuple[float, ...]:
    """One turn reward per action: 0 for the actions after the maze episode ended."""
    return tuple(turns) + (0.0,) * (len(episode.actions) - len(turns))


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
        replay, outcomes = replayed_turns(episode)
        start = distance_to_target(replay.layout)
        scale = self.PARTIAL / max(start, 1)
        turns: list[float] = []
        before = start
        for outcome in outcomes:
            after = distance_to_target(replay.layout, replay.agent)
            turns.append(scale * (before - after) + (1.0 - self.PARTIAL) * outcome.solved)
            before = after
        solved = episode.solved
        progress = (start - before) / start if start else 1.0
        reward = 1.0 if solved else self.PARTIAL * progress
        return Score(reward, {"task": float(solved), "progress": progress}, solved,
                     turn_rewards=padded(turns, episode))


class NoveltyReward(RewardFunction):
    """A solve earns 1.0; every turn that ends on a cell the episode already stood on
    (a step back, a wall bump, a stray word) costs `REVISIT`, and a stop off the target
    costs `REVISIT` for every turn it left unplayed. So a solve scores 1.0 less its
    revisits, and any other end between 0 and -`REVISIT` x the turn limit.

    Why: a policy that sees only the current frame and the last feedback (frame_only) can
    fall into two-cell loops, stepping back and forth until the turn limit. The solve
    alone blames a looping episode as a whole; the revisit cost, with per-turn credit
    (grpo.credit: turn), blames the turn that stepped back, the same picture with another
    "Moved ..." sentence before it. The unplayed turns are charged so that giving up early
    never scores above playing on (without that, a policy learns to stop at once). It is a
    count-based exploration bonus, not a hint of the way: it never reads the target's
    distance."""

    name = "novelty"
    version = "1.1.0"
    components = ("task", "revisits")
    tasks = ("maze_2d", "maze_2d_hard")
    reward_range = (-math.inf, 1.0)
    REVISIT = 0.05

    def score(self, episode: Episode) -> Score:
        replay, outcomes = replayed_turns(episode)
        seen = {replay.agent}
        turns: list[float] = []
        revisits = 0
        for outcome in outcomes:
            if outcome.solved:
                turns.append(1.0)
                continue
            # a stop off the target ends the episode: it pays for the turns it gave up
            again = 1 + (replay.max_turns - replay.stats.turns) if replay.done and not \
                replay.stats.truncated else int(replay.agent in seen)
            seen.add(replay.agent)
            revisits += again
            turns.append(-self.REVISIT * again)
        return Score(sum(turns), {"task": float(episode.solved), "revisits": float(revisits)},
                     episode.solved, turn_rewards=padded(turns, episode))


BUILTIN_REWARDS: tuple[RewardFunction, ...] = (TaskReward(), FormatTaskReward(),
                                               ProgressReward(), NoveltyReward())
