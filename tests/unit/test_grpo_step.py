"""grpo_loss composition and the logprob alignment convention."""

import math

import pytest
import torch

from rlfleet.grpo import GRPOConfig, TrainSample, grpo_loss, make_micro_batches


def one_batch(advantages: list[float]) -> tuple:
    samples = [
        TrainSample(
            input_ids=[5, 6, 7],
            loss_mask=[0, 1, 1],
            logprobs=[0.0, -0.5, -1.0],
            reward=0.0,
            group_id="g",
            adapter_version=0,
            advantage=a,
        )
        for a in advantages
    ]
    (mb,) = make_micro_batches(samples, 8)
    return mb, mb.old_logprobs.clone().double()


def test_on_policy_loss_is_minus_mean_advantage_and_gradient_is_policy_gradient() -> None:
    mb, old = one_batch([1.0, -0.5])
    logp = old.clone().requires_grad_()
    loss, stats = grpo_loss(logp, mb, GRPOConfig())
    assert loss.item() == pytest.approx(-(1.0 * 2 - 0.5 * 2) / 4)
    loss.backward()
    # d/dlogp of -A * exp(logp - old) at ratio 1 is -A / (number of loss tokens).
    expected = torch.tensor([[0, -0.25, -0.25], [0, 0.125, 0.125]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, expected)
    assert stats["ratio_mean"] == pytest.approx(1.0) and stats["clip_frac"] == 0.0
    assert stats["num_loss_tokens"] == 4 and "kl" not in stats
    # The entropy estimate: the mean of -logprob over the loss tokens, (0.5 + 1.0) / 2.
    assert stats["entropy"] == pytest.approx(0.75)


def test_kl_term_is_added_with_its_coefficient() -> None:
    mb, old = one_batch([1.0, -1.0])
    ref = old + math.log(0.5)  # reference gives each token half the probability
    cfg = GRPOConfig(kl_coef=0.1, kl_estimator="k1")
    loss, stats = grpo_loss(old.clone(), mb, cfg, logp_ref=ref)
    assert stats["kl"] == pytest.approx(math.log(2))
    assert loss.item() == pytest.approx(0.0 + 0.1 * math.log(2))
    with pytest.raises(ValueError, match="logp_ref"):
        grpo_loss(old, mb, cfg)
    with pytest.raises(ValueError, match="logp_ref"):
        grpo_loss(old, mb, cfg, logp_ref=ref[:, :2])
    # kl_coef = 0 needs no reference at all.
    grpo_loss(old, mb, GRPOConfig())


def test_shape_mismatch_raises() -> None:
    mb, old = one_batch([1.0])
    with pytest.raises(ValueError, match="logp_new"):
        grpo_loss(old[:, :2], mb, GRPOConfig())
