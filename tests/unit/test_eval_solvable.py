"""The turn cap check: how many eval mazes a turn limit leaves unsolvable, the limit they
need, the learner's refusal unless the config accepts the cap, and the table that then
states it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rlfleet.config import ConfigError
from rlfleet.evaluation.play import eval_sets
from rlfleet.evaluation.solvable import config_turn_caps, turn_cap, turn_caps
from rlfleet.evaluation.summary import summarize
from rlfleet.evaluation.table import comparison_table
from rlfleet.learner_config import LearnerConfig, load_learner_config, updated
from rlfleet.maze.difficulty import shortest_moves
from rlfleet.maze.tasks import EVAL_SEEDS


def test_the_published_runs_limit_leaves_14_of_the_64_eval_mazes_unsolvable() -> None:
    cap = turn_cap("eval", EVAL_SEEDS, 9, 15)
    assert (cap.mazes, cap.unsolvable, cap.turns_needed) == (64, 14, 17)
    assert cap.ceiling == pytest.approx(50 / 64)
    assert "14 of the 64 eval mazes cannot be solved in 15 turns" in cap.describe()
    assert "need up to 17" in cap.describe() and "78.1%" in cap.describe()
    # the ones it names are exactly those whose shortest solution + stop is over 15
    assert cap.unsolvable == sum(shortest_moves(s, 9) + 1 > 15 for s in EVAL_SEEDS)


def test_visgyms_limits_solve_every_eval_maze_but_one_at_11x11() -> None:
    assert turn_cap("eval", EVAL_SEEDS, 9, 20).unsolvable == 0
    assert turn_cap("eval", EVAL_SEEDS, 9, 0).max_turns == 20  # 0: VisGym's for the size
    hard = turn_cap("eval", EVAL_SEEDS, 11, 0)
    assert (hard.max_turns, hard.unsolvable, hard.turns_needed) == (30, 1, 33)


def test_a_task_without_mazes_is_not_checked() -> None:
    assert turn_caps("not-a-maze", eval_sets(64, 0), 9, 1) == []


def config(max_turns: int, accept: bool = False, heldout: int = 0) -> LearnerConfig:
    return LearnerConfig(data={"size": 9, "max_turns": max_turns},
                         eval={"eval_seeds": 64, "heldout_seeds": heldout,
                               "accept_turn_cap": accept})


def test_the_learner_refuses_a_capped_eval_set_naming_the_numbers() -> None:
    with pytest.raises(ConfigError) as err:
        config_turn_caps(config(15, heldout=256))
    text = str(err.value)
    assert "14 of the 64 eval mazes cannot be solved in 15 turns" in text
    assert "set data.max_turns to 17 or more" in text and "eval.accept_turn_cap" in text
    assert config_turn_caps(config(20)) == []


def test_a_capped_held_out_set_is_stated_not_refused() -> None:
    # VisGym's own 20 turns leave the longest 9x9 held-out mazes unsolvable
    (cap,) = config_turn_caps(config(20, heldout=256))
    assert (cap.name, cap.unsolvable, cap.turns_needed) == ("heldout", 15, 25)
    assert cap.describe().startswith("15 of the 256 held-out mazes cannot be solved")


def test_an_accepted_cap_is_returned_for_the_tables() -> None:
    eval_cap, heldout_cap = config_turn_caps(config(15, accept=True, heldout=256))
    assert (eval_cap.name, eval_cap.unsolvable) == ("eval", 14)
    assert (heldout_cap.name, heldout_cap.unsolvable) == ("heldout", 84)


def episode(solved: bool, reward: float, turns: int) -> SimpleNamespace:
    return SimpleNamespace(final_state=SimpleNamespace(solved=solved), reward=reward,
                           turns=[None] * turns)


def test_the_table_shows_the_seeds_metric_beside_the_true_solve_rate_and_the_cap() -> None:
    # a format reward pays 0.2 a failure: pass@1 (reward > 0) counts it, true solve not
    before = {"eval": summarize([episode(True, 1.0, 13), episode(False, 0.2, 15),
                                 episode(False, 0.0, 15), episode(False, 0.2, 15)])}
    after = {"eval": summarize([episode(True, 1.0, 13)] * 3 + [episode(False, 0.2, 15)])}
    cap = turn_cap("eval", EVAL_SEEDS, 9, 15).describe()
    lines = comparison_table([("before", before), ("after", after)], [cap]).splitlines()
    assert lines[0].split() == ["before", "after", "change"]
    solve = next(line for line in lines if "true solve" in line and "eval mazes" in line)
    assert solve.split()[-3:] == ["25.0%", "75.0%", "+50.0pt"]
    seed = next(line for line in lines if "pass@1 (reward > 0, the seed's metric)" in line)
    assert seed.split()[-3:] == ["75.0%", "100.0%", "+25.0pt"]
    assert lines[-1] == f"turn cap: {cap}"


CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_the_production_config_solves_its_eval_set_and_the_seed_overlay_knows_its_cap(
        ) -> None:
    production = load_learner_config(CONFIGS / "qwen3-vl-8b-hyperpod.yaml", env={})
    assert config_turn_caps(production) == []
    seed = load_learner_config(CONFIGS / "qwen3-vl-8b-seed.yaml", env={})
    # the published run's settings, nothing else changed
    assert (seed.data.max_turns, seed.reward) == (15, "format+task")
    assert updated(seed, {"data": {"max_turns": 20}, "reward": "task",
                          "eval": {"accept_turn_cap": False}}) == production
    (cap,) = config_turn_caps(seed)
    assert (cap.unsolvable, cap.turns_needed) == (14, 17)
    with pytest.raises(ConfigError, match="14 of the 64 eval mazes"):
        config_turn_caps(updated(seed, {"eval": {"accept_turn_cap": False}}))


def test_the_11x11_overlay_plays_visgyms_hard_mazes_at_its_limit() -> None:
    hard = load_learner_config(CONFIGS / "qwen3-vl-8b-11x11.yaml", env={})
    assert (hard.data.size, hard.data.max_turns, hard.data.context) == (11, 30, "visgym")
    assert hard.model.profile == "qwen3-vl-8b-hard"
    (cap,) = config_turn_caps(hard)
    assert (cap.unsolvable, cap.turns_needed) == (1, 33)
