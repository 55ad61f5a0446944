"""Group-relative advantage estimators and their registry.

An estimator maps one scalar reward per trajectory plus its group id (all trajectories of
one task/prompt share a group id) to one scalar advantage per trajectory. Groups whose
rewards are all equal up to rounding (including groups of one) carry no learning signal:
they get advantage 0 and are flagged so the caller drops them and counts them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from rlfleet.registries import ADVANTAGE_ESTIMATORS_GROUP, Registry

if TYPE_CHECKING:
    from rlfleet.grpo.config import GRPOConfig


@dataclasses.dataclass(frozen=True, eq=False)
class AdvantageResult:
    """Per-trajectory advantages, aligned with the input order.

    ``zero_variance[i]`` is True when trajectory i's group has zero reward variance (such
    trajectories have advantage 0 and must not be trained on).
    """

    advantages: npt.NDArray[np.float64]
    zero_variance: npt.NDArray[np.bool_]
    zero_variance_groups: tuple[Hashable, ...]
    num_groups: int


AdvantageEstimator = Callable[[npt.ArrayLike, Sequence[Hashable], "GRPOConfig"], AdvantageResult]
# rlfleet's own below, plus the ``rlfleet.advantage_estimators`` entry points
ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry(
    "advantage estimator", ADVANTAGE_ESTIMATORS_GROUP, autodiscover=True)


def register_advantage_estimator(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator: ``fn(rewards, group_ids, cfg) -> AdvantageResult`` becomes usable by name."""
    return ADVANTAGE_ESTIMATORS.register(name)


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    return ADVANTAGE_ESTIMATORS.get(name)


def group_indices(group_ids: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    """Positions of each group id, groups in order of first appearance."""
    groups: dict[Hashable, list[int]] = {}
    for i, gid in enumerate(group_ids):
        groups.setdefault(gid, []).append(i)
    return groups


# Rewards closer than this (relative to their size) are equal: a reward summed from
# per-turn parts carries rounding that depends on the order of the parts (novelty's
# -0.05 x 7 is -0.35 or -0.35000000000000003 by how the revisits fell), and a group
# "differing" by 6e-17 would be standardized by its std of 6e-17 (+ eps): advantages of
# 1e5 where the rewards say nothing.
EQUAL_RTOL = 1e-9


def no_signal(group_rewards: npt.ArrayLike) -> bool:
    """True for a group that carries no relative signal: fewer than two members, or all
    rewards equal up to rounding (`EQUAL_RTOL`)."""
    g = np.asarray(group_rewards, dtype=np.float64)
    if g.size < 2:
        return True
    with np.errstate(over="ignore", invalid="ignore"):
        spread = float(np.max(g) - np.min(g))
        size = float(np.max(np.abs(g)))
    return bool(spread <= EQUAL_RTOL * max(size, 1.0))


class NonFiniteRewards(ValueError):
    """Rewards the learner cannot compute advantages from (NaN, inf, or so large that the
    group's mean or std overflows)."""


def check_rewards(rewards: npt.ArrayLike, group_ids: Sequence[Hashable]) -> npt.NDArray[np.float64]:
    """Rewards as a finite float64 vector of the same length as ``group_ids``."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"rewards must be one scalar per trajectory, got shape {r.shape}")
    if len(group_ids) != r.shape[0]:
        raise ValueError(f"{r.shape[0]} rewards but {len(group_ids)} group ids")
    if not np.all(np.isfinite(r)):
        raise NonFiniteRewards(f"rewards must be finite, got {r.tolist()}")
    return r


def group_normalized_advantages(
    rewards: npt.ArrayLike,
    group_ids: Sequence[Hashable],
    *,
    std_normalize: bool,
    eps: float,
) -> AdvantageResult:
    """(r - group mean) / (group std + eps), or r - group mean when not std_normalize.

    The std is the *sample* std (Bessel-corrected, divisor G - 1), because SkyRL's
    ``compute_grpo_outcome_advantage`` uses ``torch.std``, whose default is unbiased. So the
    group [1, 0, 0, 0] has std 0.5 (not the population 0.433) and advantages 1.5 / -0.5.
    """
    r = check_rewards(rewards, group_ids)
    adv = np.zeros_like(r)
    zero_var = np.zeros(r.shape, dtype=np.bool_)
    degenerate: list[Hashable] = []
    groups = group_indices(group_ids)
    for gid, idx in groups.items():
        g = r[idx]
        if no_signal(g):  # a group of one has no baseline at all
            zero_var[idx] = True
            degenerate.append(gid)
            continue
        # Finite rewards can still overflow the normalisation (1e300 squared is inf, and
        # dividing by an infinite std gives all-zero advantages): refuse, never train on it.
        with np.errstate(over="ignore", invalid="ignore"):
            mean = g.mean()
            std = g.std(ddof=1) if std_normalize else 0.0
            centred = (g - mean) / (std + eps) if std_normalize else g - mean
        if not (np.isfinite(mean) and np.isfinite(std) and np.all(np.isfinite(centred))):
            raise NonFiniteRewards(
                f"group {gid!r}: rewards {g.tolist()} overflow the group normalisation "
                f"(mean {mean}, std {std}); rewards must stay in a bounded range")
        adv[idx] = centred
    return AdvantageResult(
        advantages=adv,
        zero_variance=zero_var,
        zero_variance_groups=tuple(degenerate),
        num_groups=len(groups),
    )


def returns_to_go(turn_rewards: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Each turn's reward plus every later one of its episode."""
    return np.cumsum(np.asarray(turn_rewards, dtype=np.float64)[::-1])[::-1]


def episode_return_scale(rtg: Sequence[npt.NDArray[np.float64]], *, std_normalize: bool,
                         eps: float) -> float:
    """What per-turn advantages are divided by: the sample std of the group's episode
    returns (each episode's first return-to-go) + eps, as ``grpo``; 1 when not
    ``std_normalize`` or when the returns are all equal up to rounding (`no_signal`: no
    division by a std of zero, or of rounding noise)."""
    returns = np.array([g[0] if len(g) else 0.0 for g in rtg])
    if std_normalize and not no_signal(returns):
        return float(returns.std(ddof=1) + eps)
    return 1.0


def against_baselines(rtg: Sequence[npt.NDArray[np.float64]],
                      baselines: Sequence[npt.NDArray[np.float64]],
                      scale: float) -> list[npt.NDArray[np.float64]]:
    """Each turn's return-to-go minus its baseline, over `scale`; 0 where the baseline is
    NaN (no other turn to compare with)."""
    return [np.where(np.isnan(b), 0.0, (g - np.nan_to_num(b)) / scale)
            for g, b in zip(rtg, baselines, strict=True)]


def turn_advantages(turn_rewards: Sequence[npt.ArrayLike], *, std_normalize: bool,
                    eps: float) -> list[npt.NDArray[np.float64]]:
    """Per-turn credit for one group: each turn's advantage is its return-to-go (its own
    reward and every later one of its episode) minus the mean return-to-go, at the same
    turn, of the group's episodes still playing then; divided by the std of the group's
    episode returns (sample std, as ``grpo``) when ``std_normalize``.

    So a good move in an episode that failed later still earns credit for what it closed,
    where the episode's single reward would blame it with the rest. A turn that only one
    episode reached has no baseline and gets 0. Hand-computed in the tests."""
    rtg = [returns_to_go(r) for r in turn_rewards]
    longest = max((len(g) for g in rtg), default=0)
    alive = [[g[t] for g in rtg if len(g) > t] for t in range(longest)]
    baseline = np.array([np.mean(v) if len(v) > 1 else np.nan for v in alive])
    scale = episode_return_scale(rtg, std_normalize=std_normalize, eps=eps)
    return against_baselines(rtg, [baseline[: len(g)] for g in rtg], scale)


def state_advantages(turn_returns: Sequence[npt.ArrayLike],
                     states: Sequence[Sequence[Hashable]], *, std_normalize: bool,
                     eps: float) -> list[npt.NDArray[np.float64]]:
    """Per-state credit for one group: each turn's return-to-go (``turn_returns``) minus
    the mean return-to-go of every turn of the group played from the same state
    (``states``: one key per turn, e.g. the prompt the policy saw); divided by the std of
    the group's episode returns (`episode_return_scale`) when ``std_normalize``. A state
    played from once has no baseline and gets 0.

    Why: with a per-turn context a prompt is a function of the state, so the turns of a
    group that saw the same prompt are one decision sampled several times, and their
    returns tell which action was better there, free of what the episodes did elsewhere.
    (An episode's one advantage blames a good move with the loop that came after it;
    per-turn credit compares turns that share only a turn number.) Hand-computed in the
    tests."""
    rtg = [np.asarray(g, dtype=np.float64) for g in turn_returns]
    if [len(g) for g in rtg] != [len(s) for s in states]:
        raise ValueError("one state key per turn: got returns-to-go of lengths "
                         f"{[len(g) for g in rtg]} and state keys of {[len(s) for s in states]}")
    visits: dict[Hashable, list[float]] = {}
    for g, keys in zip(rtg, states, strict=True):
        for value, key in zip(g, keys, strict=True):
            visits.setdefault(key, []).append(float(value))
    baseline = {key: (np.mean(v) if len(v) > 1 else np.nan) for key, v in visits.items()}
    scale = episode_return_scale(rtg, std_normalize=std_normalize, eps=eps)
    return against_baselines(
        rtg, [np.array([baseline[k] for k in keys], dtype=np.float64) for keys in states],
        scale)


@register_advantage_estimator("grpo")
def grpo_advantages(
    rewards: npt.ArrayLike, group_ids: Sequence[Hashable], cfg: GRPOConfig
) -> AdvantageResult:
    """GRPO; honours ``cfg.std_normalize`` (False gives Dr. GRPO's centring only)."""
    return group_normalized_advantages(
        rewards, group_ids, std_normalize=cfg.std_normalize, eps=cfg.eps
    )


@register_advantage_estimator("dr_grpo")
def dr_grpo_advantages(
    rewards: npt.ArrayLike, group_ids: Sequence[Hashable], cfg: GRPOConfig
) -> AdvantageResult:
    """Dr. GRPO (Liu et al. 2025): r - group mean, never divided by the std.

    (Dr. GRPO also replaces the per-sequence length normalisation with a constant; that is a
    loss-reduction choice, not part of this estimator.)
    """
    return group_normalized_advantages(rewards, group_ids, std_normalize=False, eps=cfg.eps)
