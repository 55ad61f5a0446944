"""rlfleet's reward functions, now in the public API `rlfleet.reward` (write your own
with `rlfleet.reward.RewardFunction`; plug it in through the ``rlfleet.rewards``
entry-point group). Kept here for code that imported them from the env service."""

from __future__ import annotations

from rlfleet.reward import Episode, RewardFunction, Score, default_rewards
from rlfleet.reward.builtin import BUILTIN_REWARDS, FormatTaskReward, TaskReward

REWARDS: dict[str, RewardFunction] = {r.name: r for r in BUILTIN_REWARDS}


def get_reward(name: str) -> RewardFunction:
    """A reward function by name (built-ins and entry points); ValueError if unknown."""
    registry = default_rewards()
    if name not in registry:
        raise ValueError(f"unknown reward {name!r}; choose one of {registry.names()}")
    return registry.get(name)


__all__ = ["REWARDS", "Episode", "FormatTaskReward", "RewardFunction", "Score", "TaskReward",
           "get_reward"]
