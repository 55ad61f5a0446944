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
def test_rendered_learner_config_is_valid_with_the_pod_environment(render, values,  # noqa: ANN001
                                                                   tmp_path) -> None:  # noqa: ANN001
    from rlfleet.learner_config import load_learner_config

    rendered = render(values)
    data = learner_config_of(rendered)
    path = tmp_path / "learner.yaml"
    path.write_text(yaml.safe_dump(data))
    # What the pod's environment sets (rlfleet.commonEnv and RLFLEET_MODEL).
    env = {"RLFLEET_RUN": "r", "RLFLEET_MODEL": "/shared/models/tiny",
           "RLFLEET_REDIS_URL": "redis://rlfleet-redis:6379/0",
           "RLFLEET_SYNC_ADDRESS": "rlfleet-ckptsync:50053",
           "RLFLEET_RUNS_ROOT": "/shared/runs"}
    cfg = load_learner_config(path, env)
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


def test_the_local_profile_trains_make_runs_recipe(render, tmp_path) -> None:  # noqa: ANN001
    """The local chart's learner config, resolved with the pods' environment, is
    configs/local-tiny.yaml's recipe: only the deployment (run, fleet, Ray) and the model's
    path in the image differ."""
    from gen_learner_schema import LOCAL_VALUES, local_values

    from rlfleet.learner_config import load_learner_config
    from rlfleet.local.records import recipe_of

    assert LOCAL_VALUES.read_text() == local_values(LOCAL_VALUES.read_text()), (
        "values-local.yaml's learner.config is not configs/local-tiny.yaml's recipe: "
        "python deploy/schemas/gen_learner_schema.py")
    path = tmp_path / "learner.yaml"
    path.write_text(yaml.safe_dump(learner_config_of(render(LOCAL))))
    env = {"RLFLEET_RUN": "tiny-maze", "RLFLEET_MODEL": "/opt/rlfleet/models/tiny-sft-feedback"}
    chart = recipe_of(load_learner_config(path, env))
    local = recipe_of(load_learner_config(ROOT / "configs" / "local-tiny.yaml", env={}), ROOT)
    assert chart["model"].pop("path") == "/opt/rlfleet/models/tiny-sft-feedback"
    assert local["model"].pop("path") == "warm-starts/tiny-sft-feedback"
    assert chart == local
