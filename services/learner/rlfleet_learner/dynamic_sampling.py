"""Dynamic sampling (DAPO): a step draws rollout groups until enough of them carry signal.

A group whose rewards are all equal (every sample solved, or none) has no advantage and
trains nothing. Near the start most groups carry signal; as the policy improves, easy
mazes turn all-solved and hard ones stay all-failed, and a fixed number of groups per
step trains on fewer and fewer. Drawing on until `wanted` groups carry signal (at most
`limit` groups in all) keeps every step's batch full. Every drawn group is consumed (its
seed counts as trained): a group without signal is simply trained on by no one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from rlfleet.grpo.advantages import no_signal
from rlfleet_learner.feed import Group

# Takes `count` more groups, numbered from `first` within the step; None: stopped.
Take = Callable[[int, int], list[Group] | None]


def carries_signal(group: Group) -> bool:
    return not no_signal([t.reward for t in group[1]])


def draw_groups(take: Take, wanted: int, limit: int) -> list[Group] | None:
    """Groups until `wanted` of them carry signal or `limit` are drawn (the first draw
    is `wanted` groups; `limit <= wanted` is plain sampling). Each refill asks for the
    missing groups divided by the signal rate seen so far, so one refill usually does."""
    drawn: list[Group] = []
    signal = 0
    count = wanted
    while True:
        groups = take(len(drawn), count)
        if groups is None:
            return None
        drawn += groups
        signal += sum(carries_signal(g) for g in groups)
        missing = wanted - signal
        room = limit - len(drawn)
        if missing <= 0 or room <= 0:
            return drawn
        rate = max(signal / len(drawn), 1 / 8)  # a step with no signal yet: try 8x
        count = min(room, math.ceil(missing / rate))


class NoSignalWatch:
    """Says once (a warning's text) when `steps` steps in a row drew no group with
    signal: the run goes on, but as set it cannot learn, and a person should know."""

    def __init__(self, steps: int = 5) -> None:
        self.steps = steps
        self._silent: list[tuple[int, int, float]] = []  # (step, groups, reward mean)
        self._said = False

    def observe(self, step: int, groups: list[Group]) -> str | None:
        rewards = [t.reward for _, ts in groups for t in ts]
        if any(carries_signal(g) for g in groups) or not groups:
            self._silent.clear()
            return None
        self._silent.append((step, len(groups), sum(rewards) / max(len(rewards), 1)))
        if self._said or len(self._silent) < self.steps:
            return None
        self._said = True
        first, last = self._silent[0][0], self._silent[-1][0]
        total = sum(n for _, n, _ in self._silent)
        means = sorted({round(m, 3) for _, _, m in self._silent})
        return (f"steps {first}-{last}: none of {total} rollout groups carried signal (each "
                f"group's rewards all equal; step reward means {means}): nothing is trained. "
                "The mazes are all solved or all failed at this policy, or the reward is "
                "constant; the run goes on, but as set it cannot learn (a curriculum, "
                "data.max_groups_per_step, or another reward)")
