"""Pack trajectories into padded micro-batches for gradient accumulation.

Each ``MicroBatch`` carries the whole step's normalisers (total loss tokens and total
trajectories), and ``grpo_loss`` divides by those instead of the micro-batch's own counts.
Hence sum_k loss(micro-batch k) == loss(whole batch) and, by linearity, the accumulated
gradient equals the single big-batch gradient for both reductions, whatever the split:
call ``loss.backward()`` on each micro-batch loss as is, with no extra scaling.

Duplicates: rows that are the same sequence (``dedup_key``) need one forward pass
between them. A micro-batch holds every duplicate's own row (its advantage, its recorded
logprobs), and ``forward_rows`` names one representative per distinct sequence; the
caller runs the model on those rows only and expands the result with ``inverse``. The
loss, and so the gradient, is exactly that of running every row. In the per-turn
contexts the G episodes of a group often pass through the same state with the same
feedback and take the same action there, so many rows of a step are duplicates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
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
    - ``row_divisor`` [B] float32: the loss tokens of each row's trajectory (what
      ``sequence_mean`` divides a row's token sum by)
    - ``total_loss_tokens`` / ``total_sequences``: counts over the whole optimiser step
      (``total_sequences`` counts trajectories, however many rows each has)
    - ``extras``: each trajectory's opaque extras, in row order
    - ``indices``: each row's position in the list given to ``make_micro_batches``
    - ``forward_rows``: one row per distinct sequence, the rows to run the model on
    - ``inverse`` [B] int64: for every row, its sequence's position in ``forward_rows``
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    row_divisor: torch.Tensor
    total_loss_tokens: int
    total_sequences: int
    extras: tuple[Mapping[str, Any], ...]
    indices: tuple[int, ...]
    forward_rows: tuple[int, ...]
    inverse: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_forward(self) -> int:
        """Rows the model runs on (distinct sequences)."""
        return len(self.forward_rows)

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
            row_divisor=self.row_divisor.to(device),
            inverse=self.inverse.to(device),
        )


def collate(
    samples: Sequence[TrainSample],
    *,
    total_loss_tokens: int,
    total_sequences: int,
    indices: Sequence[int],
    pad_token_id: int = 0,
    inverse: Sequence[int] | None = None,
) -> MicroBatch:
    """Right-pad ``samples`` into one ``MicroBatch``. ``inverse`` maps each row to its
    distinct sequence (numbered in order of first appearance); None: all distinct."""
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
    inverse = list(range(b)) if inverse is None else list(inverse)
    forward_rows = [inverse.index(u) for u in range(max(inverse) + 1)]
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        old_logprobs=old_logprobs,
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        row_divisor=torch.tensor([s.sequence_divisor for s in samples], dtype=torch.float32),
        total_loss_tokens=total_loss_tokens,
        total_sequences=total_sequences,
        extras=tuple(s.extras for s in samples),
        indices=tuple(indices),
        forward_rows=tuple(forward_rows),
        inverse=torch.tensor(inverse, dtype=torch.int64),
    )


def make_micro_batches(
    samples: Sequence[TrainSample],
    micro_batch_size: int,
    *,
    pad_token_id: int = 0,
    dedup_key: Callable[[TrainSample], Hashable] | None = None,
) -> list[MicroBatch]:
    """Split one optimiser step's samples into micro-batches of at most
    ``micro_batch_size`` distinct sequences (forward rows). Without ``dedup_key`` every
    sample is distinct and the split keeps their order; with it, samples with equal keys
    share a micro-batch and one forward row (order: by first appearance). An empty list
    gives no micro-batches."""
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int):
        raise ValueError(f"micro_batch_size must be an int, got {micro_batch_size!r}")
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    total_tokens = sum(s.num_loss_tokens for s in samples)
    total_sequences = len({("row", i) if s.sequence_key is None else ("seq", s.sequence_key)
                           for i, s in enumerate(samples)})
    units: dict[Hashable, list[int]] = {}
    for i, s in enumerate(samples):
        units.setdefault(i if dedup_key is None else dedup_key(s), []).append(i)
    groups = list(units.values())
    out = []
    for start in range(0, len(groups), micro_batch_size):
        chunk = groups[start : start + micro_batch_size]
        rows = [i for unit in chunk for i in unit]
        inverse = [u for u, unit in enumerate(chunk) for _ in unit]
        out.append(collate(
            [samples[i] for i in rows],
            total_loss_tokens=total_tokens,
            total_sequences=total_sequences,
            indices=rows,
            pad_token_id=pad_token_id,
            inverse=inverse,
        ))
    return out
