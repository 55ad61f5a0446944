"""Pack trajectories into padded micro-batches for gradient accumulation.

Each ``MicroBatch`` carries the whole step's normalisers (total loss tokens and total
trajectories), and ``grpo_loss`` divides by those instead of the micro-batch's own counts.
Hence sum_k loss(micro-batch k) == loss(whole batch) and, by linearity, the accumulated
gradient equals the single big-batch gradient for both reductions, whatever the split:
call ``loss.backward()`` on each micro-batch loss as is, with no extra scaling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rlfleet.grpo.sample import TrainSample


@dataclasses.dataclass(frozen=True, eq=False)
class MicroBatch:
    """Right-padded tensors for B trajectories of at most T tokens.

    - ``input_ids`` [B, T] int64 (padding: ``pad_token_id``)
    - ``attention_mask`` [B, T] int64, 1 on real tokens
    - ``loss_mask`` [B, T] float32, 1 on trained tokens, 0 on padding
    - ``old_logprobs`` [B, T] float32, the behaviour policy's logprobs (0 on padding)
    - ``advantages`` [B] float32, one per trajectory
    - ``total_loss_tokens`` / ``total_sequences``: counts over the whole optimiser step
    - ``extras``: each trajectory's opaque extras, in row order
    - ``indices``: each row's position in the list given to ``make_micro_batches``
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    total_loss_tokens: int
    total_sequences: int
    extras: tuple[Mapping[str, Any], ...]
    indices: tuple[int, ...]

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def denominator(self, mode: str) -> int:
        """The whole-step count that ``aggregate`` divides by for reduction ``mode``."""
        return self.total_loss_tokens if mode == "token_mean" else self.total_sequences

    def to(self, device: torch.device | str) -> MicroBatch:
        return dataclasses.replace(
            self,
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            loss_mask=self.loss_mask.to(device),
            old_logprobs=self.old_logprobs.to(device),
            advantages=self.advantages.to(device),
        )


def collate(
    samples: Sequence[TrainSample],
    *,
    total_loss_tokens: int,
    total_sequences: int,
    indices: Sequence[int],
    pad_token_id: int = 0,
) -> MicroBatch:
    """Right-pad ``samples`` into one ``MicroBatch``."""
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    missing = [i for i, s in zip(indices, samples, strict=True) if s.advantage is None]
    if missing:
        raise ValueError(f"samples at {missing} have no advantage; run prepare_batch first")
    b, t = len(samples), max(s.num_tokens for s in samples)
    input_ids = torch.full((b, t), pad_token_id, dtype=torch.int64)
    attention_mask = torch.zeros((b, t), dtype=torch.int64)
    loss_mask = torch.zeros((b, t), dtype=torch.float32)
    old_logprobs = torch.zeros((b, t), dtype=torch.float32)
    for row, s in enumerate(samples):
        n = s.num_tokens
        input_ids[row, :n] = torch.from_numpy(s.input_ids)
        attention_mask[row, :n] = 1
        loss_mask[row, :n] = torch.from_numpy(s.loss_mask)
        # Zero off the mask so nothing unread can be NaN downstream.
        old_logprobs[row, :n] = torch.from_numpy(s.logprobs * s.loss_mask)
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        old_logprobs=old_logprobs,
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        total_loss_tokens=total_loss_tokens,
        total_sequences=total_sequences,
        extras=tuple(s.extras for s in samples),
        indices=tuple(indices),
    )


def make_micro_batches(
    samples: Sequence[TrainSample],
    micro_batch_size: int,
    *,
    pad_token_id: int = 0,
) -> list[MicroBatch]:
    """Split one optimiser step's samples, in order, into micro-batches of at most
    ``micro_batch_size`` trajectories. An empty list gives no micro-batches."""
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int):
        raise ValueError(f"micro_batch_size must be an int, got {micro_batch_size!r}")
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    total_tokens = sum(s.num_loss_tokens for s in samples)
    return [
        collate(
            samples[start : start + micro_batch_size],
            total_loss_tokens=total_tokens,
            total_sequences=len(samples),
            indices=range(start, min(start + micro_batch_size, len(samples))),
            pad_token_id=pad_token_id,
        )
        for start in range(0, len(samples), micro_batch_size)
    ]
