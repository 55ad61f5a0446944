"""From rollout trajectories (protobufs) to GRPO training rows.

Advantages are computed per trajectory (one reward per episode, grouped by task); each
trajectory then becomes one training row per independent sequence it holds: one row in
context "full", one row per turn in the per-turn contexts (each carrying the trajectory's
advantage, and the trajectory's identity and loss-token count so that ``sequence_mean``
weighs trajectories, not rows), with the frames that sequence shows as PNG bytes (the
trainer's vision cache decodes a frame only the first time it sees it).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import replace

import numpy as np

from rlfleet.grpo import BatchStats, GRPOConfig, NonFiniteRewards, TrainSample, prepare_batch
from rlfleet.grpo.advantages import (
    group_indices,
    returns_to_go,
    state_advantages,
    turn_advantages,
)
from rlfleet.v1 import rollout_pb2


def trajectory_sample(t: rollout_pb2.Trajectory, group_id: str) -> TrainSample:
    """The trajectory as one sample; ``sequence_key`` names it within the step."""
    return TrainSample(
        input_ids=np.asarray(t.token_ids, dtype=np.int64),
        loss_mask=np.asarray(t.loss_mask, dtype=np.float32),
        logprobs=np.asarray(t.logprobs, dtype=np.float32),
        reward=t.reward,
        group_id=group_id,
        adapter_version=t.adapter.version,
        extras={"trajectory": t},
        sequence_key=(group_id, t.index),
    )


def trajectory_pngs(t: rollout_pb2.Trajectory) -> list[bytes]:
    if any(not img.png for img in t.images):
        raise ValueError("trajectory lacks inline images; request include_images=true")
    return [img.png for img in t.images]


def row_key(sample: TrainSample) -> Hashable:
    """Equal for rows that are the same sequence: same tokens, same loss positions and
    the same frames (the trainer runs the model once for all of them)."""
    return (sample.input_ids.tobytes(), sample.loss_mask.tobytes(),
            tuple(sample.extras["image_keys"]))


def segment_bounds(t: rollout_pb2.Trajectory) -> list[tuple[int, int]]:
    """Each segment's (start, end) token span: one segment in context "full", one per
    turn in the per-turn contexts."""
    bounds = [*(t.segment_starts or [0]), len(t.token_ids)]
    return list(zip(bounds, bounds[1:], strict=False))


def segment_rows(sample: TrainSample, advantages: Sequence[float] | None = None
                 ) -> list[TrainSample]:
    """The sample split at its trajectory's segment starts, images split alongside; with
    `advantages` (one per segment: per-turn credit) each row gets its segment's."""
    t: rollout_pb2.Trajectory = sample.extras["trajectory"]
    images = trajectory_pngs(t)
    keys = [img.sha256 for img in t.images]
    rows = []
    for k, (start, end) in enumerate(segment_bounds(t)):
        first = sum(1 for off in t.image_token_offsets if off < start)
        count = sum(1 for off in t.image_token_offsets if start <= off < end)
        mask = sample.loss_mask[start:end]
        if mask.sum() == 0:
            continue  # a segment the model never answered in (cut off)
        rows.append(replace(
            sample,
            input_ids=sample.input_ids[start:end],
            loss_mask=mask,
            logprobs=sample.logprobs[start:end],
            extras={"images": images[first:first + count],
                    "image_keys": keys[first:first + count]},
            sequence_loss_tokens=sample.num_loss_tokens,
            advantage=sample.advantage if advantages is None else float(advantages[k]),
        ))
    return rows


class NoTurnRewards(ValueError):
    """Per-turn credit asked for, and the reward gave no split over the turns (or one of
    the wrong length)."""


def turn_split(sample: TrainSample, credit: str, *, required: bool) -> list[float] | None:
    """The reward's split of the sample's trajectory over its turns (one per segment), or
    None where the reward gave none and `required` is false. A split of the wrong length
    is refused whatever `required` says: the reward service and the rollout disagree on
    the turns, and guessing which turn a reward belongs to would credit the wrong move."""
    t: rollout_pb2.Trajectory = sample.extras["trajectory"]
    turns = len(segment_bounds(t))
    if len(t.turn_rewards) == turns:
        return list(t.turn_rewards)
    if not t.turn_rewards and not required:
        return None
    raise NoTurnRewards(
        f"grpo.credit is {credit!r}, but reward {t.reward_name!r} {t.reward_version} split "
        f"trajectory {sample.sequence_key} into {len(t.turn_rewards)} turn rewards for "
        f"{turns} turns: per-turn credit needs a reward that splits over the turns (e.g. "
        "'progress') and a per-turn context")


def turn_credit(kept: Sequence[TrainSample], cfg: GRPOConfig) -> dict[Hashable, list[float]]:
    """Per-turn advantages (grpo.credit "turn") of the kept samples, by sequence key: one
    per segment, from the reward service's turn rewards (one per turn, so one per segment
    in the per-turn contexts)."""
    out: dict[Hashable, list[float]] = {}
    for positions in group_indices([sample.group_id for sample in kept]).values():
        members = [kept[i] for i in positions]
        splits = [turn_split(sample, "turn", required=True) for sample in members]
        for sample, advantages in zip(members, turn_advantages(
                splits, std_normalize=cfg.std_normalize, eps=cfg.eps), strict=True):
            out[sample.sequence_key] = advantages.tolist()
    return out


def segment_prompts(t: rollout_pb2.Trajectory) -> list[Hashable]:
    """One key per segment (turn): the tokens before its first answer token and the
    frames among them, equal for turns that saw the same prompt."""
    keys: list[Hashable] = []
    for start, end in segment_bounds(t):
        answer = next((i for i in range(start, end) if t.loss_mask[i]), end)
        frames = tuple(img.sha256 for img, off in zip(t.images, t.image_token_offsets,
                                                       strict=False) if start <= off < answer)
        keys.append((tuple(t.token_ids[start:answer]), frames))
    return keys


def state_credit(kept: Sequence[TrainSample], cfg: GRPOConfig) -> dict[Hashable, list[float]]:
    """Per-state advantages (grpo.credit "state") of the kept samples, by sequence key:
    one per segment, each turn's return-to-go against the group's turns from the same
    prompt; the return-to-go from the reward's split over the turns where it gives one,
    else the episode's reward at every turn (e.g. task: whether the episode went on to
    solve). A split of the wrong length is refused (`turn_split`)."""
    out: dict[Hashable, list[float]] = {}
    for positions in group_indices([sample.group_id for sample in kept]).values():
        members = [kept[i] for i in positions]
        returns, states = [], []
        for sample in members:
            t: rollout_pb2.Trajectory = sample.extras["trajectory"]
            keys = segment_prompts(t)
            split = turn_split(sample, "state", required=False)
            returns.append(returns_to_go(split) if split is not None
                           else [t.reward] * len(keys))
            states.append(keys)
        for sample, advantages in zip(members, state_advantages(
                returns, states, std_normalize=cfg.std_normalize, eps=cfg.eps), strict=True):
            out[sample.sequence_key] = advantages.tolist()
    return out


def generated_vision_tokens(t: rollout_pb2.Trajectory, vision_ids: set[int]) -> bool:
    """An engine that sampled a vision placeholder made an unscoreable sequence; such a
    trajectory is dropped (engines ban them; see rlfleet.engines.base)."""
    return any(m and tok in vision_ids for tok, m in zip(t.token_ids, t.loss_mask, strict=True))


def check_finite_rewards(
        groups: Sequence[tuple[str, Sequence[rollout_pb2.Trajectory]]]) -> None:
    """NonFiniteRewards naming the trajectory (group, index, reward service, replica) whose
    reward is NaN or inf: checked before advantages, whatever the reward service let by."""
    for key, trajectories in groups:
        for t in trajectories:
            if not (math.isfinite(t.reward) and all(map(math.isfinite, t.turn_rewards))):
                raise NonFiniteRewards(
                    f"group {key} index {t.index}: reward {t.reward!r} (turn rewards "
                    f"{list(t.turn_rewards)}) from reward "
                    f"{t.reward_name!r} {t.reward_version} (replica {t.replica_id!r}) is not "
                    "a finite number; refusing to compute advantages from it")


def build_rows(
    groups: Sequence[tuple[str, Sequence[rollout_pb2.Trajectory]]],
    current_version: int,
    cfg: GRPOConfig,
    vision_ids: set[int] = frozenset(),
) -> tuple[list[TrainSample], BatchStats, int]:
    """Filters (unscoreable, staleness, zero-variance groups), computes advantages, and
    splits into rows. Also returns how many kept trajectories carry a learning signal
    (a non-zero advantage)."""
    check_finite_rewards(groups)
    samples = [trajectory_sample(t, key) for key, trajectories in groups for t in trajectories
               if sum(t.loss_mask) > 0 and not generated_vision_tokens(t, vision_ids)]
    kept, stats = prepare_batch(samples, current_version, cfg)
    credit = {"turn": turn_credit, "state": state_credit}.get(cfg.credit)
    per_turn = credit(kept, cfg) if credit else {}
    rows = [row for sample in kept
            for row in segment_rows(sample, per_turn.get(sample.sequence_key))]
    return rows, stats, sum(1 for s in kept if s.advantage)
