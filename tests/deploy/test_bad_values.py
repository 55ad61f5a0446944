"""Values that break the chart's contract are refused by `helm lint` and by rendering
(hence `helm install`), each with a message that names the problem."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from .conftest import CHART, HYPERPOD

pytestmark = pytest.mark.deploy


def hyperpod_values() -> dict:
    return yaml.safe_load(HYPERPOD.read_text())


def without_image(v: dict) -> dict:
    del v["reward"]["services"][1]["image"]
    return v


def empty_repository(v: dict) -> dict:
    v["rollout"]["image"] = {"repository": ""}
    return v


def duplicate_reward(v: dict) -> dict:
    v["reward"]["services"].append(dict(v["reward"]["services"][0]))
    return v


def duplicate_env(v: dict) -> dict:
    v["env"]["services"].append(dict(v["env"]["services"][0]))
    return v


def empty_command(v: dict) -> dict:
    v["reward"]["services"][2]["command"] = []
    return v


def env_without_args(v: dict) -> dict:
    del v["env"]["services"][0]["args"]
    return v


CASES = {
    # name: (values change, --set args, text the error must contain)
    "unknown learner console": (None, ["learner.console=fancy"], "/learner/console"),
    "negative rollout replicas": (None, ["rollout.replicas=-1"], "/rollout/replicas"),
    "negative reward replicas": (
        None,
        [
            "reward.services[0].name=task",
            "reward.services[0].args={--reward,task}",
            "reward.services[0].image.repository=rlfleet-env",
            "reward.services[0].replicas=-2",
        ],
        "/reward/services/0/replicas",
    ),
    "negative learner workers": (
        None,
        ["learner.workers.replicas=-1"],
        "/learner/workers/replicas",
    ),
    "missing reward image": (without_image, [], "missing propert"),
    "empty rollout image": (empty_repository, [], "/rollout/image/repository"),
    "unknown reward service": (
        None,
        ["reward.selected=format+task+bonus"],
        "unknown reward service 'format+task+bonus'",
    ),
    "duplicate reward name": (duplicate_reward, [], "the name 'task' is listed twice"),
    "unknown env service": (
        None,
        ["env.selected=gsm8k"],
        "unknown env service 'gsm8k'; env.services lists: maze",
    ),
    "duplicate env name": (duplicate_env, [], "env.services: the name 'maze' is listed twice"),
    "empty reward command": (empty_command, [], "/reward/services/2/command"),
    "env entry without args": (env_without_args, [], "missing propert"),
    "typo in a key": (None, ["rollout.replica=3"], "'replica' not allowed"),
    "bad engine": (None, ["rollout.engine=tensorrt"], "/rollout/engine"),
    "unknown TLS certificate source": (None, ["tls.certManager=maybe"], "/tls/certManager"),
    "TLS certificates of no life": (None, ["tls.days=0"], "/tls/days"),
    "typo in a TLS key": (None, ["tls.enable=false"], "'enable' not allowed"),
    "workers outside min..max": (
        None,
        ["learner.workers.replicas=3"],
        "must lie within minReplicas..maxReplicas",
    ),
}


def _values_file(tmp_path: Path, change) -> Path:
    v = hyperpod_values()
    if change is not None:
        v = change(v)
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(v))
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_values_fail_lint_and_render(helm: str, tmp_path: Path, case: str) -> None:
    change, sets, expected = CASES[case]
    values = _values_file(tmp_path, change)
    set_args = [a for s in sets for a in ("--set", s)]
    lint = subprocess.run(
        [helm, "lint", "--strict", str(CHART), "-f", str(values), *set_args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert lint.returncode != 0, f"lint accepted {case}:\n{lint.stdout}"
    assert expected in lint.stdout + lint.stderr, lint.stdout + lint.stderr
    tpl = subprocess.run(
        [helm, "template", "rlfleet", str(CHART), "-f", str(values), *set_args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tpl.returncode != 0, f"template accepted {case}"
    assert expected in tpl.stderr, tpl.stderr


def test_good_values_pass_the_same_path(helm: str, tmp_path: Path) -> None:
    values = _values_file(tmp_path, None)
    lint = subprocess.run(
        [
            helm,
            "lint",
            "--strict",
            str(CHART),
            "-f",
            str(values),
            "--set",
            "reward.selected=format-task",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
