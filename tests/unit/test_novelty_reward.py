"""The built-in novelty reward: a solve pays 1, every turn that ends on a cell the episode
already stood on costs 0.05, a stop off the target pays for the turns it gave up, and the
split over the turns puts each cost on the turn that paid it (so per-turn credit blames
the step back, not the whole episode)."""

from __future__ import annotations

import pytest

from rlfleet.maze import generate_layout, oracle_texts
from rlfleet.reward import Episode
from rlfleet.reward.builtin import NoveltyReward
from rlfleet.tasks import default_tasks
from rlfleet.v1 import common_pb2

SEED, SIZE = 3, 9
OPPOSITE = {"('move', 0)": "('move', 2)", "('move', 2)": "('move', 0)",
            "('move', 1)": "('move', 3)", "('move', 3)": "('move', 1)"}


def score(actions: list[str]):
    spec = common_pb2.TaskSpec(task="maze_2d", seed=SEED, size=SIZE, max_turns=100)
    replayed, steps = default_tasks(discover=False).replay(spec, actions)
    return NoveltyReward().score(Episode(spec, tuple(actions), common_pb2.EpisodeState(),
                                         replayed, tuple(steps)))


def test_a_straight_solve_scores_one_on_its_stop() -> None:
    texts = oracle_texts(generate_layout(SEED, SIZE))
    s = score(texts)
    assert s.solved and s.reward == 1.0
    assert dict(s.components) == {"task": 1.0, "revisits": 0.0}
    assert s.turn_rewards == pytest.approx([0.0] * (len(texts) - 1) + [1.0])


def test_a_step_back_costs_on_that_turn_and_the_way_on_costs_nothing() -> None:
    path = oracle_texts(generate_layout(SEED, SIZE))
    there, back = path[0], OPPOSITE[path[0]]
    # out, back (a revisit), out again (a revisit), then the rest of the way and the stop
    s = score([there, back, there, *path[1:]])
    assert s.solved and s.components["revisits"] == 2.0
    assert s.turn_rewards[:3] == pytest.approx([0.0, -0.05, -0.05])
    assert s.reward == pytest.approx(0.9)


def test_bumps_and_stray_words_are_turns_spent_on_a_seen_cell() -> None:
    s = score(["garbage", "garbage"])
    assert not s.solved and s.reward == pytest.approx(-0.1)
    assert s.turn_rewards == pytest.approx([-0.05, -0.05])


def test_giving_up_never_scores_above_playing_on() -> None:
    path = oracle_texts(generate_layout(SEED, SIZE))
    there, back = path[0], OPPOSITE[path[0]]
    stop = "('stop', 'stop')"
    at_once = score([stop])  # the stop and the 99 turns it left: 100 x 0.05
    assert not at_once.solved and at_once.reward == pytest.approx(-5.0)
    looping = score([there, back] * 50)  # 99 revisits to the turn limit
    assert looping.reward == pytest.approx(-4.95) and looping.reward > at_once.reward
    later = score([there, back, stop])  # one revisit, then a stop with 97 turns left
    assert later.turn_rewards == pytest.approx([0.0, -0.05, -4.9])
    assert score([]).reward == 0.0


def test_its_scores_pass_the_services_checks() -> None:
    texts = oracle_texts(generate_layout(SEED, SIZE))
    for actions in (texts, texts[:3], ["garbage"] * 4, [texts[0], OPPOSITE[texts[0]]] * 6):
        s = score(actions)
        assert s.checked("test", NoveltyReward.reward_range, len(actions)) is s
