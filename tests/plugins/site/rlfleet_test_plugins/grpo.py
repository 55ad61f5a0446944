"""A GRPO advantage estimator that plugs in through the ``rlfleet.advantage_estimators``
entry-point group: each trajectory's advantage is its reward as it is (no group
baseline), so a test can tell it from rlfleet's own at a glance."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import numpy.typing as npt

from rlfleet.grpo import AdvantageResult, GRPOConfig


def raw_reward(rewards: npt.ArrayLike, group_ids: Sequence[Hashable],
               cfg: GRPOConfig) -> AdvantageResult:
    r = np.asarray(rewards, dtype=np.float64)
    return AdvantageResult(r, np.zeros(r.shape, bool), (), len(set(group_ids)))
