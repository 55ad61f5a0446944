"""Reading actions from model text in both formats; garbage never raises."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.maze import Action, ActionFormat, format_action, parse_action
from rlfleet.maze.actions import MAX_SCAN_CHARS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("('move', 0)", Action.move(0)),
        ("('move', 1)", Action.move(1)),
        ('("move", 2)', Action.move(2)),
        ("  ('move',3)\n", Action.move(3)),
        ("('stop', 'stop')", Action.stop()),
        ("I will go up. Action: `('move', 1)`", Action.move(1)),
        ("first ('move', 0) then ('move', 3)", Action.move(3)),  # the last one counts
        ("```python\n('stop', 'stop')\n```", Action.stop()),
    ],
)
def test_literal_format(text: str, expected: Action) -> None:
    parsed = parse_action(text)
    assert parsed.action == expected
    assert parsed.format is ActionFormat.LITERAL and parsed.matched == "literal"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<action>right</action>", Action.move(0)),
        ("<action>up</action>", Action.move(1)),
        ("<action> LEFT </action>", Action.move(2)),
        ("<ACTION>Down</ACTION>", Action.move(3)),
        ("<action>stop</action>", Action.stop()),
        ("thinking... <action>up</action> no wait <action>down</action>", Action.move(3)),
    ],
)
def test_tag_format(text: str, expected: Action) -> None:
    parsed = parse_action(text)
    assert parsed.action == expected and parsed.format is ActionFormat.TAGS


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello",
        "move right",
        "('move', 4)",
        "('move', -1)",
        "('move', True)",
        "('move', '1')",
        "('move', 1.0)",
        "('stop', 'go')",
        "('jump', 1)",
        "('move', 1",
        "('move', 1, 2)",
        "<action>north</action>",
        "<action>up",
        "\x00\xff" * 1000,
        "(" * 5000 + ")" * 5000,
        "[" * 3000 + "'move', 1" + "]" * 3000,
    ],
)
def test_garbage_is_unparsed(text: str) -> None:
    parsed = parse_action(text)
    assert parsed.action is None and parsed.format is None
    assert parsed.matched == "unparsed" and parsed.error


def test_deep_nesting_reads_the_inner_tuple() -> None:
    assert parse_action("(" * 5000 + "'move', 1" + ")" * 5000).action == Action.move(1)


def test_non_text_is_unparsed() -> None:
    assert parse_action(b"('move', 1)").matched == "unparsed"  # type: ignore[arg-type]
    assert parse_action(None).matched == "unparsed"  # type: ignore[arg-type]


def test_prefer_and_last_match() -> None:
    text = "<action>left</action> ('move', 0)"
    assert parse_action(text).action == Action.move(0)  # written last
    assert parse_action(text, prefer=ActionFormat.TAGS).action == Action.move(2)
    # A malformed literal does not hide a valid tag.
    assert parse_action("<action>up</action> ('move', 9)").action == Action.move(1)


def test_only_the_tail_is_scanned() -> None:
    assert parse_action("x" * (MAX_SCAN_CHARS * 4) + "('move', 2)").action == Action.move(2)
    assert parse_action("('move', 2)" + "x" * MAX_SCAN_CHARS).action is None


@pytest.mark.parametrize("fmt", list(ActionFormat))
def test_format_round_trip(fmt: ActionFormat) -> None:
    for action in [Action.move(d) for d in range(4)] + [Action.stop()]:
        parsed = parse_action(format_action(action, fmt))
        assert parsed.action == action and parsed.format is fmt
    assert format_action(Action.move(1)) == "('move', 1)"
    assert format_action(Action.stop(), "tags") == "<action>stop</action>"


def test_action_validation() -> None:
    for bad in [("move", 4), ("move", None), ("stop", 1), ("fly", None), ("move", True)]:
        with pytest.raises(ValueError):
            Action(*bad)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000))
def test_random_text_never_raises(text: str) -> None:
    parsed = parse_action(text)
    assert parsed.matched in {"literal", "tags", "unparsed"}
    assert (parsed.action is None) == (parsed.format is None)


@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=300),
    st.sampled_from(["('move', 0)", "('move', 3)", "('stop', 'stop)", "('move', (", "<action>"]),
    st.text(max_size=300),
)
def test_random_text_around_fragments_never_raises(before: str, middle: str, after: str) -> None:
    parse_action(before + middle + after)
