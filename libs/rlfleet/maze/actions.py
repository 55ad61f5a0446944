"""Turning model text into maze actions, and actions back into text.

Two formats are understood:

- ``literal`` (VisGym's own): a Python tuple ``('move', k)`` with k = 0 right, 1 up,
  2 left, 3 down, or ``('stop', 'stop')``. Models wrap it in prose or code fences, so the
  *last* tuple-looking span that names move/stop is cut out and read with
  `ast.literal_eval` (never `eval`).
- ``tags``: ``<action>up</action>`` with right/up/left/down/stop, case-insensitive; the
  last such tag counts.

`parse_action` never raises: anything it cannot read (garbage, binary-ish text, huge
strings, wrong payloads) comes back with `format is None` and a short `error` that the
episode turns into feedback. Only the last `MAX_SCAN_CHARS` characters are looked at:
the action is expected at the end of a reply, and this bounds the work per step.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from enum import StrEnum

from rlfleet.maze.layout import DIRECTION_DELTAS, Position

MAX_SCAN_CHARS = 8192

DIRECTION_NAMES: tuple[str, ...] = ("right", "up", "left", "down")
UNPARSED = "unparsed"


class ActionFormat(StrEnum):
    """How a model is asked to write its actions."""

    LITERAL = "literal"
    TAGS = "tags"


@dataclass(frozen=True)
class Action:
    """`kind` is "move" (with `direction` 0..3, VisGym's codes) or "stop" (direction None)."""

    kind: str
    direction: int | None = None

    def __post_init__(self) -> None:
        if self.kind == "move":
            if (
                isinstance(self.direction, bool)
                or not isinstance(self.direction, int)
                or not 0 <= self.direction <= 3
            ):
                raise ValueError(f"move direction must be 0..3, got {self.direction!r}")
        elif self.kind == "stop":
            if self.direction is not None:
                raise ValueError("stop takes no direction")
        else:
            raise ValueError(f"action kind must be 'move' or 'stop', got {self.kind!r}")

    @classmethod
    def move(cls, direction: int) -> Action:
        return cls("move", direction)

    @classmethod
    def stop(cls) -> Action:
        return cls("stop")

    @property
    def is_stop(self) -> bool:
        return self.kind == "stop"

    @property
    def delta(self) -> Position:
        """(row, col) step of a move; (0, 0) for stop."""
        return (0, 0) if self.direction is None else DIRECTION_DELTAS[self.direction]

    @property
    def name(self) -> str:
        """ "right"/"up"/"left"/"down"/"stop"."""
        return "stop" if self.direction is None else DIRECTION_NAMES[self.direction]


@dataclass(frozen=True)
class ParsedAction:
    """The outcome of reading one reply. `format` is None when nothing could be read."""

    action: Action | None
    format: ActionFormat | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.action is not None

    @property
    def matched(self) -> str:
        """ "literal", "tags" or "unparsed" (for logs and metrics)."""
        return UNPARSED if self.format is None else self.format.value


# A parenthesised span starting with a quoted move/stop name. Bounded and without nested
# parentheses, so matching stays linear and literal_eval only ever sees short input.
_LITERAL_SPAN = re.compile(r"""\(\s*(['"])(?:move|stop)\1\s*,[^()\n]{0,40}\)""")
_TAG_SPAN = re.compile(r"<action>\s*(right|up|left|down|stop)\s*</action>", re.IGNORECASE)


@dataclass(frozen=True)
class _Match:
    end: int
    parsed: ParsedAction


def _last_literal(text: str) -> _Match | None:
    spans = list(_LITERAL_SPAN.finditer(text))
    if not spans:
        return None
    span = spans[-1]
    try:
        value = ast.literal_eval(span.group(0))
    except Exception as exc:  # literal_eval raises many types; none may escape
        error = f"could not read {span.group(0)!r} as a Python tuple ({type(exc).__name__})"
        return _Match(span.end(), ParsedAction(None, None, error))
    return _Match(span.end(), _from_literal(value, span.group(0)))


def _from_literal(value: object, source: str) -> ParsedAction:
    if not isinstance(value, tuple) or len(value) != 2:
        return ParsedAction(None, None, f"{source!r} is not a 2-tuple")
    name, payload = value
    if name == "move":
        if isinstance(payload, int) and not isinstance(payload, bool) and 0 <= payload <= 3:
            return ParsedAction(Action.move(payload), ActionFormat.LITERAL)
        return ParsedAction(
            None,
            None,
            f"move direction must be 0 (right), 1 (up), 2 (left) or 3 (down), got {payload!r}",
        )
    if payload == "stop":
        return ParsedAction(Action.stop(), ActionFormat.LITERAL)
    return ParsedAction(None, None, f"stop must be written ('stop', 'stop'), got {source!r}")


def _last_tag(text: str) -> _Match | None:
    last = None
    for last in _TAG_SPAN.finditer(text):  # noqa: B007 - we want the final match
        pass
    if last is None:
        return None
    word = last.group(1).lower()
    action = Action.stop() if word == "stop" else Action.move(DIRECTION_NAMES.index(word))
    return _Match(last.end(), ParsedAction(action, ActionFormat.TAGS))


def parse_action(text: object, prefer: ActionFormat | None = None) -> ParsedAction:
    """Read the action in a model reply; never raises.

    When both formats appear, `prefer` wins if it matched; otherwise the action written
    last in the text wins. A literal span that is malformed (e.g. ``('move', 7)``) is an
    error unless a tag supplies a valid action.
    """
    if not isinstance(text, str):
        return ParsedAction(None, None, f"expected text, got {type(text).__name__}")
    scanned = text[-MAX_SCAN_CHARS:]
    literal = _last_literal(scanned)
    tag = _last_tag(scanned)
    candidates = [m for m in (literal, tag) if m is not None and m.parsed.ok]
    if candidates:
        if prefer is not None:
            for match in candidates:
                if match.parsed.format == prefer:
                    return match.parsed
        return max(candidates, key=lambda m: m.end).parsed
    if literal is not None:
        return literal.parsed
    return ParsedAction(
        None,
        None,
        "no action found; write ('move', k) with k 0=right 1=up 2=left 3=down, "
        "('stop', 'stop'), or <action>right|up|left|down|stop</action>",
    )


def format_action(action: Action, fmt: ActionFormat | str = ActionFormat.LITERAL) -> str:
    """The canonical text of `action` in `fmt` (what the oracle teaches in SFT)."""
    fmt = ActionFormat(fmt)
    if fmt is ActionFormat.TAGS:
        return f"<action>{action.name}</action>"
    if action.is_stop:
        return "('stop', 'stop')"
    return f"('move', {action.direction})"
