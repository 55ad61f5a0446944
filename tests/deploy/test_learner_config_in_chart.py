"""The learner config the chart renders is one the learner accepts (the built-in
config used to be `{run, model: "<string>", runs_root}`, which crashed the learner), and
values.schema.json refuses what the learner would refuse, so `helm lint` catches it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from .conftest import CHART, HYPERPOD, LOCAL, ROOT

pytestmark = pytest.mark.deploy

sys.path.insert(0, str(ROOT / "deploy" / "schemas"))
from gen_learner_schema import SCHEMA, render  # noqa: E402


def learner_config_of(rendered) -> dict:  # noqa: ANN001
    cm = next(o for o in rendered.of_kind("ConfigMap")
              if o["metadata"]["name"].endswith("-learner"))
    return yaml.safe_load(cm["data"]["learner.yaml"]) or {}


@pytest.mark.parametrize("values", [None, LOCAL, HYPERPOD], ids=["defaults", "local", "hyperpod"])
def test_rendered_learner_config_is_valid_with_the_pod_environment(render, values) -> None:  # noqa: ANN001
    from rlfleet.learner_config import load_learner_config

    rendered = render(values)
    data = learner_config_of(rendered)
    path = ROOT / "runs" / ".chart-learner-config.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    try:
        # What the pod's environment sets (rlfleet.commonEnv and RLFLEET_MODEL).
        env = {"RLFLEET_RUN": "r", "RLFLEET_MODEL": "/shared/models/tiny",
               "RLFLEET_REDIS_URL": "redis://rlfleet-redis:6379/0",
               "RLFLEET_SYNC_ADDRESS": "rlfleet-ckptsync:50053",
               "RLFLEET_RUNS_ROOT": "/shared/runs"}
        cfg = load_learner_config(path, env)
    finally:
        path.unlink()
    assert str(cfg.model.path) == "/shared/models/tiny"
    assert cfg.fleet.sync_address == "rlfleet-ckptsync:50053"


def test_lint_refuses_a_learner_config_the_learner_would_refuse(helm: str) -> None:
    for bad in ("learner.config.model=/shared/models/tiny", "learner.config.stepz=3",
                "learner.config.data.context=everything"):
        out = subprocess.run([helm, "lint", "--strict", str(CHART), "-f", str(LOCAL), "--set", bad],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode != 0, bad
        assert "/learner/config" in out.stdout + out.stderr, (bad, out.stdout)


def test_values_schema_holds_the_current_learner_config_model() -> None:
    current = json.loads(SCHEMA.read_text())
    assert SCHEMA.read_text() == render(current), (
        "values.schema.json is out of date: python deploy/schemas/gen_learner_schema.py")
    assert os.path.exists(SCHEMA)
