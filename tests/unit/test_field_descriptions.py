"""A config field's description is written once, on its model (`Field(description=...)`),
and is what `--help`, the chart's values.schema.json and docs/learner-config.md say."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from rlfleet.cli import build_parser
from rlfleet.cliargs import attribute, field_description
from rlfleet.learner_config import FleetConfig, LearnerConfig

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "deploy" / "schemas"))
from gen_learner_schema import DOC, SCHEMA, doc_table  # noqa: E402

SETTINGS = ["rlfleet_rollout.settings:RolloutSettings", "rlfleet_env.settings:EnvSettings",
            "rlfleet_ckptsync.settings:SyncSettings", "rlfleet.reward.settings:RewardSettings"]


def sections(model: type[BaseModel]) -> list[type[BaseModel]]:
    """`model` and the models of its sections, nested ones included."""
    out = [model]
    for field in model.model_fields.values():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out += sections(field.annotation)
    return out


@pytest.mark.parametrize("ref", ["rlfleet.learner_config:LearnerConfig", *SETTINGS])
def test_every_field_says_what_it_is(ref: str) -> None:
    missing = [f"{model.__name__}.{name}" for model in sections(attribute(ref))
               for name in model.model_fields if not field_description(model, name)]
    assert not missing, f"fields without a description: {missing}"


def test_help_shows_the_fields_description() -> None:
    from rlfleet_rollout.settings import RolloutSettings

    text = " ".join(_subparser(build_parser(), "rollout", "serve").format_help().split())
    for name in ("max_staleness", "engine_args", "port"):
        assert " ".join(field_description(RolloutSettings, name).split()) in text, name


def _subparser(parser: argparse.ArgumentParser, *names: str) -> argparse.ArgumentParser:
    for name in names:
        action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        parser = action.choices[name]
    return parser


def test_the_chart_schema_carries_the_descriptions() -> None:
    defs = json.loads(SCHEMA.read_text())["definitions"]
    fleet = defs["learnerConfigFleetConfig"]["properties"]
    assert fleet["sync_timeout_s"]["description"] == \
        FleetConfig.model_fields["sync_timeout_s"].description
    assert defs["learnerConfig"]["properties"]["steps"]["description"] == \
        LearnerConfig.model_fields["steps"].description


def test_the_docs_table_is_current() -> None:
    assert DOC.read_text() == doc_table(), (
        "docs/learner-config.md is out of date: python deploy/schemas/gen_learner_schema.py")
    assert FleetConfig.model_fields["publish_retry_s"].description in DOC.read_text()
