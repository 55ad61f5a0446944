"""The built-in progress reward: a solve pays 1, a non-solve half the fraction of the BFS
distance it closed, so a group of time-outs on a long maze still differs; and its split
over the turns (each move's share of the distance, the solving stop the rest)."""

from __future__ import annotations

import pytest

from rlfleet.maze import generate_layout, oracle_texts
from rlfleet.maze.oracle import distance_to_target
from rlfleet.reward import Episode
from rlfleet.reward.builtin import ProgressReward
from rlfleet.tasks import default_tasks
from rlfleet.v1 import common_pb2

SEED, SIZE = 3, 9


def score(actions: list[str]):
    spec = common_pb2.TaskSpec(task="maze_2d", seed=SEED, size=SIZE, max_turns=100)
    replayed, steps = default_tasks(discover=False).replay(spec, actions)
    return ProgressReward().score(Episode(spec, tuple(actions), common_pb2.EpisodeState(),
                                          replayed, tuple(steps)))


def test_a_solve_scores_one_split_over_its_moves_and_the_stop() -> None:
    texts = oracle_texts(generate_layout(SEED, SIZE))
    s = score(texts)
    assert s.solved and s.reward == 1.0
    assert dict(s.components) == {"task": 1.0, "progress": 1.0}
    moves = len(texts) - 1
    assert s.turn_rewards == pytest.approx([0.5 / moves] * moves + [0.5])
    assert sum(s.turn_rewards) == pytest.approx(1.0)


@pytest.mark.parametrize("moves", [1, 3, 5])
def test_part_of_the_way_scores_half_the_fraction_closed(moves: int) -> None:
    path = oracle_texts(generate_layout(SEED, SIZE))[:-1]  # the moves, not the stop
    start = distance_to_target(generate_layout(SEED, SIZE))
    s = score(path[:moves])
    assert not s.solved
    assert s.components["progress"] == pytest.approx(moves / start)
    assert s.reward == pytest.approx(0.5 * moves / start)


def test_on_the_target_without_the_stop_scores_below_a_solve() -> None:
    path = oracle_texts(generate_layout(SEED, SIZE))[:-1]
    s = score(path)
    assert not s.solved and s.reward == 0.5


@pytest.mark.parametrize("actions", [[], ["garbage"] * 5, ["('stop', 'stop')"]])
def test_no_progress_scores_zero(actions: list[str]) -> None:
    s = score(actions)
    assert not s.solved and s.reward == 0.0


def test_a_step_away_and_back_nets_nothing_and_a_bump_earns_nothing() -> None:
    layout = generate_layout(SEED, SIZE)
    path = oracle_texts(layout)[:-1]
    start = distance_to_target(layout)
    opposite = {"('move', 0)": "('move', 2)", "('move', 2)": "('move', 0)",
                "('move', 1)": "('move', 3)", "('move', 3)": "('move', 1)"}
    s = score([path[0], opposite[path[0]], "garbage"])
    assert s.turn_rewards == pytest.approx([0.5 / start, -0.5 / start, 0.0])
    assert s.reward == pytest.approx(0.0) and not s.solved


def test_its_scores_pass_the_services_checks() -> None:
    texts = oracle_texts(generate_layout(SEED, SIZE))
    for actions in (texts, texts[:3], ["garbage"] * 4):
        s = score(actions)
        assert s.checked("test", ProgressReward.reward_range, len(actions)) is s
