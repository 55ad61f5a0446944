"""The training groups the learner sends (its greedy eval episodes: rlfleet.evaluation)."""

from __future__ import annotations

from rlfleet.evaluation.play import task_spec
from rlfleet.learner_config import DataConfig
from rlfleet.names import to_wire
from rlfleet.v1 import common_pb2, rollout_pb2


def sampling_seed(run_seed: int, step: int, group: int) -> int:
    """A fixed, non-zero sampling seed per (run seed, step, group) for deterministic runs."""
    return (run_seed * 1_000_003 + step * 1009 + group) % (2**31 - 1) + 1


def train_group(data: DataConfig, *, run: str, step: int, index: int, seed: int,
                min_version: int, sampling_seed: int = 0) -> rollout_pb2.GroupRequest:
    return rollout_pb2.GroupRequest(
        task=task_spec(data, seed, train=True),
        group_size=data.group_size,
        sampling=rollout_pb2.SamplingParams(temperature=data.temperature,
                                            max_new_tokens=data.max_new_tokens,
                                            seed=sampling_seed),
        min_adapter_version=min_version,
        # The version is part of the key: a resumed run never collides with the cache of
        # the run it replaces.
        idempotency_key=f"{run}/train/s{step}/v{min_version}/g{index}",
        include_images=True,
        context_mode=to_wire(common_pb2.Context, data.context),
    )
