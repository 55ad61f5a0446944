"""Which trajectories of a step are trained on: staleness and zero-variance filters.

Order matters and is fixed: stale (and future-version) trajectories are dropped first,
then advantages are computed on what remains of each group, then groups whose remaining
rewards have zero variance (including groups left with one member) are dropped. Every drop
is counted in ``BatchStats``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from rlfleet.grpo.advantages import get_advantage_estimator
from rlfleet.grpo.config import GRPOConfig
from rlfleet.grpo.sample import TrainSample


@dataclasses.dataclass(frozen=True)
class BatchStats:
    """Counts of one step's filtering, for metrics and logs."""

    num_input: int  # trajectories handed in
    num_stale: int  # adapter_version < current_version - max_staleness
    num_future: int  # adapter_version > current_version (e.g. after a learner restart)
    num_groups: int  # groups left after the version filters
    num_zero_variance_groups: int
    num_zero_variance_trajectories: int
    num_kept: int  # trajectories trained on
    reward_mean: float  # over trajectories left after the version filters (0.0 if none)
    max_staleness_seen: int  # largest current_version - adapter_version among kept ones

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def staleness_keep_mask(
    versions: Sequence[int] | npt.NDArray[np.integer],
    current_version: int,
    max_staleness: int,
) -> npt.NDArray[np.bool_]:
    """True where current_version - max_staleness <= version <= current_version."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    v = np.asarray(versions, dtype=np.int64)
    return (v >= current_version - max_staleness) & (v <= current_version)


def prepare_batch(
    samples: Sequence[TrainSample], current_version: int, cfg: GRPOConfig
) -> tuple[list[TrainSample], BatchStats]:
    """Filter a step's trajectories and attach advantages (``cfg.advantage_estimator``).

    ``current_version`` is the adapter version the learner is about to update. Returns the
    kept samples (input order, ``advantage`` set) and the counts.
    """
    versions = np.asarray([s.adapter_version for s in samples], dtype=np.int64)
    fresh = staleness_keep_mask(versions, current_version, cfg.max_staleness)
    num_future = int(np.sum(versions > current_version))
    num_stale = int(np.sum(versions < current_version - cfg.max_staleness))
    remaining = [s for s, keep in zip(samples, fresh, strict=True) if keep]

    if remaining:
        estimator = get_advantage_estimator(cfg.advantage_estimator)
        result = estimator([s.reward for s in remaining], [s.group_id for s in remaining], cfg)
        kept = [
            s.with_advantage(a)
            for s, a, zero in zip(remaining, result.advantages, result.zero_variance, strict=True)
            if not zero
        ]
        num_groups = result.num_groups
        num_zero_groups = len(result.zero_variance_groups)
        num_zero_traj = int(result.zero_variance.sum())
        reward_mean = float(np.mean([s.reward for s in remaining]))
    else:
        kept, num_groups, num_zero_groups, num_zero_traj, reward_mean = [], 0, 0, 0, 0.0

    stats = BatchStats(
        num_input=len(samples),
        num_stale=num_stale,
        num_future=num_future,
        num_groups=num_groups,
        num_zero_variance_groups=num_zero_groups,
        num_zero_variance_trajectories=num_zero_traj,
        num_kept=len(kept),
        reward_mean=reward_mean,
        max_staleness_seen=max((current_version - s.adapter_version for s in kept), default=0),
    )
    return kept, stats
