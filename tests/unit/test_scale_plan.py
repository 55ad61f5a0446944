"""docs/scale.md's plan agrees with what is deployed: the learner config, the chart's
hyperpod values and the model's architecture (a changed count fails here until the plan,
the config and the values are changed together)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from bench.gpu.model import QWEN3_VL_8B, image_processor, lora_params, weight_params

from rlfleet.config import load_config
from rlfleet.learner_config import LearnerConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plan() -> dict:
    text = (ROOT / "docs" / "scale.md").read_text()
    block = re.search(r"## The plan in numbers.*?```yaml\n(.*?)```", text, re.S)
    assert block, "docs/scale.md has no plan block"
    return yaml.safe_load(block.group(1))


@pytest.fixture(scope="module")
def config() -> LearnerConfig:
    return load_config(LearnerConfig, ROOT / "configs" / "qwen3-vl-8b-hyperpod.yaml", env={})


@pytest.fixture(scope="module")
def values() -> dict:
    return yaml.safe_load((ROOT / "deploy" / "helm" / "rlfleet" / "values-hyperpod.yaml")
                          .read_text())


def test_every_gpu_has_one_job(plan: dict, config: LearnerConfig, values: dict) -> None:
    learner = values["learner"]["workers"]
    assert learner["replicas"] == learner["minReplicas"] == learner["maxReplicas"]
    assert learner["replicas"] * learner["gpus"] == plan["learner_gpus"]
    assert config.ray.num_workers * config.ray.num_gpus_per_worker == plan["learner_gpus"]
    assert config.ray.num_gpus_per_worker == learner["gpus"]  # one rank per worker pod
    assert values["rollout"]["replicas"] * values["rollout"]["gpus"] == plan["rollout_gpus"]
    assert plan["learner_gpus"] + plan["rollout_gpus"] == plan["nodes"] * plan["gpus_per_node"]
    assert config.fleet.min_replicas == values["rollout"]["replicas"] == plan["min_replicas"]
    assert values["learner"]["head"]["rayStartParams"].get("num-gpus", "0") in ("0", 0)


def test_the_run_is_the_planned_shape(plan: dict, config: LearnerConfig) -> None:
    m, d = config.model, config.data
    assert (m.device, m.torch_dtype(), m.lora_rank) == ("cuda", plan["dtype"],
                                                         plan["lora_rank"])
    assert m.gradient_checkpointing is plan["gradient_checkpointing"]
    assert (d.group_size, d.groups_per_step, d.max_turns, d.size, d.cell_px, d.context) == (
        plan["group_size"], plan["groups_per_step"], plan["max_turns"], plan["maze_size"],
        plan["cell_px"], plan["context"])
    assert config.grpo.micro_batch_size == plan["micro_batch_size"]


def test_the_arithmetic_matches_the_architecture(plan: dict, config: LearnerConfig) -> None:
    a = QWEN3_VL_8B
    assert weight_params(a)["total"] == plan["params_total"]
    assert weight_params(a)["vision"] == plan["params_vision"]
    assert lora_params(a, config.model.lora_rank) == plan["lora_params"]
    assert 2 * a.num_layers * a.num_kv_heads * a.head_dim * 2 == plan["kv_bytes_per_token"]
    frame = config.data.size * config.data.cell_px
    patches = image_processor(a).get_number_of_image_patches(frame, frame, {})
    assert patches // a.merge_size ** 2 == plan["image_tokens_per_frame"]
