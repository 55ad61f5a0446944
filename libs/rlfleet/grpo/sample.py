"""``TrainSample``: one trajectory as the learner trains on it, independent of any model.

The learner converts rollout protobufs into these. Token-aligned arrays follow the
alignment convention of ``rlfleet.grpo.step``: entry t refers to token t predicted from
tokens < t, so position 0 is never a loss position.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclasses.dataclass(frozen=True, eq=False)
class TrainSample:
    """A trajectory, flattened to one token sequence (all turns, prompts and responses).

    - ``input_ids`` [T]: token ids.
    - ``loss_mask`` [T]: 1 on tokens the policy sampled (trained on), 0 on prompt,
      observation and template tokens. ``loss_mask[0]`` must be 0.
    - ``logprobs`` [T]: logprob the behaviour (rollout) policy gave token t; only read
      where ``loss_mask`` is 1 (put 0 elsewhere).
    - ``reward``: the scalar episode reward; ``group_id``: trajectories of one task share it.
    - ``adapter_version``: the adapter version it was sampled with (staleness filter).
    - ``advantage``: filled by ``filtering.prepare_batch``; None until then.
    - ``extras``: opaque per-trajectory data (images, pixel_values, turn boundaries...)
      carried through batching untouched, in order.
    - ``sequence_key`` / ``sequence_loss_tokens``: when one trajectory is trained as
      several rows (one per turn in the per-turn contexts), every row names the trajectory
      it belongs to and that trajectory's loss-token count, so ``sequence_mean`` averages
      within each trajectory and then over trajectories, never over rows. Unset (None /
      0): the row is its own trajectory.
    """

    input_ids: npt.NDArray[np.int64]
    loss_mask: npt.NDArray[np.float32]
    logprobs: npt.NDArray[np.float32]
    reward: float
    group_id: Hashable
    adapter_version: int
    advantage: float | None = None
    extras: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    sequence_key: Hashable | None = None
    sequence_loss_tokens: int = 0

    def __post_init__(self) -> None:
        ids = np.asarray(self.input_ids)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError(f"input_ids must be a non-empty 1-D sequence, got shape {ids.shape}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"input_ids must be integers, got dtype {ids.dtype}")
        mask = np.asarray(self.loss_mask, dtype=np.float32)
        logp = np.asarray(self.logprobs, dtype=np.float32)
        for name, arr in (("loss_mask", mask), ("logprobs", logp)):
            if arr.shape != ids.shape:
                raise ValueError(f"{name} has shape {arr.shape}, input_ids {ids.shape}")
        if not np.all((mask == 0) | (mask == 1)):
            raise ValueError("loss_mask must hold only 0 and 1")
        if mask[0] != 0:
            raise ValueError("loss_mask[0] must be 0: the first token has no logprob")
        if mask.sum() == 0:
            raise ValueError("trajectory has no loss tokens (loss_mask is all 0)")
        on = mask > 0
        # A little slack above 0: engines round near-certain tokens' logprobs in float32.
        if not np.all(np.isfinite(logp[on])) or np.any(logp[on] > 1e-4):
            raise ValueError("logprobs on loss tokens must be finite and <= 0")
        if not np.isfinite(self.reward):
            raise ValueError(f"reward must be finite, got {self.reward!r}")
        if isinstance(self.adapter_version, bool) or not isinstance(
            self.adapter_version, int | np.integer
        ):
            raise ValueError(f"adapter_version must be an int, got {self.adapter_version!r}")
        if self.advantage is not None and not np.isfinite(self.advantage):
            raise ValueError(f"advantage must be finite, got {self.advantage!r}")
        if self.sequence_loss_tokens and self.sequence_loss_tokens < mask.sum():
            raise ValueError(f"sequence_loss_tokens={self.sequence_loss_tokens} is fewer than "
                             f"this row's {int(mask.sum())} loss tokens")
        object.__setattr__(self, "input_ids", ids.astype(np.int64, copy=False))
        object.__setattr__(self, "loss_mask", mask)
        object.__setattr__(self, "logprobs", logp)
        object.__setattr__(self, "reward", float(self.reward))
        object.__setattr__(self, "adapter_version", int(self.adapter_version))

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @property
    def sequence_divisor(self) -> int:
        """Loss tokens of the whole trajectory this row belongs to (sequence_mean)."""
        return self.sequence_loss_tokens or self.num_loss_tokens

    def with_advantage(self, advantage: float) -> TrainSample:
        return dataclasses.replace(self, advantage=float(advantage))
