"""The learner's configs: the shipped files load and validate; bad values are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlfleet.config import ConfigError, load_config
from rlfleet.learner_config import LearnerConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_shipped_configs_validate(name: str) -> None:
    cfg = load_config(LearnerConfig, CONFIGS / name, env={})
    assert cfg.grpo.clip_low == 0.2


def test_the_9x9_profile_starts_from_its_own_9x9_checkpoint() -> None:
    cfg = load_config(LearnerConfig, CONFIGS / "local-tiny-9x9.yaml", env={})
    assert cfg.data.size == 9 and cfg.model.path.is_dir()
    sft = json.loads((cfg.model.path / "sft_summary.json").read_text())
    assert sft["size"] == 9 and sft["context"] == cfg.data.context


def test_production_config_matches_the_reference() -> None:
    cfg = load_config(LearnerConfig, CONFIGS / "qwen3-vl-8b-hyperpod.yaml", env={})
    assert cfg.model.profile == "qwen3-vl-8b" and cfg.model.lora_rank == 32
    assert cfg.data.group_size == 8 and cfg.data.size == 9
    assert cfg.eval.every == 10 and cfg.eval.eval_seeds == 64


@pytest.mark.parametrize("bad", [
    {"data": {"group_size": 0}},
    {"optim": {"lr": -1}},
    {"grpo": {"clip_low": -0.5}},
    {"grpo": {"policy_loss": "nope"}},
    {"mode": "async", "deterministic": True},
    {"minutes": 0},
    {"minutes": -5},
    {"minutes": 10, "deterministic": True},  # the planned steps depend on the machine
    {"unknown_key": 1},
])
def test_bad_values_are_refused(bad: dict, tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError):
        load_config(LearnerConfig, path, env={})


def test_deployment_environment_overrides_the_fleet_fields(tmp_path: Path) -> None:
    from rlfleet.learner_config import load_learner_config

    env = {"RLFLEET_REDIS_URL": "redis://rlfleet-redis:6379/0",
           "RLFLEET_SYNC_ADDRESS": "rlfleet-ckptsync:50053", "RLFLEET_RUN": "prod",
           "RLFLEET_RUNS_ROOT": "/shared/runs", "RLFLEET_MODEL": "/shared/models/x"}
    recipe = tmp_path / "recipe.yaml"  # the chart's kind of config: no run name of its own
    recipe.write_text("\n".join(ln for ln in (CONFIGS / "local-tiny.yaml").read_text().splitlines()
                                if not ln.startswith("run:")) + "\n")
    cfg = load_learner_config(recipe, env, steps=7)
    assert cfg.run == "prod" and cfg.steps == 7
    assert cfg.fleet.redis_url == env["RLFLEET_REDIS_URL"]
    assert cfg.fleet.sync_address == env["RLFLEET_SYNC_ADDRESS"]
    assert str(cfg.fleet.runs_root) == "/shared/runs"
    assert str(cfg.model.path) == "/shared/models/x"
    with pytest.raises(ConfigError):
        load_learner_config(tmp_path / "missing.yaml", {})


def test_the_environment_never_renames_the_run_a_config_file_names(tmp_path: Path) -> None:
    from rlfleet.learner_config import load_learner_config

    # local-tiny.yaml names its run "local": a different RLFLEET_RUN is refused, the same
    # one is fine.
    with pytest.raises(ConfigError, match="RLFLEET_RUN='prod'"):
        load_learner_config(CONFIGS / "local-tiny.yaml", {"RLFLEET_RUN": "prod"})
    assert load_learner_config(CONFIGS / "local-tiny.yaml", {"RLFLEET_RUN": "local"}).run == "local"
