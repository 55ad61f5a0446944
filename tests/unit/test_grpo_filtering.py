"""Staleness and zero-variance filtering, with every drop counted."""

import numpy as np
import pytest

from rlfleet.grpo import GRPOConfig, TrainSample, prepare_batch, staleness_keep_mask


def sample(reward: float, group: str, version: int, tag: int = 0) -> TrainSample:
    return TrainSample(
        input_ids=[1, 2, 3],
        loss_mask=[0, 1, 1],
        logprobs=[0.0, -0.5, -0.7],
        reward=reward,
        group_id=group,
        adapter_version=version,
        extras={"tag": tag},
    )


def test_staleness_mask_bounds() -> None:
    keep = staleness_keep_mask([5, 4, 3, 6], current_version=5, max_staleness=1)
    assert keep.tolist() == [True, True, False, False]
    assert staleness_keep_mask([5, 4], 5, 0).tolist() == [True, False]
    with pytest.raises(ValueError):
        staleness_keep_mask([1], 1, -1)


def test_prepare_batch_drops_and_counts() -> None:
    samples = [
        sample(1.0, "a", 5, 0),
        sample(0.0, "a", 4, 1),
        sample(1.0, "a", 3, 2),  # stale (5 - 1 > 3)
        sample(1.0, "b", 5, 3),  # group b: zero variance
        sample(1.0, "b", 5, 4),
        sample(0.0, "c", 5, 5),  # group c: its other member is stale -> singleton
        sample(1.0, "c", 2, 6),  # stale
        sample(0.5, "d", 7, 7),  # from a future version
    ]
    kept, stats = prepare_batch(samples, current_version=5, cfg=GRPOConfig(max_staleness=1))
    assert [s.extras["tag"] for s in kept] == [0, 1]
    s2 = np.sqrt(0.5)
    assert [s.advantage for s in kept] == pytest.approx([0.5 / (s2 + 1e-6), -0.5 / (s2 + 1e-6)])
    assert stats.num_input == 8
    assert stats.num_stale == 2 and stats.num_future == 1
    assert stats.num_groups == 3  # a, b, c after the version filters
    assert stats.num_zero_variance_groups == 2 and stats.num_zero_variance_trajectories == 3
    assert stats.num_kept == 2
    assert stats.reward_mean == pytest.approx((1 + 0 + 1 + 1 + 0) / 5)
    assert stats.max_staleness_seen == 1
    assert stats.as_dict()["num_kept"] == 2


def test_prepare_batch_with_everything_dropped() -> None:
    kept, stats = prepare_batch([sample(1.0, "a", 0)], current_version=9, cfg=GRPOConfig())
    assert kept == [] and stats.num_stale == 1 and stats.num_groups == 0 and stats.num_kept == 0


def test_train_sample_validation() -> None:
    ok = dict(
        input_ids=[1, 2],
        loss_mask=[0, 1],
        logprobs=[0.0, -1.0],
        reward=1.0,
        group_id="g",
        adapter_version=0,
    )
    TrainSample(**ok)
    for change, match in [
        ({"loss_mask": [1, 1]}, "loss_mask\\[0\\]"),
        ({"loss_mask": [0, 0]}, "no loss tokens"),
        ({"loss_mask": [0, 2]}, "only 0 and 1"),
        ({"logprobs": [0.0]}, "shape"),
        ({"logprobs": [0.0, 0.5]}, "<= 0"),
        ({"logprobs": [0.0, float("nan")]}, "finite"),
        ({"input_ids": [1.0, 2.0]}, "integers"),
        ({"reward": float("inf")}, "reward"),
        ({"adapter_version": "3"}, "adapter_version"),
    ]:
        with pytest.raises(ValueError, match=match):
            TrainSample(**{**ok, **change})
