"""The names chosen from a fixed set, defined once: as enums in the protos
(protos/rlfleet/v1/common.proto), from which this module derives the Python names.

A name is its enum value's name lower-cased without the enum's prefix (``CONTEXT_LAST_FRAME``
is ``"last_frame"``); UNSPECIFIED (0) has no name, it is the wire's "not set". Everything
that lists or checks one of these names imports it from here: the pydantic settings'
``Literal`` types, the CLI's choices, the engine registry (whose names a test holds equal
to `ENGINE_NAMES`), and the services, which turn a name into its wire value (`to_wire`)
and back (`from_wire`).

- `CONTEXTS`: what the policy sees each turn (rlfleet.policy.contexts);
- `ACTION_FORMATS`: how the policy writes a maze action (rlfleet.maze.actions);
- `ENGINE_NAMES`: the inference engines a replica serves with (rlfleet.engines).
"""

from __future__ import annotations

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from rlfleet.v1 import common_pb2

_UNSPECIFIED = "UNSPECIFIED"


def _prefix(enum: EnumTypeWrapper) -> str:
    """"CONTEXT_" for Context: the name of the enum's value 0 without "UNSPECIFIED"."""
    zero = enum.Name(0)
    if not zero.endswith(_UNSPECIFIED):
        raise ValueError(f"{enum.DESCRIPTOR.full_name}'s value 0 must be <PREFIX>_UNSPECIFIED, "
                         f"got {zero}")
    return zero[: -len(_UNSPECIFIED)]


def enum_names(enum: EnumTypeWrapper) -> tuple[str, ...]:
    """The names of an enum's values other than UNSPECIFIED, in the order of their numbers."""
    prefix = _prefix(enum)
    return tuple(name[len(prefix):].lower()
                 for name, _ in sorted(enum.items(), key=lambda item: item[1])
                 if name != prefix + _UNSPECIFIED)


def _kind(enum: EnumTypeWrapper) -> str:
    """"action format" for ActionFormat (for error messages)."""
    return _prefix(enum).rstrip("_").lower().replace("_", " ")


def to_wire(enum: EnumTypeWrapper, name: str) -> int:
    """The enum value called `name` ("" is UNSPECIFIED: the field's default); ValueError
    listing the known names for any other."""
    if name == "":
        return 0
    names = enum_names(enum)
    if not isinstance(name, str) or name not in names:
        raise ValueError(f"{_kind(enum)} must be one of {names}, got {name!r}")
    return enum.Value(_prefix(enum) + name.upper())


def from_wire(enum: EnumTypeWrapper, value: int, default: str = "") -> str:
    """The name of wire value `value`; UNSPECIFIED (0) reads as `default`. A value this
    build does not know (a newer peer's, or garbage) is a ValueError naming the known
    values, never read as the default."""
    if value == 0:
        return default
    if value not in enum.values():
        known = ", ".join(f"{n} ({enum.Value(_prefix(enum) + n.upper())})"
                          for n in enum_names(enum))
        raise ValueError(f"unknown {_kind(enum)} value {value}; known: {known}, or 0 for "
                         "the default")
    return enum.Name(value)[len(_prefix(enum)):].lower()


CONTEXTS: tuple[str, ...] = enum_names(common_pb2.Context)
ACTION_FORMATS: tuple[str, ...] = enum_names(common_pb2.ActionFormat)
ENGINE_NAMES: tuple[str, ...] = enum_names(common_pb2.Engine)
