"""The learner's configs: the shipped files load and validate; bad values are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.config import ConfigError, load_config
from rlfleet_learner.config import LearnerConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("name", ["local-tiny.yaml", "qwen3-vl-8b-hyperpod.yaml"])
def test_shipped_configs_validate(name: str) -> None:
    cfg = load_config(LearnerConfig, CONFIGS / name, env={})
    assert cfg.grpo_config().clip_low == 0.2


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
    {"unknown_key": 1},
])
def test_bad_values_are_refused(bad: dict, tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError):
        load_config(LearnerConfig, path, env={})
