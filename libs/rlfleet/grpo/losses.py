"""Policy losses, KL estimators (two registries) and the loss reduction.

Every tensor here is [B, T] and aligned to token positions (see ``rlfleet.grpo.step``);
``mask`` is 1.0 on tokens that carry loss (model-sampled tokens) and 0.0 elsewhere.
A policy loss returns the *unreduced* per-token loss (zero off the mask) and a dict of
float stats; the reduction is applied once, by ``aggregate``, so that micro-batches can be
normalised by whole-step counts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from rlfleet.grpo.config import LOSS_REDUCTIONS
from rlfleet.registries import KL_ESTIMATORS_GROUP, POLICY_LOSSES_GROUP, Registry

if TYPE_CHECKING:
    from rlfleet.grpo.config import GRPOConfig

# exp() of log-ratios beyond this overflows float16/bfloat16 ranges; SkyRL clamps at 20 too.
LOG_RATIO_CLAMP = 20.0

PolicyLoss = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, "GRPOConfig"],
    tuple[torch.Tensor, dict[str, float]],
]
KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# rlfleet's own below, plus the ``rlfleet.policy_losses`` / ``rlfleet.kl_estimators``
# entry points
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", POLICY_LOSSES_GROUP,
                                               autodiscover=True)
KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator", KL_ESTIMATORS_GROUP,
                                                autodiscover=True)


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator for ``fn(logp_new, logp_old, advantages, mask, cfg) -> (loss[B,T], stats)``.

    ``advantages`` is broadcast to [B, T]; the returned loss must be 0 where mask is 0.
    """
    return POLICY_LOSSES.register(name)


def get_policy_loss(name: str) -> PolicyLoss:
    return POLICY_LOSSES.get(name)


def register_kl_estimator(name: str) -> Callable[[KLEstimator], KLEstimator]:
    """Decorator for ``fn(logp, logp_ref) -> per-token KL(pi || pi_ref) estimate [B, T]``."""
    return KL_ESTIMATORS.register(name)


def get_kl_estimator(name: str) -> KLEstimator:
    return KL_ESTIMATORS.get(name)


# --- reduction -------------------------------------------------------------------------


def aggregate(
    loss_per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    denominator: float | None = None,
    row_divisor: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a [B, T] per-token loss to a scalar.

    - ``token_mean``: sum of masked token losses / number of loss tokens.
    - ``sequence_mean``: per row, the mean over its loss tokens; then the mean over rows.

    ``denominator`` replaces the local count (loss tokens for token_mean, rows for
    sequence_mean) with the count over the whole optimiser step, which is what makes the
    micro-batch losses sum to the full-batch loss (see ``batching.MicroBatch``).
    ``row_divisor`` [B] replaces each row's own loss-token count in ``sequence_mean``:
    a trajectory split into rows divides every row by the trajectory's count, so with
    ``denominator`` = trajectories the result is the mean over trajectories of each
    trajectory's token mean.
    """
    if mode not in LOSS_REDUCTIONS:
        raise ValueError(f"unknown loss reduction {mode!r}; expected one of {LOSS_REDUCTIONS}")
    if loss_per_token.shape != mask.shape or loss_per_token.dim() != 2:
        raise ValueError(
            f"loss {tuple(loss_per_token.shape)} and mask {tuple(mask.shape)} must both be [B, T]"
        )
    mask = mask.to(loss_per_token.dtype)
    # where(), not multiply: a non-finite value off the mask must not leak in as NaN.
    masked = torch.where(mask > 0, loss_per_token, torch.zeros_like(loss_per_token)) * mask
    if mode == "token_mean":
        count = mask.sum() if denominator is None else denominator
        return masked.sum() / _positive(count)
    divisor = mask.sum(dim=-1) if row_divisor is None else row_divisor.to(masked.dtype)
    per_row = masked.sum(dim=-1) / divisor.clamp(min=1.0)
    count = per_row.shape[0] if denominator is None else denominator
    return per_row.sum() / _positive(count)


def _positive(count: float | torch.Tensor) -> float | torch.Tensor:
    if float(count) <= 0:
        raise ValueError("loss reduction over zero loss tokens/sequences: nothing to train on")
    return count


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of ``values`` over mask > 0, as a float (0.0 for an empty mask); for stats."""
    sel = values.detach()[mask > 0]
    return float(sel.mean()) if sel.numel() else 0.0


def masked_max(values: torch.Tensor, mask: torch.Tensor) -> float:
    sel = values.detach()[mask > 0]
    return float(sel.max()) if sel.numel() else 0.0


# --- KL estimators (Schulman, "Approximating KL divergence", 2020) ---------------------
# Samples come from the current policy pi; log r = logp_ref - logp. All are estimators of
# KL(pi || pi_ref). The reference is the base model with the adapters disabled.


@register_kl_estimator("k1")
def kl_k1(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """-log r = logp - logp_ref: unbiased, high variance, can be negative."""
    return logp - logp_ref


@register_kl_estimator("k2")
def kl_k2(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """(log r)^2 / 2: biased, low variance, >= 0."""
    return 0.5 * (logp - logp_ref).square()


@register_kl_estimator("k3")
def kl_k3(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """(r - 1) - log r: unbiased, >= 0. Clamped like SkyRL (log r to ±20, result to ±10)."""
    log_r = (logp_ref - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(log_r) - log_r - 1.0).clamp(-10.0, 10.0)


# --- policy losses ---------------------------------------------------------------------


def importance_log_ratio(
    logp_new: torch.Tensor, logp_old: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """log(pi_new / pi_behaviour) per token, 0 off the mask, clamped to avoid overflow."""
    diff = torch.where(mask > 0, logp_new - logp_old, torch.zeros_like(logp_new))
    return diff.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


@register_policy_loss("ppo_clip")
def ppo_clip_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: GRPOConfig,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric bounds and optional dual clip.

    ratio = exp(logp_new - logp_old), where logp_old are the logprobs the rollout recorded.
    loss = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high)); for A < 0 and
    dual_clip = c it is further capped at c * |A| (a very large ratio on a bad action cannot
    blow up the step). A token whose ratio is clipped has zero gradient.
    """
    log_ratio = importance_log_ratio(logp_new, logp_old, mask)
    ratio = torch.exp(log_ratio)
    clipped_ratio = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * clipped_ratio
    loss = torch.maximum(loss_unclipped, loss_clipped)
    dual_clipped = torch.zeros_like(mask, dtype=torch.bool)
    if cfg.dual_clip is not None:
        cap = -advantages * cfg.dual_clip  # positive where A < 0
        dual_clipped = (advantages < 0) & (loss > cap)
        loss = torch.where(advantages < 0, torch.minimum(loss, cap), loss)
    loss = torch.where(mask > 0, loss, torch.zeros_like(loss))
    with torch.no_grad():
        clipped = (loss_clipped > loss_unclipped).to(ratio.dtype)
        stats = {
            "clip_frac": masked_mean(clipped, mask),
            "dual_clip_frac": masked_mean(dual_clipped.to(ratio.dtype), mask),
            "ratio_mean": masked_mean(ratio, mask),
            "ratio_max": masked_max(ratio, mask),
            # KL(behaviour || new) by k3 on behaviour samples: the usual PPO drift monitor.
            "approx_kl": masked_mean(kl_k3(logp_old, logp_new.detach()), mask),
        }
    return loss, stats
