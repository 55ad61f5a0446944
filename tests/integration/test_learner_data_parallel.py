"""The learner's data-parallel path: 2 Ray actors joined by torch.distributed over gloo
give the same update as 1 actor on the same batch."""

from __future__ import annotations

import base64
import hashlib
import random

import numpy as np
import pytest
import ray
import torch

from rlfleet.grpo import TrainSample
from rlfleet.learner_config import LearnerConfig
from rlfleet.maze.tasks import new_episode
from rlfleet.policy import ChatCodec, load_processor
from rlfleet_learner.ray_start import init_local_ray
from rlfleet_learner.workers import TrainerGroup

# two trainer ranks in a Ray of their own take the machine: one heavy tier at a time
# (tests/conftest.py)
pytestmark = pytest.mark.heavy


def rows(model_dir, n: int = 6) -> list[TrainSample]:  # noqa: ANN001
    """Real rows in the rollout's last_frame format: one maze frame + one action turn."""
    processor = load_processor(model_dir)
    codec = ChatCodec(processor)
    tok = processor.tokenizer
    rng = random.Random(0)
    out = []
    for i in range(n):
        ep = new_episode("maze_2d", 1_000_000 + i, size=7, cell_px=16)
        obs = ep.observe()
        url = "data:image/png;base64," + base64.b64encode(obs.png).decode()
        enc = codec.encode_prompt([{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": f"{obs.instruction}\n\n{obs.status}"}]}])
        action = tok(f"('move', {rng.randrange(4)})", add_special_tokens=False)["input_ids"]
        ids = enc.token_ids + action + [codec.im_end_id]
        k = len(action) + 1
        out.append(TrainSample(
            input_ids=np.asarray(ids), loss_mask=np.asarray([0] * len(enc.token_ids) + [1] * k),
            logprobs=np.asarray([0.0] * len(enc.token_ids) + [-1.5] * k),
            reward=float(i % 2), group_id="g", adapter_version=1,
            advantage=1.0 if i % 2 else -1.0,
            # as the learner's rows carry them: the frames' PNG bytes and their sha256
            extras={"images": [obs.png], "image_keys": [hashlib.sha256(obs.png).hexdigest()]}))
    return out


@pytest.fixture(scope="module")
def local_ray():
    init_local_ray(num_cpus=2, include_dashboard=False,
             object_store_memory=128 * 1024 * 1024, configure_logging=False,
             log_to_driver=False)
    yield
    ray.shutdown()


def lora_after_one_step(model_dir, workers: int, batch: list[TrainSample]) -> dict:  # noqa: ANN001
    cfg = LearnerConfig.model_validate({
        "model": {"path": str(model_dir), "lora_rank": 4},
        "grpo": {"micro_batch_size": 2, "loss_reduction": "token_mean"},
        "optim": {"lr": 0.05},
        "ray": {"num_workers": workers},
    })
    group = TrainerGroup(cfg, str(model_dir))
    try:
        result = group.step(batch)
        state = group.state()["adapter"]
    finally:
        group.close()
    return {"state": state, "loss": result.stats["loss"], "grad_norm": result.grad_norm}


def test_two_workers_make_the_same_update_as_one(local_ray, tiny_model_dir) -> None:
    batch = rows(tiny_model_dir)
    one = lora_after_one_step(tiny_model_dir, 1, batch)
    two = lora_after_one_step(tiny_model_dir, 2, batch)
    assert one["loss"] == pytest.approx(two["loss"], rel=1e-5)
    assert one["grad_norm"] == pytest.approx(two["grad_norm"], rel=1e-5)
    assert one["state"].keys() == two["state"].keys()
    changed = 0
    for key, value in one["state"].items():
        torch.testing.assert_close(value, two["state"][key], rtol=1e-5, atol=1e-7)
        changed += int("lora_B" in key and value.abs().sum() > 0)
    assert changed > 0  # the step really moved the adapter (B starts at zero)
