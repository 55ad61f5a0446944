"""The action parser never raises, whatever a reply holds: huge numeric literals (past
Python's 4300-digit limit on int <-> str), deep nesting, odd unicode, in every format.
A direct client's Step with such an action gets feedback from the real env service, not
INTERNAL.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlfleet.maze.actions import FORMAT_PROFILES, MAX_QUOTE_CHARS, parse_action

FORMATS = tuple(FORMAT_PROFILES.names())

_DIGITS = {"0x": "0123456789abcdefABCDEF", "0o": "01234567", "0b": "01", "": "0123456789"}


@st.composite
def numeric_literals(draw: st.DrawFn) -> str:
    """Int, float and complex literals from one digit to past the scan window, with
    underscores, signs and prefixes."""
    prefix = draw(st.sampled_from(sorted(_DIGITS)))
    n = draw(st.one_of(st.integers(1, 64), st.integers(4000, 9000)))
    digits = draw(st.text(_DIGITS[prefix], min_size=1, max_size=8)) * (n // 8 + 1)
    body = prefix + ("1" if not prefix else "") + digits[:n]
    sign = draw(st.sampled_from(["", "-", "+", "--", "~"]))
    suffix = "" if prefix else draw(st.sampled_from(["", ".5", "e3", "j", "e99999"]))
    return sign + body + suffix


@st.composite
def nested(draw: st.DrawFn) -> str:
    """A move or stop tuple buried under deep brackets, unary operators or `not`s."""
    depth = draw(st.integers(1, 5000))
    inner = draw(st.sampled_from(["'move', 0", "'stop', 'stop'", "move, 1", "0", ""]))
    opener, closer = draw(st.sampled_from([("(", ")"), ("[", "]"), ("{", "}"),
                                           ("(", ""), ("", ")"), ("-", ""), ("not ", ""),
                                           ("('move', ", ")"), ("lambda: ", "")]))
    return opener * depth + inner + closer * depth


odd_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=300)

REPLIES = st.one_of(
    numeric_literals().map(lambda lit: f"('move', {lit})"),
    numeric_literals().map(lambda lit: f"('stop', {lit})"),
    numeric_literals().map(lambda lit: f"({lit}, 0)"),
    numeric_literals(),
    nested(),
    odd_text,
    st.tuples(odd_text, numeric_literals(), odd_text).map(
        lambda t: f"{t[0]}('move', {t[1]}){t[2]}"),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
)


def _check(reply: str, fmt: str) -> None:
    parsed = parse_action(reply, fmt)
    assert parsed.ok or parsed.error  # an action, or a sentence for the feedback
    assert len(parsed.error) <= 3 * MAX_QUOTE_CHARS + 300  # the feedback stays bounded


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(reply=REPLIES, fmt=st.sampled_from(FORMATS))
def test_parse_action_never_raises(reply: str, fmt: str) -> None:
    _check(reply, fmt)


@pytest.mark.parametrize("make", [
    lambda: "('move', 0x" + "f" * 4096 + ")",  # the 4 KB hex literal a direct client sent
    lambda: "('move', -0x" + "f" * 8000 + ")",
    lambda: "('stop', 0b" + "1" * 8000 + ")",
    lambda: "('move', 0o" + "7" * 8000 + ")",
    lambda: "(0x" + "f" * 5000 + ", 1)",  # a huge action name
    lambda: "('move', " + "9" * 5000 + ")",  # past the limit in decimal: literal_eval refuses
    lambda: "('move', " + "(" * 3000 + "0" + ")" * 3000 + ")",
    lambda: "-" * 8000 + "1",
    lambda: "not " * 2000 + "1",
    lambda: "[" * 8191,
    lambda: "\udcff\U0010ffff\u202e('move', 1)\x00",
])
def test_hostile_replies_get_feedback(make: Callable[[], str]) -> None:
    for fmt in FORMATS:
        _check(make(), fmt)


def test_a_huge_payload_is_quoted_in_hex_and_bounded() -> None:
    parsed = parse_action("('move', 0x" + "f" * 4096 + ")")
    assert not parsed.ok
    assert "0xfff" in parsed.error and "..." in parsed.error
    assert "not in the valid action space of move" in parsed.error


def test_a_direct_client_step_with_a_huge_literal_gets_feedback(start_env: Callable) -> None:
    """The real env service over loopback: the step answers with feedback, not INTERNAL."""
    from rlfleet.clients.env import EnvClient
    from rlfleet.v1 import common_pb2, env_pb2

    env = start_env()
    with EnvClient(env.address) as client:
        spec = common_pb2.TaskSpec(task="maze_2d", seed=1, size=7)
        (opened,) = client.open([spec])
        action = env_pb2.Action(episode_id=opened.episode_id,
                                text="('move', 0x" + "f" * 4096 + ")")
        (result,) = client.step([action])
        assert "not in the valid action space" in result.observation.feedback
        assert len(result.observation.feedback.encode()) <= 1024
