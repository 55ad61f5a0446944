"""GRPOConfig: SkyRL-like defaults and clear errors on bad values."""

import pytest
from pydantic import ValidationError

from rlfleet.grpo import GRPOConfig


def test_defaults_follow_skyrl_grpo() -> None:
    cfg = GRPOConfig()
    assert (cfg.clip_low, cfg.clip_high, cfg.dual_clip) == (0.2, 0.2, 3.0)
    assert cfg.eps == 1e-6 and cfg.kl_estimator == "k3" and cfg.loss_reduction == "token_mean"
    assert cfg.kl_coef == 0.0 and cfg.std_normalize is True and cfg.max_staleness == 1


def test_is_frozen() -> None:
    with pytest.raises(ValidationError, match="frozen"):
        GRPOConfig().clip_low = 0.3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("advantage_estimator", "nope", "not registered"),
        ("policy_loss", "nope", "not registered"),
        ("kl_estimator", "k9", "not registered"),
        ("clip_low", -0.1, "clip_low"),
        ("clip_low", 1.0, "clip_low"),
        ("clip_high", -0.1, "clip_high"),
        ("clip_high", float("nan"), "finite"),
        ("dual_clip", 1.0, "dual_clip"),
        ("dual_clip", True, "finite number"),
        ("kl_coef", -0.001, "kl_coef"),
        ("eps", 0.0, "eps"),
        ("temperature", 0.0, "temperature"),
        ("loss_reduction", "seq_mean_token_sum", "loss_reduction"),
        ("std_normalize", 1, "bool"),
        ("max_staleness", -1, "max_staleness"),
        ("max_staleness", 1.5, "int"),
        ("micro_batch_size", 0, "micro_batch_size"),
    ],
)
def test_bad_values_raise(field: str, value: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GRPOConfig(**{field: value})


def test_dual_clip_none_disables_and_is_valid() -> None:
    assert GRPOConfig(dual_clip=None).dual_clip is None


def test_a_mapping_round_trips_and_unknown_keys_are_refused() -> None:
    cfg = GRPOConfig(kl_coef=0.001, loss_reduction="sequence_mean")
    assert GRPOConfig.model_validate(cfg.model_dump()) == cfg
    with pytest.raises(ValidationError, match="(?s)clip_ratio.*Extra inputs are not permitted"):
        GRPOConfig.model_validate({"clip_ratio": 0.2})


def test_strings_from_the_environment_are_parsed() -> None:
    cfg = GRPOConfig.model_validate({"kl_coef": "0.01", "std_normalize": "false",
                                     "micro_batch_size": "4", "dual_clip": None})
    assert (cfg.kl_coef, cfg.std_normalize, cfg.micro_batch_size) == (0.01, False, 4)
