"""Writes the learner's config schema into the chart's values.schema.json: `learner.config`
is checked against the JSON Schema of `LearnerConfig` (rlfleet.learner_config), so `helm lint
--strict` and `helm install` refuse a config the learner would refuse at start-up (a
misspelt key, a string where a section belongs) instead of a learner pod crash-looping.
`rollout.engine`'s names come from the same definition as the replica's (rlfleet.names).

Run `python deploy/schemas/gen_learner_schema.py` after changing the learner's config
model; a test checks the schema file is up to date.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SCHEMA = Path(__file__).resolve().parents[1] / "helm" / "rlfleet" / "values.schema.json"
PREFIX = "learnerConfig"


def learner_definitions() -> dict:
    """LearnerConfig's JSON Schema as draft-07 definitions named learnerConfig*."""
    from rlfleet.learner_config import LearnerConfig

    schema = LearnerConfig.model_json_schema(ref_template=f"#/definitions/{PREFIX}{{model}}")
    defs = {f"{PREFIX}{name}": body for name, body in schema.pop("$defs", {}).items()}
    defs[PREFIX] = schema
    return defs


def updated(values_schema: dict) -> dict:
    out = json.loads(json.dumps(values_schema))
    defs = {k: v for k, v in out["definitions"].items() if not k.startswith(PREFIX)}
    defs.update(learner_definitions())
    out["definitions"] = dict(sorted(defs.items()))
    out["properties"]["learner"]["properties"]["config"] = {
        "$ref": f"#/definitions/{PREFIX}",
        "description": "a LearnerConfig (from libs/rlfleet/learner_config.py)",
    }
    # the engine names are defined once, as the proto enum Engine (rlfleet.names)
    from rlfleet.names import ENGINE_NAMES

    out["properties"]["rollout"]["properties"]["engine"]["enum"] = list(ENGINE_NAMES)
    return out


def render(values_schema: dict) -> str:
    return json.dumps(updated(values_schema), indent=2) + "\n"


def main() -> int:
    text = render(json.loads(SCHEMA.read_text()))
    SCHEMA.write_text(text)
    print(f"wrote {SCHEMA}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
