"""The reward services that ship with rlfleet, in a small registry.

A reward function scores a finished episode from its task spec and the action texts, by
replaying them on a fresh episode (the reward service trusts no client-side state). Add a
variant with `@register_reward("name", version)`; `rlfleet env serve --reward name`
serves it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlfleet.maze.episode import EpisodeDone, MazeEpisode


@dataclass(frozen=True)
class RewardResult:
    reward: float
    components: dict[str, float]
    solved: bool


@dataclass(frozen=True)
class RewardFunction:
    name: str
    version: str
    components: tuple[str, ...]
    score: Callable[[MazeEpisode], RewardResult]


REWARDS: dict[str, RewardFunction] = {}


def register_reward(name: str, version: str, components: tuple[str, ...]):  # noqa: ANN201
    def wrap(fn: Callable[[MazeEpisode], RewardResult]) -> Callable[[MazeEpisode], RewardResult]:
        REWARDS[name] = RewardFunction(name, version, components, fn)
        return fn

    return wrap


def get_reward(name: str) -> RewardFunction:
    try:
        return REWARDS[name]
    except KeyError:
        raise ValueError(f"unknown reward {name!r}; choose one of {sorted(REWARDS)}") from None


def replay(episode: MazeEpisode, actions: list[str]) -> MazeEpisode:
    """Plays `actions` on `episode`; actions after the episode ended are ignored."""
    for text in actions:
        try:
            episode.step(text)
        except EpisodeDone:
            break
    return episode


@register_reward("task", "1.0.0", ("task",))
def task_reward(episode: MazeEpisode) -> RewardResult:
    """1.0 only for a true solve: stop issued on the target."""
    solved = episode.stats.solved
    return RewardResult(float(solved), {"task": float(solved)}, solved)


@register_reward("format+task", "1.0.0", ("task", "format"))
def format_task_reward(episode: MazeEpisode) -> RewardResult:
    """0.8 × task + 0.2 × the fraction of turns written in the expected format."""
    stats = episode.stats
    task = float(stats.solved)
    fmt = stats.format_ok_turns / stats.turns if stats.turns else 0.0
    return RewardResult(0.8 * task + 0.2 * fmt, {"task": task, "format": fmt}, stats.solved)
