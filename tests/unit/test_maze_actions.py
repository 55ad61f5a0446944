"""Reading actions from model text in each format; garbage never raises.

The literal format is read exactly as VisGym plays maze_2d (its harness picks the last
action tuple of a reply, its env checks the payload against `Discrete(4)` / `Text(4)`);
the tests marked "VisGym:" pin each behaviour where rlfleet used to differ, and the ones
marked "bound:" the few places where rlfleet departs from VisGym on purpose.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.maze import Action, ActionFormat, format_action, parse_action
from rlfleet.maze.actions import (
    FORMAT_ERROR,
    MAX_SCAN_CHARS,
    TAG_ERROR,
    harness_extract,
    resolve_format,
)


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
    parsed = parse_action(text, "tags")
    assert parsed.action == expected and parsed.format is ActionFormat.TAGS


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello",
        "move right",
        "('move', 4)",
        "('move', -1)",
        "('move', '1')",
        "('move', 1.0)",
        "('stop', 'stop!')",
        "('jump', 1)",
        "('move', 1",
        "('move', 1, 2)",
        "<action>north</action>",
        "<action>up</action>",  # VisGym: not a Python literal
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


def test_each_format_reads_only_its_own_syntax() -> None:
    text = "<action>left</action> ('move', 0)"
    assert parse_action(text).action == Action.move(0)
    assert parse_action(text, "tags").action == Action.move(2)
    assert parse_action("('move', 0)", "tags").error == TAG_ERROR
    assert parse_action("<action>up</action>", "literal").action is None


def test_only_the_tail_is_scanned() -> None:
    """bound: only the last MAX_SCAN_CHARS characters are read."""
    assert parse_action("x" * (MAX_SCAN_CHARS * 4) + "('move', 2)").action == Action.move(2)
    assert parse_action("('move', 2)" + "x" * MAX_SCAN_CHARS).action is None


@pytest.mark.parametrize("fmt", ["literal", "tags", "visgym"])
def test_format_round_trip(fmt: str) -> None:
    syntax, _ = resolve_format(fmt)
    for action in [Action.move(d) for d in range(4)] + [Action.stop()]:
        parsed = parse_action(format_action(action, fmt), fmt)
        assert parsed.action == action and parsed.format is syntax
    assert format_action(Action.move(1)) == "('move', 1)"
    assert format_action(Action.stop(), "tags") == "<action>stop</action>"
    assert format_action(Action.stop(), "visgym") == "('stop', 'stop')"


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="literal"):
        parse_action("('move', 0)", "json")


# -- VisGym: each difference the differential run found, and VisGym's messages -----------


def test_visgym_tags_are_invalid_in_the_literal_format() -> None:
    parsed = parse_action("<action>up</action>")
    assert parsed.action is None and parsed.matched == "unparsed"
    assert parsed.error == (
        "Cannot parse action string '<action>up</action>': invalid syntax (<unknown>, line 1)"
        " so the action is invalid."
    )


@pytest.mark.parametrize("payload", ["stop", "STOP", "ok", "X", "a1b2", "0", "zz9Z"])
def test_visgym_stop_takes_any_one_to_four_alphanumerics(payload: str) -> None:
    assert parse_action(f"('stop', {payload!r})").action == Action.stop()


@pytest.mark.parametrize(
    "payload", ["''", "'stops'", "'st p'", "'st-p'", "'st\u00f6p'", "'\uff11'", "1", "None",
                "['stop']", "b'stop'"],
)
def test_visgym_stop_payload_outside_text4_is_invalid(payload: str) -> None:
    parsed = parse_action(f"('stop', {payload})")
    assert parsed.action is None
    assert parsed.error.startswith("The action ") and parsed.error.endswith(
        " is not in the valid action space of stop so nothing is executed.")


def test_visgym_stop_message_quotes_the_payload_as_visgym_prints_it() -> None:
    assert parse_action("('stop', 'go!')").error == (
        "The action go! is not in the valid action space of stop so nothing is executed.")


@pytest.mark.parametrize(("payload", "direction"),
                         [("True", 1), ("False", 0), ("0x3", 3), ("-0", 0), ("+2", 2)])
def test_visgym_move_takes_any_int_and_bool_is_an_int(payload: str, direction: int) -> None:
    assert parse_action(f"('move', {payload})").action == Action.move(direction)


@pytest.mark.parametrize("payload", ["4", "-1", "1.0", "'1'", "None", "[1]", "1j"])
def test_visgym_move_payload_outside_discrete4_is_invalid(payload: str) -> None:
    parsed = parse_action(f"('move', {payload})")
    assert parsed.action is None
    assert parsed.error.endswith(" is not in the valid action space of move so nothing is "
                                 "executed.")


def test_visgym_move_payload_too_big_for_int64_is_invalid() -> None:
    """bound: VisGym's Discrete.contains raises OverflowError here (the step crashes)."""
    parsed = parse_action(f"('move', {2**64})")
    assert parsed.action is None and "valid action space of move" in parsed.error


@pytest.mark.parametrize(("text", "expected"), [
    ("'move', 0", Action.move(0)),
    ("  'move', 3\n", Action.move(3)),
    ("'stop', 'stop'", Action.stop()),
    ('"move", 2', Action.move(2)),
])
def test_visgym_a_tuple_without_parentheses_is_valid(text: str, expected: Action) -> None:
    assert harness_extract(text) == text  # no tuple in it: the harness passes it on
    assert parse_action(text).action == expected


def test_visgym_harness_quotes_a_bare_action_name() -> None:
    assert harness_extract("I pick (move, 0).") == "('move', 0)"
    assert parse_action("I pick (move, 0).").action == Action.move(0)


def test_visgym_harness_takes_the_last_action_tuple_even_an_invalid_one() -> None:
    assert parse_action("('move', 1) or maybe ('mo',)").error == FORMAT_ERROR
    assert parse_action("('move', 1) then (not a tuple)").action == Action.move(1)
    assert parse_action("((('move', 2)))").action == Action.move(2)
    assert harness_extract("go (1, 2) ('stop', 'stop') (3)") == "('stop', 'stop')"


def test_visgym_harness_cleans_fences_backticks_and_labels() -> None:
    assert harness_extract("```python\n('move',\n   1)\n```") == "('move', 1)"
    assert harness_extract("Action: `('move', 1)`") == "('move', 1)"
    assert harness_extract("<|begin_of_box|>('stop', 'stop')<|end_of_box|>") == \
        "('stop', 'stop')"


@pytest.mark.parametrize(("text", "error"), [
    ("['move', 0]", FORMAT_ERROR),
    ("('move', 0, 1)", FORMAT_ERROR),
    ("'move'", FORMAT_ERROR),
    ("('jump', 1)", "The action name 'jump' is not recognized in the available action space."),
    ("1, 2", "The action name '1' is not recognized in the available action space."),
    ("hello", "Cannot parse action string 'hello': malformed node or string on line 1: "
              "<ast.Name object> so the action is invalid."),
    ("('move', 1", "Cannot parse action string \"('move', 1\": '(' was never closed "
                   "(<unknown>, line 1) so the action is invalid."),
])
def test_visgym_invalid_action_messages(text: str, error: str) -> None:
    parsed = parse_action(text)
    assert parsed.action is None and parsed.error == error


def test_messages_are_bounded_and_the_same_on_every_run() -> None:
    """bound: at most MAX_QUOTE_CHARS of the reply is quoted; no object addresses."""
    for text in ["x" * 8000, "(" * 3000, f"('stop', {'a' * 5000!r})", "\x00\xff" * 1000]:
        error = parse_action(text).error
        assert error and len(error.encode()) <= 1024
        assert " at 0x" not in error
        assert parse_action(text).error == error


def test_action_validation() -> None:
    for bad in [("move", 4), ("move", None), ("stop", 1), ("fly", None), ("move", True)]:
        with pytest.raises(ValueError):
            Action(*bad)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000), st.sampled_from(["literal", "tags"]))
def test_random_text_never_raises(text: str, fmt: str) -> None:
    parsed = parse_action(text, fmt)
    assert parsed.matched in {"literal", "tags", "unparsed"}
    assert (parsed.action is None) == (parsed.format is None)


@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=300),
    st.sampled_from(["('move', 0)", "('move', 3)", "('stop', 'stop)", "('move', (", "<action>"]),
    st.text(max_size=300),
)
def test_random_text_around_fragments_never_raises(before: str, middle: str, after: str) -> None:
    parsed = parse_action(before + middle + after)
    assert parsed.ok or len(parsed.error.encode()) <= 1024
