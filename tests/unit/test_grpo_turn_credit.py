"""Per-turn credit: each turn's return-to-go against the group's at the same turn,
hand-computed; and the learner's rows carrying them, or a clear refusal without a split."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlfleet.grpo import GRPOConfig
from rlfleet.grpo.advantages import turn_advantages
from rlfleet.v1 import rollout_pb2
from rlfleet_learner.samples import NoTurnRewards, build_rows, trajectory_sample, turn_credit

# A: three turns, solved at the end; B: two turns, one step forward and one back.
A, B = [0.1, 0.1, 0.8], [0.1, -0.1]
# returns-to-go A [1.0, 0.9, 0.8], B [0.0, -0.1]; baselines turn 0: 0.5, turn 1: 0.4,
# turn 2: A alone (no baseline: 0); episode returns [1.0, 0.0]: sample std sqrt(0.5)


def test_return_to_go_minus_the_groups_at_the_same_turn() -> None:
    a, b = turn_advantages([A, B], std_normalize=False, eps=1e-6)
    assert a == pytest.approx([0.5, 0.5, 0.0])
    assert b == pytest.approx([-0.5, -0.5])


def test_divided_by_the_std_of_the_episode_returns() -> None:
    a, b = turn_advantages([A, B], std_normalize=True, eps=0.0)
    s = math.sqrt(0.5)
    assert a == pytest.approx([0.5 / s, 0.5 / s, 0.0])
    assert b == pytest.approx([-0.5 / s, -0.5 / s])


def test_equal_returns_are_not_divided_by_zero() -> None:
    a, b = turn_advantages([[0.5, 0.5], [1.0, 0.0]], std_normalize=True, eps=1e-6)
    # returns-to-go [1.0, 0.5] and [1.0, 0.0]: turn 1 differs though the returns do not
    assert a == pytest.approx([0.0, 0.25]) and b == pytest.approx([0.0, -0.25])
    assert all(np.isfinite(x).all() for x in (a, b))


def trajectory(index: int, turn_rewards: list[float]) -> rollout_pb2.Trajectory:
    """Two tokens per turn (a prompt token, an answer token), one segment per turn."""
    n = len(turn_rewards)
    return rollout_pb2.Trajectory(
        index=index, token_ids=[5, 6] * n, loss_mask=[0, 1] * n, logprobs=[0.0, -0.5] * n,
        segment_starts=list(range(0, 2 * n, 2)), reward=sum(turn_rewards),
        turn_rewards=turn_rewards, reward_name="progress",
        adapter=rollout_pb2.Trajectory().adapter)


def test_each_row_carries_its_turns_advantage() -> None:
    cfg = GRPOConfig(credit="turn", std_normalize=False)
    rows, stats, _ = build_rows([("g", [trajectory(0, A), trajectory(1, B)])], 0, cfg)
    assert stats.num_kept == 2
    assert [r.advantage for r in rows] == pytest.approx([0.5, 0.5, 0.0, -0.5, -0.5])
    episode = build_rows([("g", [trajectory(0, A), trajectory(1, B)])], 0,
                         GRPOConfig(std_normalize=False))[0]
    assert [r.advantage for r in episode] == pytest.approx([0.5] * 3 + [-0.5] * 2)


def test_a_reward_without_a_split_is_refused_by_name() -> None:
    plain = [trajectory(0, A), trajectory(1, B)]
    plain[1].ClearField("turn_rewards")
    kept = [trajectory_sample(t, "g").with_advantage(1.0) for t in plain]
    with pytest.raises(NoTurnRewards, match="reward 'progress'.* 0 turn rewards for 2 turns"):
        turn_credit(kept, GRPOConfig(credit="turn"))
