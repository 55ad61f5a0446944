"""The gradient of one micro-batch: the policy's logprobs at the loss tokens (and the
reference's, without the adapter, where the KL term needs them), the GRPO loss, its
backward. Kept free of the learner's config and of Ray, so the GPU bench (bench/gpu)
times exactly the trainer's computation."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlfleet.grpo import GRPOConfig, MicroBatch, grpo_loss
from rlfleet.policy import sequence_logprobs
from rlfleet.policy.loading import PolicyProcessor
from rlfleet.policy.vision import VisionEncoder


def micro_batch_logprobs(model: torch.nn.Module, processor: PolicyProcessor, mb: MicroBatch,
                         temperature: float, vision: VisionEncoder | None) -> torch.Tensor:
    """Logprobs of every row of ``mb``, computed once per distinct sequence
    (``forward_rows``) and at the loss positions only."""
    rows = list(mb.forward_rows)
    seqs = [list(map(int, r)) for r in unpadded_rows(mb, rows)]
    images = [mb.extras[r]["images"] for r in rows]
    logp = sequence_logprobs(model, processor, seqs, images, temperature=temperature,
                             score_mask=mb.loss_mask[rows], vision=vision)
    return logp[mb.inverse.to(logp.device)]


def backward_micro_batch(model: torch.nn.Module, processor: PolicyProcessor, mb: MicroBatch,
                         grpo: GRPOConfig, vision: VisionEncoder | None
                         ) -> dict[str, torch.Tensor | float]:
    """Back-propagate the GRPO loss of ``mb`` (gradients accumulate); its stats."""
    logp = micro_batch_logprobs(model, processor, mb, grpo.temperature, vision)
    logp_ref = None
    if grpo.kl_coef > 0:
        with torch.no_grad(), model.disable_adapter():
            logp_ref = micro_batch_logprobs(model, processor, mb, grpo.temperature, vision)
    loss, stats = grpo_loss(logp, mb, grpo, logp_ref)
    loss.backward()
    return stats


def unpadded_rows(mb: MicroBatch, which: Sequence[int]) -> list[list[int]]:
    """Unpadded token rows ``which`` of a micro-batch."""
    lengths = mb.attention_mask.sum(dim=1).tolist()
    return [mb.input_ids[i, : int(lengths[i])].tolist() for i in which]
