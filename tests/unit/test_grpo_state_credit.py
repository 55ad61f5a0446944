"""Per-state credit: each turn's return-to-go against that of the group's turns played
from the same prompt, hand-computed; and the learner's rows carrying it, from the
reward's split where it gives one and from the episode's reward where it does not."""

from __future__ import annotations

import math

import pytest

from rlfleet.grpo import GRPOConfig
from rlfleet.grpo.advantages import state_advantages
from rlfleet.v1 import rollout_pb2
from rlfleet_learner.samples import NoTurnRewards, build_rows, segment_prompts

# Three episodes of one maze, the task reward (no split: every turn's return is the
# episode's): E1 solves through states a, b, c; E2 fails, going a, b, d and back to b;
# E3 fails through a, e. Returns-to-go E1 [1, 1, 1], E2 [0, 0, 0, 0], E3 [0, 0].
# Baselines: a and b were played from by E1 once and the failures twice (b twice by E2):
# a: mean(1, 0, 0) = 1/3; b: mean(1, 0, 0) = 1/3; c, d and e once each: no baseline.
RETURNS = [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0]]
STATES = [["a", "b", "c"], ["a", "b", "d", "b"], ["a", "e"]]


def test_return_to_go_minus_the_mean_from_the_same_state() -> None:
    e1, e2, e3 = state_advantages(RETURNS, STATES, std_normalize=False, eps=1e-6)
    assert e1 == pytest.approx([2 / 3, 2 / 3, 0.0])
    assert e2 == pytest.approx([-1 / 3, -1 / 3, 0.0, -1 / 3])
    assert e3 == pytest.approx([-1 / 3, 0.0])


def test_divided_by_the_std_of_the_episode_returns() -> None:
    # episode returns [1, 0, 0]: sample std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    s = math.sqrt(1 / 3)
    e1, _, e3 = state_advantages(RETURNS, STATES, std_normalize=True, eps=0.0)
    assert e1 == pytest.approx([2 / 3 / s, 2 / 3 / s, 0.0])
    assert e3 == pytest.approx([-1 / 3 / s, 0.0])


def test_a_split_reward_compares_returns_to_go() -> None:
    # E1 [0.1, 0.9] -> [1.0, 0.9]; E2 [0.2, -0.2] -> [0.0, -0.2]; both through a then b
    e1, e2 = state_advantages([[1.0, 0.9], [0.0, -0.2]], [["a", "b"], ["a", "b"]],
                              std_normalize=False, eps=1e-6)
    assert e1 == pytest.approx([0.5, 0.55]) and e2 == pytest.approx([-0.5, -0.55])


def test_episode_returns_equal_but_for_rounding_do_not_scale_the_turns() -> None:
    # both episodes end at -0.35 (one summed to -0.35000000000000003): the returns'
    # "std" is rounding, so the turns are only centred (a std of 6e-17 + eps made these
    # advantages 1e5 and a gradient norm of 7e3)
    e1, e2 = state_advantages([[-0.05 * 5 + -0.05 * 2, -0.2], [-0.35, -0.3]],
                              [["a", "b"], ["a", "b"]], std_normalize=True, eps=1e-6)
    assert e1 == pytest.approx([0.0, 0.05]) and e2 == pytest.approx([0.0, -0.05])


def test_one_key_per_turn_or_a_clear_error() -> None:
    with pytest.raises(ValueError, match="one state key per turn"):
        state_advantages([[1.0, 1.0]], [["a"]], std_normalize=False, eps=1e-6)


def trajectory(index: int, prompts: list[int], reward: float) -> rollout_pb2.Trajectory:
    """One segment per turn: its prompt token, then the answer token 9."""
    n = len(prompts)
    return rollout_pb2.Trajectory(
        index=index, token_ids=[tok for p in prompts for tok in (p, 9)],
        loss_mask=[0, 1] * n, logprobs=[0.0, -0.5] * n,
        segment_starts=list(range(0, 2 * n, 2)), reward=reward, reward_name="task",
        adapter=rollout_pb2.Trajectory().adapter)


def test_turns_are_keyed_by_their_prompt_not_their_answer() -> None:
    t = trajectory(0, [10, 11, 10], 1.0)
    keys = segment_prompts(t)
    assert keys[0] == keys[2] != keys[1]


def test_each_row_carries_its_states_advantage_from_the_episode_reward() -> None:
    # T0 solves from prompts 10 then 11, T1 fails from 10 then 12: prompt 10's baseline is
    # 0.5; 11 and 12 were seen once (no baseline, 0)
    cfg = GRPOConfig(credit="state", std_normalize=False)
    groups = [("g", [trajectory(0, [10, 11], 1.0), trajectory(1, [10, 12], 0.0)])]
    rows, stats, _ = build_rows(groups, 0, cfg)
    assert stats.num_kept == 2
    assert [r.advantage for r in rows] == pytest.approx([0.5, 0.0, -0.5, 0.0])


def test_a_reward_split_over_the_turns_gives_the_returns_to_go() -> None:
    # T0 splits [0.25, 0.75] (returns-to-go [1.0, 0.75]), T1 [0.0, 0.0]; both from prompt
    # 10 then 11: baselines 0.5 and 0.375
    cfg = GRPOConfig(credit="state", std_normalize=False)
    t0, t1 = trajectory(0, [10, 11], 1.0), trajectory(1, [10, 11], 0.0)
    t0.turn_rewards[:] = [0.25, 0.75]
    t1.turn_rewards[:] = [0.0, 0.0]
    rows, _, _ = build_rows([("g", [t0, t1])], 0, cfg)
    assert [r.advantage for r in rows] == pytest.approx([0.5, 0.375, -0.5, -0.375])


def test_a_split_of_the_wrong_length_is_refused() -> None:
    # a reward that split two turns into three parts disagrees with the rollout on the
    # turns: no guessing which turn a part belongs to
    cfg = GRPOConfig(credit="state", std_normalize=False)
    t0, t1 = trajectory(0, [10, 11], 1.0), trajectory(1, [10, 12], 0.0)
    t0.turn_rewards[:] = [0.2, 0.3, 0.5]
    with pytest.raises(NoTurnRewards, match="'state'.* 3 turn rewards for 2 turns"):
        build_rows([("g", [t0, t1])], 0, cfg)
