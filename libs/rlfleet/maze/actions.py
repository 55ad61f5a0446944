"""Turning model text into maze actions, and actions back into text.

Each action format reads its own syntax only:

- ``literal`` (VisGym's own, the default): a Python tuple ``('move', k)`` with k = 0
  right, 1 up, 2 left, 3 down, or ``('stop', x)``. It is read exactly as VisGym plays
  maze_2d: its inference harness (``Interactor.parse_output``) first cuts the *last*
  action tuple out of the reply (code fences, backticks and ``Action:`` labels removed;
  ``(move, 0)`` with a bare name is quoted), and the environment (``RandomMaze2DEnv.step``)
  then reads what the harness passed on with `ast.literal_eval` (never `eval`) and checks
  the payload against its action space:

  - ``move`` takes gymnasium's ``Discrete(4)``: any ``int`` 0..3, and ``bool`` is an
    ``int``, so ``('move', True)`` is move 1 (up);
  - ``stop`` takes gymnasium's ``Text(4)``: a ``str`` of 1 to 4 characters, each an ASCII
    letter or digit, so ``('stop', 'stop')``, ``('stop', 'ok')`` and ``('stop', 'X1')``
    all end the episode, ``('stop', '')``, ``('stop', 'stop!')`` and ``('stop', 1)`` do not;
  - with no tuple in the reply the harness passes the whole reply on, so ``'move', 0``
    (a tuple without parentheses) is a valid action;
  - ``<action>up</action>`` is not a Python literal: invalid.

  The error messages are VisGym's own sentences.
- ``tags``: ``<action>up</action>`` with right/up/left/down/stop, case-insensitive; the
  last such tag counts. rlfleet's own format (VisGym has no tag format); literal tuples
  are not read in it.
- ``visgym``: not a syntax of its own but a *profile*: the ``literal`` format in VisGym's
  own harness: VisGym's feedback sentences for every event ("Action executed
  successfully." after a move or a stop), its instruction, step line and JPEG frames, and
  the reply cut to its ``<answer>`` first (`rlfleet.maze.episode`, `rlfleet.maze.visgym`).
  What is left of the reply parses exactly as ``literal``.

Where rlfleet departs from VisGym, on purpose (tests/unit/test_maze_actions.py pins each):
- only the last `MAX_SCAN_CHARS` characters of a reply are read (replies are bounded by
  the contract anyway), and the harness's search for the last tuple gives up after
  `MAX_EVAL_CHARS` characters of failed candidates (VisGym's is quadratic in the reply);
- a ``move`` payload too large for int64 is an invalid action (VisGym's
  ``Discrete.contains`` raises OverflowError there and the step crashes);
- messages quote at most `MAX_QUOTE_CHARS` characters of the reply, and Python's object
  addresses (``<ast.Name object at 0x7f...>``) are dropped from them, so feedback stays
  within its 1 KiB bound and is the same on every run.

`parse_action` never raises: anything it cannot read (garbage, binary-ish text, huge
strings, wrong payloads) comes back with ``format is None`` and an ``error`` that the
episode turns into feedback.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import NamedTuple

from rlfleet.maze.layout import DIRECTION_DELTAS, Position
from rlfleet.registries import FORMAT_PROFILES_GROUP, Registry

MAX_SCAN_CHARS = 8192
# Characters of failed candidate tuples the harness search may read before it gives up.
MAX_EVAL_CHARS = 65536
# Characters of the reply (or of a payload) quoted in an error message.
MAX_QUOTE_CHARS = 200

DIRECTION_NAMES: tuple[str, ...] = ("right", "up", "left", "down")
UNPARSED = "unparsed"
# gymnasium's `Text` default character set (gymnasium 1.1.1, the version VisGym forks).
TEXT_CHARSET = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
STOP_MAX_CHARS = 4  # VisGym's `Text(4)`
_INT64 = (-(2**63), 2**63 - 1)


class ActionFormat(StrEnum):
    """How a model is asked to write its actions (the syntax that is read)."""

    LITERAL = "literal"
    TAGS = "tags"


class Feedback(StrEnum):
    """Whose sentences an episode answers with: rlfleet's (the default, which the shipped
    checkpoints were trained on) or VisGym's own."""

    RLFLEET = "rlfleet"
    VISGYM = "visgym"


class FormatProfile(NamedTuple):
    """What an action-format name means: the syntax that is read and whose sentences the
    episode answers with."""

    syntax: ActionFormat
    feedback: Feedback


def _is_format_profile(obj: object) -> bool:
    return isinstance(obj, FormatProfile)


# The action formats by name: the two syntaxes, and "visgym", the literal syntax with
# VisGym's feedback sentences. rlfleet's names are the proto enum rlfleet.v1.ActionFormat's
# (`ACTION_FORMATS`, derived in rlfleet.names; a test holds them equal); a package adds
# one through the `rlfleet.format_profiles` entry-point group, used where a maze episode is
# made in its process (a TaskSpec on the wire carries only the enum's names).
FORMAT_PROFILES: Registry[FormatProfile] = Registry(
    "action format", FORMAT_PROFILES_GROUP, is_kind=_is_format_profile, autodiscover=True)
FORMAT_PROFILES.add("literal", FormatProfile(ActionFormat.LITERAL, Feedback.RLFLEET))
FORMAT_PROFILES.add("tags", FormatProfile(ActionFormat.TAGS, Feedback.RLFLEET))
FORMAT_PROFILES.add("visgym", FormatProfile(ActionFormat.LITERAL, Feedback.VISGYM))


def resolve_format(name: ActionFormat | str) -> FormatProfile:
    """(syntax, feedback) of an action-format name; ValueError naming the known ones."""
    if str(name) not in FORMAT_PROFILES:
        raise ValueError(f"action_format must be one of {tuple(FORMAT_PROFILES.names())}, "
                         f"got {name!r}")
    return FORMAT_PROFILES.get(str(name))


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
    """The outcome of reading one reply. `format` is None when nothing could be read;
    `error` is then the feedback sentence for it."""

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


# -- VisGym's harness: the last action tuple of a reply -----------------------------------

_FENCE = re.compile(r"```[\w-]*")
_ACTION_LABEL = re.compile(r"\bAction\s*:\s*", re.IGNORECASE)
_SPACES = re.compile(r"\s+")
_BARE_NAME = re.compile(r"^\(\s*([A-Za-z_]\w*)(\s*,)")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


_NOT_READ = object()


def _normalize(text: str) -> str:
    """The reply as VisGym's harness cleans it before looking for a tuple."""
    t = _FENCE.sub("", text).replace("```", "").replace("`", "")
    t = t.replace("<|begin_of_box|>", "").replace("<|end_of_box|>", "")
    t = t.replace("\u25c1think\u25b7", "").replace("\u25c1/think\u25b7", "")
    t = _ACTION_LABEL.sub(" ", t)
    return _SPACES.sub(" ", t).strip()


def _quote_bare_name(span: str) -> str:
    """``(move, 0)`` -> ``('move', 0)``, as the harness does."""
    m = _BARE_NAME.search(span)
    if not m:
        return span
    return span[: m.start()] + "(" + f"'{m.group(1)}'" + m.group(2) + span[m.end():]


def _is_action_tuple(value: object) -> bool:
    return isinstance(value, tuple) and len(value) >= 1 and isinstance(value[0], str)


def harness_extract(reply: str) -> str:
    """See `_harness`: the text VisGym's harness passes on for `reply`."""
    return _harness(reply)[0]


def _harness(reply: str) -> tuple[str, object]:
    """What VisGym's inference harness passes to the environment for `reply`: the last
    parenthesised span (in order of its opening parenthesis) that reads as a tuple whose
    first element is a string, taken from the normalised reply; the reply itself when
    there is none.

    Equivalent to ``Interactor.parse_output(reply)`` (prefer="last") but linear in the
    reply plus the candidates it reads, which are bounded by `MAX_EVAL_CHARS`. Returns the
    text and, when it is a candidate, the value it reads as (else `_NOT_READ`)."""
    text = _normalize(reply)
    if not text:
        return reply, _NOT_READ
    # The span the harness reads from each "(" ends at its matching ")".
    closing: dict[int, int] = {}
    stack: list[int] = []
    for i, ch in enumerate(text):
        if ch == "(":
            stack.append(i)
        elif ch == ")" and stack:
            closing[stack.pop()] = i
    budget = MAX_EVAL_CHARS
    for start in sorted(closing, reverse=True):  # the last candidate is the answer
        span = _quote_bare_name(text[start:closing[start] + 1])
        budget -= len(span)
        if budget < 0:
            break
        try:
            value = ast.literal_eval(span)
        except Exception:  # noqa: BLE001, S112 - literal_eval raises many types
            continue
        if _is_action_tuple(value):
            return span, value
    return reply, _NOT_READ


# -- VisGym's environment: the action space ------------------------------------------------


def _text_of(value: object) -> str:
    """`str(value)`, or what stands for it where Python will not write it: an int past
    the interpreter's decimal limit (4300 digits) is written in hex (which has none),
    anything else that cannot be written by its type's name."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4096:
        sign, digits = ("-", hex(-value)) if value < 0 else ("", hex(value))
        return sign + digits[:MAX_QUOTE_CHARS + 2]
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - a payload's str() may raise many types
        return f"<{type(value).__name__}>"


def _quote(value: object) -> str:
    """`str(value)` (what VisGym's f-strings print), bounded and without addresses."""
    text = _ADDRESS.sub("", _text_of(value))
    if len(text) > MAX_QUOTE_CHARS:
        text = text[:MAX_QUOTE_CHARS] + "..."
    return text


def _literal_error(action: str, exc: BaseException) -> str:
    quoted = action if len(action) <= MAX_QUOTE_CHARS else action[:MAX_QUOTE_CHARS] + "..."
    return f"Cannot parse action string {quoted!r}: {_quote(exc)} so the action is invalid."


FORMAT_ERROR = (
    "The action format is invalid. The action should be a tuple of two elements with the "
    "first element being the action name and the second element being the action payload."
)


def _not_in_space(payload: object, branch: str) -> str:
    return (f"The action {_quote(payload)} is not in the valid action space of {branch} so "
            "nothing is executed.")


def move_direction(payload: object) -> int | None:
    """gymnasium's ``Discrete(4).contains``: an ``int`` (``bool`` included) in 0..3."""
    if not isinstance(payload, int):
        return None
    if not _INT64[0] <= payload <= _INT64[1]:
        return None  # VisGym: OverflowError in np.int64(payload)
    return int(payload) if 0 <= payload < 4 else None


def is_stop_payload(payload: object) -> bool:
    """gymnasium's ``Text(4).contains``: 1 to 4 ASCII letters or digits."""
    return (
        isinstance(payload, str)
        and 1 <= len(payload) <= STOP_MAX_CHARS
        and all(c in TEXT_CHARSET for c in payload)
    )


# Replies repeat (a policy writes the same few actions): short ones are read once.
_CACHED_CHARS = 256


@lru_cache(maxsize=4096)
def _parse_literal_cached(reply: str) -> ParsedAction:
    return _parse_literal_uncached(reply)


def _parse_literal(reply: str) -> ParsedAction:
    if len(reply) <= _CACHED_CHARS:
        return _parse_literal_cached(reply)
    return _parse_literal_uncached(reply)


def _parse_literal_uncached(reply: str) -> ParsedAction:
    action, value = _harness(reply)
    if value is _NOT_READ:
        try:
            value = ast.literal_eval(action)
        except Exception as exc:  # noqa: BLE001 - literal_eval raises many types
            return ParsedAction(None, None, _literal_error(action, exc))
    if not isinstance(value, tuple) or len(value) != 2:
        return ParsedAction(None, None, FORMAT_ERROR)
    branch, payload = value
    if branch == "move":
        direction = move_direction(payload)
        if direction is None:
            return ParsedAction(None, None, _not_in_space(payload, "move"))
        return ParsedAction(Action.move(direction), ActionFormat.LITERAL)
    if branch == "stop":
        if not is_stop_payload(payload):
            return ParsedAction(None, None, _not_in_space(payload, "stop"))
        return ParsedAction(Action.stop(), ActionFormat.LITERAL)
    return ParsedAction(
        None, None,
        f"The action name '{_quote(branch)}' is not recognized in the available action space.",
    )


# -- the tag format ---------------------------------------------------------------------

_TAG_SPAN = re.compile(r"<action>\s*(right|up|left|down|stop)\s*</action>", re.IGNORECASE)
TAG_ERROR = (
    "Invalid action: no action tag found; write <action>right|up|left|down|stop</action>"
)


def _parse_tags(reply: str) -> ParsedAction:
    last = None
    for last in _TAG_SPAN.finditer(reply):  # noqa: B007 - we want the final match
        pass
    if last is None:
        return ParsedAction(None, None, TAG_ERROR)
    word = last.group(1).lower()
    action = Action.stop() if word == "stop" else Action.move(DIRECTION_NAMES.index(word))
    return ParsedAction(action, ActionFormat.TAGS)


def parse_action(text: object, fmt: ActionFormat | str = ActionFormat.LITERAL) -> ParsedAction:
    """Read the action in a model reply written in `fmt` ("literal", "tags" or "visgym",
    which reads as "literal"); never raises."""
    syntax, _ = resolve_format(fmt)
    if not isinstance(text, str):
        return ParsedAction(None, None, f"Invalid action: expected text, got "
                                        f"{type(text).__name__}")
    scanned = text[-MAX_SCAN_CHARS:]
    if syntax is ActionFormat.TAGS:
        return _parse_tags(scanned)
    return _parse_literal(scanned)


def format_action(action: Action, fmt: ActionFormat | str = ActionFormat.LITERAL) -> str:
    """The canonical text of `action` in `fmt` (what the oracle teaches in SFT)."""
    syntax, _ = resolve_format(fmt)
    if syntax is ActionFormat.TAGS:
        return f"<action>{action.name}</action>"
    if action.is_stop:
        return "('stop', 'stop')"
    return f"('move', {action.direction})"
