"""The GRPO objective for one micro-batch, composed from the registries.

Alignment convention (all [B, T] tensors of this package): position t holds the quantity
for token t *given tokens < t*: ``logp[:, t] = log pi(input_ids[:, t] | input_ids[:, :t])``.
Position 0 has no prediction (its value is unused and ``loss_mask[:, 0]`` is 0). A causal
LM's ``logits[:, t]`` predicts token t + 1, so ``rlfleet.policy.sequence_logprobs`` (the
one place logprobs are computed, with the engines' action space) shifts by one.
"""

from __future__ import annotations

import torch

from rlfleet.grpo.batching import MicroBatch
from rlfleet.grpo.config import GRPOConfig
from rlfleet.grpo.losses import aggregate, get_kl_estimator, get_policy_loss, masked_mean


def grpo_loss(
    logp_new: torch.Tensor,
    batch: MicroBatch,
    cfg: GRPOConfig,
    logp_ref: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss of one micro-batch: policy loss + kl_coef * KL(pi || pi_ref), both reduced by
    ``cfg.loss_reduction`` with whole-step denominators (so micro-batch losses add up to the
    step's loss; backprop each as is).

    ``logp_new`` [B, T]: current policy logprobs, aligned (see module doc), with grad.
    ``logp_ref`` [B, T]: reference (adapters disabled) logprobs, no grad needed; required
    when ``cfg.kl_coef > 0``, ignored otherwise.
    Stats are floats for this micro-batch: ``loss``/``policy_loss``/``kl_loss`` are its
    contributions to the step totals; means (``kl``, ``clip_frac``...) are over its tokens.
    """
    shape = tuple(batch.input_ids.shape)
    if tuple(logp_new.shape) != shape:
        raise ValueError(f"logp_new {tuple(logp_new.shape)} must match input_ids {shape}")
    mask = batch.loss_mask.to(device=logp_new.device, dtype=logp_new.dtype)
    old = batch.old_logprobs.to(device=logp_new.device, dtype=logp_new.dtype)
    adv = batch.advantages.to(device=logp_new.device, dtype=logp_new.dtype)
    adv = adv.unsqueeze(-1).expand(shape)
    denominator = batch.denominator(cfg.loss_reduction)

    policy_fn = get_policy_loss(cfg.policy_loss)
    per_token, stats = policy_fn(logp_new, old, adv, mask, cfg)
    divisor = batch.row_divisor.to(device=logp_new.device, dtype=logp_new.dtype)
    policy = aggregate(per_token, mask, cfg.loss_reduction, denominator, divisor)
    total = policy
    stats = dict(stats)
    stats["policy_loss"] = float(policy.detach())

    if cfg.kl_coef > 0:
        if logp_ref is None:
            raise ValueError("cfg.kl_coef > 0 needs logp_ref (reference-policy logprobs)")
        if tuple(logp_ref.shape) != shape:
            raise ValueError(f"logp_ref {tuple(logp_ref.shape)} must match input_ids {shape}")
        ref = logp_ref.detach().to(device=logp_new.device, dtype=logp_new.dtype)
        # Compare only on loss tokens; elsewhere both sides may be arbitrary.
        ref = torch.where(mask > 0, ref, logp_new.detach())
        kl = get_kl_estimator(cfg.kl_estimator)(logp_new, ref)
        kl_loss = aggregate(kl, mask, cfg.loss_reduction, denominator, divisor)
        total = total + cfg.kl_coef * kl_loss
        stats["kl"] = masked_mean(kl, mask)
        stats["kl_loss"] = float(kl_loss.detach())

    stats["loss"] = float(total.detach())
    # Mean negative logprob of the sampled tokens: an estimate of the policy's entropy at
    # the states it visited (exact in expectation on-policy), with no extra pass.
    stats["entropy"] = masked_mean(-logp_new.detach(), mask)
    stats["num_loss_tokens"] = float(mask.sum())
    stats["num_sequences"] = float(shape[0])
    return total, stats
