"""The episode state machine: moves, wall bumps, invalid text, stop, turn limit, counters."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from rlfleet.maze import (
    ActionFormat,
    EpisodeDone,
    Layout,
    MazeEpisode,
    default_max_turns,
    generate_layout,
    oracle_texts,
)

# A corridor: agent at the left end, target at the right end, walls above and below.
CORRIDOR = [
    [1, 1, 1, 1, 1],
    [1, 0, 0, 0, 1],
    [1, 1, 1, 1, 1],
    [1, 1, 1, 1, 1],
    [1, 1, 1, 1, 1],
]


def corridor(max_turns: int = 10, fmt: str = "literal") -> MazeEpisode:
    return MazeEpisode(Layout.from_walls(CORRIDOR, (1, 1), (1, 3)), max_turns, fmt)


def test_moves_and_solving_stop() -> None:
    episode = corridor()
    out = episode.step("('move', 0)")
    assert out.moved and out.agent == (1, 2) and out.reward == 0.0 and not out.done
    assert out.feedback == "Moved right." and out.format_ok and out.parsed
    out = episode.step("('move', 0)")
    assert out.agent == (1, 3) and out.reward == 0.0 and not out.done  # no reward yet
    out = episode.step("('stop', 'stop')")
    assert out.reward == 1.0 and out.done and out.solved and not out.truncated
    assert episode.stats.as_dict() == {
        "turns": 3,
        "format_ok_turns": 3,
        "invalid_turns": 0,
        "wall_bumps": 0,
        "moves": 2,
        "stopped": True,
        "solved": True,
        "truncated": False,
    }


def test_wall_bump_keeps_position_and_uses_a_turn() -> None:
    episode = corridor()
    for text in ["('move', 1)", "('move', 2)", "('move', 3)"]:  # up, left, down: walls
        out = episode.step(text)
        assert out.wall_bump and not out.moved and out.agent == (1, 1)
        assert "Cannot move into a wall" in out.feedback
    assert episode.stats.wall_bumps == 3 and episode.stats.turns == 3


def test_invalid_text_uses_a_turn_without_moving() -> None:
    episode = corridor()
    out = episode.step("I am not sure")
    # VisGym's own sentence (object addresses dropped, see rlfleet.maze.actions)
    assert out.feedback.startswith("Cannot parse action string 'I am not sure': ")
    assert out.feedback.endswith(" so the action is invalid.") and not out.parsed
    assert out.action is None and out.matched_format == "unparsed" and not out.format_ok
    assert out.agent == (1, 1) and not out.done
    assert episode.stats.invalid_turns == 1 and episode.stats.turns == 1


def test_stop_off_target_ends_with_zero_reward() -> None:
    episode = corridor()
    out = episode.step("('stop', 'stop')")
    assert out.done and out.reward == 0.0 and not out.solved and not out.truncated
    assert episode.stats.stopped and not episode.stats.solved


def test_turn_limit_truncates() -> None:
    episode = corridor(max_turns=3)
    episode.step("('move', 0)")
    episode.step("('move', 2)")
    out = episode.step("('move', 0)")
    assert out.done and out.truncated and out.reward == 0.0
    assert "Turn limit" in out.feedback and episode.stats.truncated


def test_solving_on_the_last_turn_is_not_truncated() -> None:
    episode = corridor(max_turns=3)
    episode.step("('move', 0)")
    episode.step("('move', 0)")
    out = episode.step("('stop', 'stop')")
    assert out.reward == 1.0 and out.done and not out.truncated


def test_step_after_done_raises() -> None:
    episode = corridor()
    episode.step("('stop', 'stop')")
    with pytest.raises(EpisodeDone):
        episode.step("('move', 0)")
    assert episode.stats.turns == 1


def test_the_other_format_is_an_invalid_action() -> None:
    episode = corridor(fmt="tags")
    out = episode.step("('move', 0)")
    assert not out.moved and not out.parsed and out.matched_format == "unparsed"
    assert out.feedback.startswith("Invalid action: no action tag found")
    out = episode.step("<action>right</action>")
    assert out.moved and out.format_ok
    out = episode.step("<action>right</action>")
    out = episode.step("<action>STOP</action>")
    assert out.reward == 1.0
    assert episode.stats.format_ok_turns == 3 and episode.stats.invalid_turns == 1
    literal = corridor()
    out = literal.step("<action>right</action>")  # VisGym: not a Python literal
    assert not out.moved and not out.parsed and out.feedback.startswith(
        "Cannot parse action string '<action>right</action>'")


def test_rlfleet_sentences_are_unchanged_in_the_default_format() -> None:
    """The shipped checkpoint reads these sentences (context frame_only)."""
    episode = corridor(max_turns=4)
    assert episode.feedback == "The episode has started. Make your first move."
    assert episode.step("('move', 0)").feedback == "Moved right."
    assert episode.step("('move', 1)").feedback == "Cannot move into a wall."
    assert episode.step("('move', 2)").feedback == "Moved left."
    assert episode.step("('move', 1)").feedback == (
        "Cannot move into a wall. Turn limit reached; the episode is over.")
    assert corridor().step("('stop', 'stop')").feedback == (
        "You stopped before reaching the target. The episode is over.")


def test_visgym_profile_answers_with_visgyms_sentences() -> None:
    episode = corridor(max_turns=6, fmt="visgym")
    assert episode.action_format == ActionFormat.LITERAL and episode.format_name == "visgym"
    assert "('move', direction)" in episode.instruction  # the literal instruction
    assert episode.feedback == "The episode has started. Make your first move."
    out = episode.step("('move', 0)")
    assert out.moved and out.format_ok and out.feedback == "Action executed successfully."
    out = episode.step("('move', 1)")
    assert out.wall_bump and out.feedback == "Cannot move into a wall."
    out = episode.step("('move', 7)")
    assert out.feedback == ("The action 7 is not in the valid action space of move so "
                            "nothing is executed.")
    out = episode.step("<action>right</action>")
    assert not out.parsed and out.feedback.startswith("Cannot parse action string")
    episode.step("('move', 0)")
    out = episode.step("('stop', 'ok')")  # any Text(4) payload stops
    assert out.solved and out.reward == 1.0 and out.feedback == "Action executed successfully."


def test_visgym_profile_has_no_turn_limit_sentence() -> None:
    episode = corridor(max_turns=1, fmt="visgym")
    out = episode.step("('move', 0)")
    assert out.truncated and out.done and out.feedback == "Action executed successfully."


@pytest.mark.parametrize("fmt", ["literal", "visgym"])
def test_visgym_semantics_in_both_literal_profiles(fmt: str) -> None:
    episode = corridor(fmt=fmt)
    assert episode.step("('move', True)").agent == (1, 1)  # bool is an int: 1 = up, a wall
    assert episode.step("'move', 0").moved  # a tuple without parentheses
    assert not episode.step("<action>right</action>").parsed
    assert episode.step("('move', False)").agent == (1, 3)  # False = 0 = right
    out = episode.step("('stop', 'ab1')")
    assert out.done and out.solved


def test_observation_text_and_picture() -> None:
    episode = corridor(fmt="tags")
    obs = episode.observe()
    assert "<action>up</action>" in obs.instruction and "('move'" not in obs.instruction
    assert "Turns left: 10 of 10" in obs.status
    assert Image.open(io.BytesIO(obs.png)).size == (125, 125)
    episode.step("<action>up</action>")
    obs = episode.observe(cell_px=4)
    assert "Cannot move into a wall" in obs.text and "Turns left: 9 of 10" in obs.text
    assert Image.open(io.BytesIO(obs.png)).size == (20, 20)
    literal = corridor(fmt="literal").observe()
    assert "('move', direction)" in literal.instruction and "('stop', 'stop')" in literal.text


def test_default_turn_limits() -> None:
    assert default_max_turns(9) == 20 and default_max_turns(7) == 20
    assert default_max_turns(11) == 30 and default_max_turns(21) == 30
    assert MazeEpisode(generate_layout(0, 9)).max_turns == 20
    assert MazeEpisode(generate_layout(0, 11)).max_turns == 30


@pytest.mark.parametrize(
    "kwargs", [{"max_turns": 0}, {"max_turns": True}, {"action_format": "json"}, {"cell_px": 0}]
)
def test_bad_episode_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        MazeEpisode(generate_layout(0, 9), **kwargs)


@pytest.mark.parametrize("fmt", ["literal", "tags", "visgym"])
def test_oracle_replay_solves_in_every_format(fmt: str) -> None:
    layout = generate_layout(9, 9)
    episode = MazeEpisode(layout, action_format=fmt)
    for text in oracle_texts(layout, fmt=fmt):
        out = episode.step(text)
    assert out.reward == 1.0 and episode.stats.format_ok_turns == episode.stats.turns
