"""Policy loss (PPO clip, dual clip), KL estimators and the loss reduction."""

import math

import pytest
import torch

from rlfleet.grpo import (
    GRPOConfig,
    aggregate,
    get_kl_estimator,
    get_policy_loss,
    register_kl_estimator,
    register_policy_loss,
)
from rlfleet.grpo.losses import KL_ESTIMATORS, POLICY_LOSSES


def ppo(ratios: list[float], advs: list[float], cfg: GRPOConfig, mask: list[float] | None = None):
    """Run ppo_clip on one row with behaviour logprob log(0.5) and the given ratios."""
    old = torch.full((1, len(ratios)), math.log(0.5), dtype=torch.float64)
    new = (old + torch.log(torch.tensor([ratios], dtype=torch.float64))).requires_grad_()
    adv = torch.tensor([advs], dtype=torch.float64)
    m = torch.tensor([mask if mask is not None else [1.0] * len(ratios)], dtype=torch.float64)
    loss, stats = get_policy_loss("ppo_clip")(new, old, adv, m, cfg)
    loss.sum().backward()
    return loss.detach()[0].tolist(), new.grad[0].tolist(), stats


def test_ppo_clip_values_and_gradients() -> None:
    cfg = GRPOConfig(dual_clip=None)
    # (ratio, A): inside bounds -> -A r, grad -A r; clipped in the direction that would
    # increase the objective further -> constant, zero grad.
    loss, grad, stats = ppo([1.1, 1.5, 0.5, 0.5, 1.5], [1, 1, 1, -1, -1], cfg)
    assert loss == pytest.approx([-1.1, -1.2, -0.5, 0.8, 1.5])
    assert grad == pytest.approx([-1.1, 0.0, -0.5, 0.0, 1.5])
    assert stats["clip_frac"] == pytest.approx(2 / 5)
    assert stats["ratio_mean"] == pytest.approx((1.1 + 1.5 + 0.5 + 0.5 + 1.5) / 5)
    assert stats["ratio_max"] == pytest.approx(1.5)


def test_separate_low_and_high_bounds() -> None:
    cfg = GRPOConfig(clip_low=0.1, clip_high=0.3, dual_clip=None)
    loss, grad, _ = ppo([1.25, 1.35, 0.85, 0.95], [1, 1, -1, -1], cfg)
    # A>0: upper bound 1.3 -> 1.25 free, 1.35 clipped; A<0: lower bound 0.9 -> 0.85 clipped.
    assert loss == pytest.approx([-1.25, -1.3, 0.9, 0.95])
    assert grad == pytest.approx([-1.25, 0.0, 0.0, 0.95])


def test_dual_clip_caps_negative_advantage_loss() -> None:
    loss, grad, stats = ppo([4.0, 2.0, 4.0], [-1, -1, 1], GRPOConfig(dual_clip=3.0))
    # A=-1, ratio 4: PPO loss 4 > 3 |A| -> capped at 3, zero grad; ratio 2 stays 2.
    # A>0 is never dual-clipped (ratio 4 -> clipped to 1.2 by the normal clip).
    assert loss == pytest.approx([3.0, 2.0, -1.2])
    assert grad == pytest.approx([0.0, 2.0, 0.0])
    assert stats["dual_clip_frac"] == pytest.approx(1 / 3)
    loss, grad, _ = ppo([4.0], [-1], GRPOConfig(dual_clip=None))
    assert loss == pytest.approx([4.0]) and grad == pytest.approx([4.0])


def test_masked_tokens_give_zero_loss_and_gradient_even_if_not_finite() -> None:
    old = torch.tensor([[-0.5, 0.0]], dtype=torch.float64)
    new = torch.tensor([[-0.4, float("inf")]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    loss, _ = get_policy_loss("ppo_clip")(new, old, adv, mask, GRPOConfig())
    aggregate(loss, mask, "token_mean").backward()
    assert torch.isfinite(loss).all() and loss[0, 1] == 0
    assert new.grad[0, 1] == 0 and torch.isfinite(new.grad).all()


def test_kl_estimators_hand_values() -> None:
    logp = torch.tensor([[math.log(0.5)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
    ln2 = math.log(2)
    assert get_kl_estimator("k1")(logp, ref).item() == pytest.approx(ln2)
    assert get_kl_estimator("k2")(logp, ref).item() == pytest.approx(0.5 * ln2**2)
    # k3 = (r - 1) - log r with r = p_ref / p = 0.5
    assert get_kl_estimator("k3")(logp, ref).item() == pytest.approx(0.5 - 1 + ln2)
    for name in ("k1", "k2", "k3"):
        assert get_kl_estimator(name)(logp, logp).item() == 0.0


def test_k1_and_k3_are_unbiased_for_kl() -> None:
    # Exact expectation under p over a 4-token vocabulary equals KL(p || q).
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    q = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    kl = float((p * (p / q).log()).sum())
    for name in ("k1", "k3"):
        est = get_kl_estimator(name)(p.log()[None], q.log()[None])[0]
        assert float((p * est).sum()) == pytest.approx(kl)
    assert (get_kl_estimator("k3")(p.log()[None], q.log()[None]) >= 0).all()


def test_aggregate_token_vs_sequence_mean() -> None:
    loss = torch.tensor([[0.0, 1.0, 2.0, 3.0], [0.0, 4.0, 9.0, 9.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
    assert aggregate(loss, mask, "token_mean").item() == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert aggregate(loss, mask, "sequence_mean").item() == pytest.approx((2 + 4) / 2)
    # Whole-step denominators (used by micro-batches).
    assert aggregate(loss, mask, "token_mean", 10).item() == pytest.approx(1.0)
    assert aggregate(loss, mask, "sequence_mean", 4).item() == pytest.approx(1.5)
    with pytest.raises(ValueError, match="loss reduction"):
        aggregate(loss, mask, "seq-mean-token-sum")
    with pytest.raises(ValueError, match="zero loss tokens"):
        aggregate(loss, torch.zeros_like(mask), "token_mean")


def test_registries_accept_new_functions() -> None:
    @register_policy_loss("test_vanilla_pg")
    def vanilla_pg(logp_new, logp_old, advantages, mask, cfg):  # type: ignore[no-untyped-def]
        return -advantages * logp_new * mask, {}

    @register_kl_estimator("test_abs")
    def kl_abs(logp, logp_ref):  # type: ignore[no-untyped-def]
        return (logp - logp_ref).abs()

    try:
        cfg = GRPOConfig(policy_loss="test_vanilla_pg", kl_estimator="test_abs")
        x = torch.tensor([[-1.0, -2.0]])
        loss, _ = get_policy_loss(cfg.policy_loss)(x, x, torch.ones(1, 2), torch.ones(1, 2), cfg)
        assert loss.tolist() == [[1.0, 2.0]]
        assert get_kl_estimator(cfg.kl_estimator)(x, -x).tolist() == [[2.0, 4.0]]
    finally:
        POLICY_LOSSES.unregister("test_vanilla_pg")
        KL_ESTIMATORS.unregister("test_abs")
    with pytest.raises(ValueError, match="registered: .*ppo_clip"):
        get_policy_loss("test_vanilla_pg")
