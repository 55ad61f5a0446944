"""Group-relative advantages: hand-computed values, zero-variance groups, invariants."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.grpo import (
    GRPOConfig,
    NonFiniteRewards,
    get_advantage_estimator,
    group_normalized_advantages,
    register_advantage_estimator,
)
from rlfleet.grpo.advantages import ADVANTAGE_ESTIMATORS, EQUAL_RTOL, AdvantageResult


def test_grpo_uses_sample_std_like_skyrl() -> None:
    # Group [1, 0, 0, 0]: mean 0.25; sample std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    # (population std would be 0.433).
    res = get_advantage_estimator("grpo")([1.0, 0.0, 0.0, 0.0], ["g"] * 4, GRPOConfig())
    denom = 0.5 + 1e-6
    np.testing.assert_allclose(
        res.advantages, [0.75 / denom, -0.25 / denom, -0.25 / denom, -0.25 / denom], rtol=1e-12
    )
    # Same as SkyRL's torch.std (unbiased by default).
    r = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    np.testing.assert_allclose(res.advantages, ((r - r.mean()) / (r.std() + 1e-6)).numpy())
    assert not res.zero_variance.any() and res.num_groups == 1


def test_without_std_normalisation_only_centres() -> None:
    cfg = GRPOConfig(std_normalize=False)
    res = get_advantage_estimator("grpo")([1.0, 0.0, 0.0, 0.0], ["g"] * 4, cfg)
    np.testing.assert_allclose(res.advantages, [0.75, -0.25, -0.25, -0.25])


def test_dr_grpo_never_divides_by_std() -> None:
    res = get_advantage_estimator("dr_grpo")([2.0, 0.0], ["g", "g"], GRPOConfig())
    np.testing.assert_allclose(res.advantages, [1.0, -1.0])


def test_groups_are_independent_and_order_is_kept() -> None:
    # a: [1, 3] -> mean 2, sample std sqrt(2); b: [0, 1, 0] handled separately.
    res = get_advantage_estimator("grpo")(
        [1.0, 0.0, 3.0, 1.0, 0.0], ["a", "b", "a", "b", "b"], GRPOConfig(eps=1e-9)
    )
    s = np.sqrt(2.0)
    b_std = np.std([0.0, 1.0, 0.0], ddof=1)
    np.testing.assert_allclose(
        res.advantages,
        [-1 / s, -1 / 3 / b_std, 1 / s, 2 / 3 / b_std, -1 / 3 / b_std],
        rtol=1e-6,
    )


def test_zero_variance_and_singleton_groups_are_flagged_with_zero_advantage() -> None:
    res = get_advantage_estimator("grpo")(
        [1.0, 1.0, 0.0, 1.0, 0.5], ["same", "same", "mixed", "mixed", "alone"], GRPOConfig()
    )
    assert res.zero_variance.tolist() == [True, True, False, False, True]
    assert res.zero_variance_groups == ("same", "alone")
    assert res.num_groups == 3
    assert res.advantages[[0, 1, 4]].tolist() == [0.0, 0.0, 0.0]


def test_rewards_equal_but_for_rounding_are_a_zero_variance_group() -> None:
    # novelty's seven -0.05 charges sum to -0.35 or -0.35000000000000003 by the order
    # they fell in: the same reward, not a group to standardize by its std of 6e-17
    rewards = [-0.05 * 5 + -0.05 * 2, -0.05 * 4 + -0.05 * 3, -0.35]
    assert len(set(rewards)) == 2
    res = get_advantage_estimator("grpo")(rewards, ["g"] * 3, GRPOConfig())
    assert res.zero_variance.tolist() == [True, True, True]
    assert res.advantages.tolist() == [0.0, 0.0, 0.0]
    # a real difference of a 1e-6 part stays a signal
    res = get_advantage_estimator("grpo")([1.0, 1.000001], ["g"] * 2, GRPOConfig())
    assert res.zero_variance.tolist() == [False, False]


@pytest.mark.parametrize(
    ("rewards", "groups", "match"),
    [
        ([1.0, float("nan")], ["g", "g"], "finite"),
        ([1.0, 0.0], ["g"], "group ids"),
        ([[1.0, 0.0]], ["g"], "one scalar"),
    ],
)
def test_bad_rewards_raise(rewards: object, groups: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        get_advantage_estimator("grpo")(rewards, groups, GRPOConfig())


rewards_lists = st.lists(
    st.floats(min_value=-10, max_value=10, allow_nan=False, width=32), min_size=2, max_size=12
)


@settings(max_examples=60, deadline=None)
@given(st.lists(rewards_lists, min_size=1, max_size=4), st.booleans())
def test_advantages_sum_to_zero_in_each_kept_group(groups: list[list[float]], norm: bool) -> None:
    rewards = [r for g in groups for r in g]
    ids = [i for i, g in enumerate(groups) for _ in g]
    res = get_advantage_estimator("grpo")(rewards, ids, GRPOConfig(std_normalize=norm))
    for i, g in enumerate(groups):
        sel = np.asarray(ids) == i
        # equal up to rounding (relative EQUAL_RTOL) is equal: [0, 2.2e-16] carries no signal
        if max(g) - min(g) <= EQUAL_RTOL * max(1.0, *map(abs, g)):
            assert res.zero_variance[sel].all() and (res.advantages[sel] == 0).all()
            continue
        a = res.advantages[sel]
        assert not res.zero_variance[sel].any()
        assert abs(a.sum()) <= 1e-9 * max(1.0, np.abs(a).max()) * len(a)
        if norm:
            std = np.std(g, ddof=1)
            # std(a) = std / (std + eps): about 1 unless the spread is tiny.
            np.testing.assert_allclose(np.std(a, ddof=1), std / (std + 1e-6), rtol=1e-6)


def test_registry_accepts_a_new_estimator() -> None:
    @register_advantage_estimator("test_raw_reward")
    def raw(rewards, group_ids, cfg) -> AdvantageResult:  # type: ignore[no-untyped-def]
        r = np.asarray(rewards, dtype=np.float64)
        return AdvantageResult(r, np.zeros(r.shape, bool), (), len(set(group_ids)))

    try:
        cfg = GRPOConfig(advantage_estimator="test_raw_reward")
        res = get_advantage_estimator(cfg.advantage_estimator)([0.5, 2.0], ["a", "b"], cfg)
        assert res.advantages.tolist() == [0.5, 2.0]
        with pytest.raises(ValueError, match="is defined twice"):
            register_advantage_estimator("test_raw_reward")(raw)
    finally:
        ADVANTAGE_ESTIMATORS.unregister("test_raw_reward")
    with pytest.raises(ValueError, match="unknown advantage estimator 'test_raw_reward'"):
        get_advantage_estimator("test_raw_reward")


def test_rewards_that_overflow_the_normalisation_are_refused() -> None:
    # finite, yet (1e300)^2 is inf: the std would be inf and every advantage 0
    with pytest.raises(NonFiniteRewards, match="overflow the group normalisation"):
        group_normalized_advantages([1e300, 0.0, 0.0, 1.0], ["g"] * 4, std_normalize=True,
                                    eps=1e-6)
    with pytest.raises(NonFiniteRewards, match="must be finite"):
        group_normalized_advantages([float("nan"), 0.0], ["g"] * 2, std_normalize=True,
                                    eps=1e-6)
