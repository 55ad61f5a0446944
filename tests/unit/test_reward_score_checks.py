"""A reward function's per-turn split is checked like its reward: one finite number per
turn, summing to the reward; anything else is refused naming the episode."""

from __future__ import annotations

import math

import pytest

from rlfleet.reward import Score


def test_a_split_that_sums_to_the_reward_passes() -> None:
    s = Score(1.0, {"task": 1.0}, True, turn_rewards=(0.25, 0.25, 0.5))
    assert s.checked("ep 0", (0.0, 1.0), turns=3) is s
    assert Score(0.3).checked("ep 0", turns=5).turn_rewards == ()  # no split: fine


@pytest.mark.parametrize(("turns", "split", "says"), [
    (3, (0.5, 0.5), "2 turn rewards for 3 turns"),
    (2, (0.5, 0.4), "sum to 0.9"),
    (2, (0.5, math.nan), "turn_rewards[1] must be a finite number"),
    (2, (0.5, math.inf), "turn_rewards[1] must be a finite number"),
])
def test_a_wrong_split_is_refused(turns: int, split: tuple, says: str) -> None:
    with pytest.raises(ValueError, match=r"ep 7: .*" + says.replace("[", r"\[")
                       .replace("]", r"\]")):
        Score(1.0, turn_rewards=split).checked("ep 7", turns=turns)
