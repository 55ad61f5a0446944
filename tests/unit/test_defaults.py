"""The ports and the runs root are defined once in Python (rlfleet.defaults) and once in the
chart (_helpers.tpl's rlfleet.port.*): the two must agree, and nothing else may spell them."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from rlfleet import defaults

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "rlfleet"
CHART_PORTS = {
    "env": defaults.ENV_PORT,
    "rollout": defaults.ROLLOUT_PORT,
    "ckptsync": defaults.CKPTSYNC_PORT,
    "envMetrics": defaults.ENV_METRICS_PORT,
    "rolloutMetrics": defaults.ROLLOUT_METRICS_PORT,
    "ckptsyncMetrics": defaults.CKPTSYNC_METRICS_PORT,
    "learnerMetrics": defaults.LEARNER_METRICS_PORT,
}


def defined_ports() -> dict[str, int]:
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    return {name: int(port) for name, port in
            re.findall(r'define "rlfleet\.port\.(\w+)" -}}(\d+){{', helpers)}


def test_the_chart_defines_the_libraries_ports() -> None:
    assert defined_ports() == CHART_PORTS


def test_the_chart_defines_the_libraries_runs_root() -> None:
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    assert re.findall(r'define "rlfleet\.runsRoot" -}}([^{]+){{', helpers) == \
        [str(defaults.RUNS_ROOT)]
    for template in (CHART / "templates").rglob("*.yaml"):
        assert str(defaults.RUNS_ROOT) not in template.read_text(), \
            f"{template.name} spells the runs root; use include \"rlfleet.runsRoot\""


def test_no_template_spells_a_port_itself() -> None:
    numbers = "|".join(str(p) for p in CHART_PORTS.values())
    for template in (CHART / "templates").rglob("*"):
        if not template.is_file():
            continue
        for n, line in enumerate(template.read_text().splitlines(), 1):
            if 'define "rlfleet.port.' in line:
                continue
            assert not re.search(rf"(?<![\w.])({numbers})(?!\w)", line), \
                f"{template.name}:{n} spells a port; use include \"rlfleet.port.*\": {line}"


def test_a_reward_image_of_ones_own_serves_on_the_env_port() -> None:
    # values files cannot include templates: their reward commands name the numbers
    for values in CHART.glob("values*.yaml"):
        text = values.read_text()
        for command in re.findall(r'command: \[("path-efficiency-reward".*)\]', text):
            argv = yaml.safe_load(f"[{command}]")
            assert argv[argv.index("--port") + 1] == str(defaults.ENV_PORT), values.name
            assert argv[argv.index("--metrics-port") + 1] == str(defaults.ENV_METRICS_PORT)


def test_every_settings_model_takes_the_runs_root_and_ports_from_defaults() -> None:
    from rlfleet.learner_config import FleetConfig
    from rlfleet.reward.settings import RewardSettings
    from rlfleet.storage.paths import DEFAULT_RUNS_ROOT
    from rlfleet_ckptsync.settings import SyncSettings
    from rlfleet_env.settings import EnvSettings
    from rlfleet_rollout.settings import RolloutSettings

    assert DEFAULT_RUNS_ROOT == defaults.RUNS_ROOT
    fields = {model: model.model_fields for model in
              (RolloutSettings, SyncSettings, EnvSettings, RewardSettings, FleetConfig)}
    assert fields[RolloutSettings]["runs_root"].default == defaults.RUNS_ROOT
    assert fields[SyncSettings]["runs_root"].default == defaults.RUNS_ROOT
    assert fields[FleetConfig]["runs_root"].default == defaults.RUNS_ROOT
    assert (fields[EnvSettings]["port"].default, fields[RolloutSettings]["port"].default,
            fields[SyncSettings]["port"].default, fields[RewardSettings]["port"].default) == \
        (defaults.ENV_PORT, defaults.ROLLOUT_PORT, defaults.CKPTSYNC_PORT, defaults.REWARD_PORT)
    assert fields[RolloutSettings]["env_address"].default == \
        defaults.local_address(defaults.ENV_PORT)
    assert fields[FleetConfig]["sync_address"].default == \
        defaults.local_address(defaults.CKPTSYNC_PORT)
