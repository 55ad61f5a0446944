"""Context names, action formats and engine names are defined once, as the proto enums of
common.proto: rlfleet.names derives the Python names from them, and every list or check of
those names (settings, CLI choices, the engine registry, the maze's formats) agrees."""

from __future__ import annotations

import typing

import pytest

from rlfleet.cliargs import field_choices
from rlfleet.engines import ENGINES
from rlfleet.learner_config import DataConfig
from rlfleet.maze.actions import FORMAT_PROFILES, resolve_format
from rlfleet.names import (
    ACTION_FORMATS,
    CONTEXTS,
    ENGINE_NAMES,
    enum_names,
    from_wire,
    to_wire,
)
from rlfleet.policy.contexts import CONTEXTS as POLICY_CONTEXTS
from rlfleet.policy.contexts import FULL_HISTORY_CONTEXTS, PER_TURN_CONTEXTS
from rlfleet.registries import BUILT_IN
from rlfleet.v1 import common_pb2
from rlfleet_rollout.settings import RolloutSettings


def test_the_names_are_the_enum_values_without_prefix() -> None:
    assert CONTEXTS == ("full", "last_frame", "frame_only", "visgym")
    assert ACTION_FORMATS == ("literal", "tags", "visgym")
    assert ENGINE_NAMES == ("hf", "vllm")
    # every value but UNSPECIFIED has a name, in the order of the numbers
    for enum in (common_pb2.Context, common_pb2.ActionFormat, common_pb2.Engine):
        names = enum_names(enum)
        assert len(names) == len(enum.values()) - 1
        assert [to_wire(enum, n) for n in names] == sorted(v for v in enum.values() if v)


def test_every_user_of_a_name_list_reads_the_enum() -> None:
    assert sorted(ENGINES.names()) == sorted(ENGINE_NAMES)
    assert typing.get_args(RolloutSettings.model_fields["engine"].annotation) == ENGINE_NAMES
    assert typing.get_args(DataConfig.model_fields["context"].annotation) == CONTEXTS
    assert tuple(field_choices(RolloutSettings, "engine")) == ENGINE_NAMES
    assert POLICY_CONTEXTS is CONTEXTS
    assert set(PER_TURN_CONTEXTS) == set(CONTEXTS) - set(FULL_HISTORY_CONTEXTS)
    # rlfleet's own formats (a plugin's, when another test put one on the path, are extra)
    assert tuple(n for n in FORMAT_PROFILES.names()
                 if FORMAT_PROFILES.source(n) == BUILT_IN) == ACTION_FORMATS


def test_names_round_trip_through_wire_values() -> None:
    for enum in (common_pb2.Context, common_pb2.ActionFormat, common_pb2.Engine):
        for name in enum_names(enum):
            assert from_wire(enum, to_wire(enum, name)) == name
    assert to_wire(common_pb2.Context, "last_frame") == common_pb2.CONTEXT_LAST_FRAME
    assert from_wire(common_pb2.Engine, common_pb2.ENGINE_VLLM) == "vllm"


def test_unspecified_is_the_default_the_caller_names() -> None:
    assert to_wire(common_pb2.Context, "") == common_pb2.CONTEXT_UNSPECIFIED == 0
    assert from_wire(common_pb2.Context, 0, default="full") == "full"
    assert from_wire(common_pb2.ActionFormat, 0) == ""


def test_unknown_names_and_values_are_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"context must be one of \('full', 'last_frame', "
                                         r"'frame_only', 'visgym'\), got 'everything'"):
        to_wire(common_pb2.Context, "everything")
    with pytest.raises(ValueError, match="action format must be one of"):
        to_wire(common_pb2.ActionFormat, "LITERAL")  # the names are lower case
    with pytest.raises(ValueError, match=r"unknown engine value 7; known: hf \(1\), "
                                         r"vllm \(2\), or 0 for the default"):
        from_wire(common_pb2.Engine, 7)
    with pytest.raises(ValueError, match="unknown action format value -1"):
        from_wire(common_pb2.ActionFormat, -1, default="literal")  # never the default
    with pytest.raises(ValueError, match=r"action_format must be one of \('literal', "):
        resolve_format("yaml")
