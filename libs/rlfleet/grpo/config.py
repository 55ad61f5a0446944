"""Typed, validated hyper-parameters of the GRPO objective (prime-rl style frozen config)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from rlfleet.config import ClosedModel

LossReduction = Literal["token_mean", "sequence_mean"]
LOSS_REDUCTIONS: tuple[str, ...] = ("token_mean", "sequence_mean")
_REALS = ("clip_low", "clip_high", "dual_clip", "kl_coef", "eps", "temperature")


class GRPOConfig(ClosedModel):
    """GRPO settings. Defaults follow SkyRL's GRPO defaults except ``kl_coef`` (SkyRL: 0.001).

    A frozen pydantic model: the learner config's ``grpo`` section, so a file, the
    environment (``RLFLEET_GRPO__KL_COEF``) and flags all reach it the same way. Each
    field's description says what it does (``--help``, the chart's schema, the docs).
    """

    model_config = ConfigDict(frozen=True)  # and ClosedModel's: unknown keys refused

    advantage_estimator: str = Field(
        "grpo", description="a name in the registry of rlfleet.grpo.advantages")
    policy_loss: str = Field("ppo_clip", description="a name in the policy-loss registry of "
                             "rlfleet.grpo.losses")
    clip_low: float = Field(0.2, description="the ratio is clipped to [1 - clip_low, "
                            "1 + clip_high]")
    clip_high: float = Field(0.2, description="see clip_low")
    dual_clip: float | None = Field(
        3.0, description="for negative advantages the per-token loss is capped at "
        "dual_clip * |A| (Ye et al. 2020); none disables it. Must be > 1")
    kl_coef: float = Field(0.0, description="weight of the KL(policy || reference) term; 0 "
                           "disables it (and the reference logprobs are not computed)")
    kl_estimator: str = Field("k3", description="a name in the KL-estimator registry of "
                              "rlfleet.grpo.losses")
    loss_reduction: LossReduction = Field(
        "token_mean", description="token_mean: mean over all loss tokens of the step; "
        "sequence_mean: mean over tokens within each trajectory, then over trajectories "
        "(SkyRL's seq-mean-token-mean)")
    std_normalize: bool = Field(True, description="divide group-centred rewards by the "
                                "group std; false is Dr. GRPO")
    eps: float = Field(1e-6, description="added to the group std before dividing")
    max_staleness: int = Field(1, description="trajectories sampled with adapter version < "
                               "current - max_staleness are dropped")
    micro_batch_size: int = Field(8, description="trajectories per forward/backward "
                                  "(gradient accumulation)")
    temperature: float = Field(
        1.0, description="the sampling temperature; logits are divided by it before the "
        "learner's logprobs, so that the importance ratio compares like with like")
    credit: Literal["episode", "turn", "state"] = Field(
        "episode", description="episode: every turn of a trajectory trains on its one "
        "advantage; turn: each turn trains on its return-to-go against the group's at the "
        "same turn (per-turn credit, rlfleet.grpo.advantages.turn_advantages), from the "
        "reward's split over the turns (a reward without one, e.g. task, is refused at the "
        "first step); state: each turn's return-to-go against that of the group's turns "
        "played from the same prompt (rlfleet.grpo.advantages.state_advantages; the "
        "episode's reward for every turn where the reward gives no split; a split of the "
        "wrong length is refused), a prompt seen once trains on nothing; turn and state "
        "are for the per-turn contexts")

    @field_validator(*_REALS, mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: object, info: Any) -> object:
        # bool is an int subclass; True as a clip bound is a config mistake, not 1.0
        if isinstance(value, bool):
            raise ValueError(f"GRPOConfig.{info.field_name} must be a finite number, "
                             f"got {value!r}")
        return value

    @field_validator("std_normalize", mode="before")
    @classmethod
    def _a_real_bool(cls, value: object) -> object:
        # 1 is not a switch; "true"/"false" from the environment are
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise ValueError(f"GRPOConfig.std_normalize must be a bool, got {value!r}")
        return value

    @model_validator(mode="after")
    def _check(self) -> GRPOConfig:
        # Names are checked at construction: a typo fails before any rollout is spent.
        check_registered_names(self.model_dump())
        _check_real("clip_low", self.clip_low, low=0.0, high=1.0, high_open=True)
        _check_real("clip_high", self.clip_high, low=0.0)
        if self.dual_clip is not None:
            _check_real("dual_clip", self.dual_clip, low=1.0, low_open=True)
        _check_real("kl_coef", self.kl_coef, low=0.0)
        _check_real("eps", self.eps, low=0.0, low_open=True)
        _check_real("temperature", self.temperature, low=0.0, low_open=True)
        _check_int("max_staleness", self.max_staleness, low=0)
        _check_int("micro_batch_size", self.micro_batch_size, low=1)
        return self


def check_registered_names(values: Mapping[str, Any], where: str = "") -> None:
    """RegistryError unless the advantage estimator, policy loss and KL estimator that
    `values` (GRPOConfig fields; a missing one is its default) name are registered in this
    process. `where` names the process in the error: every process checks at start-up,
    the learner's Ray workers included, since a variant registered in code in the driver
    alone is unknown in a worker."""
    # Imported here: the registries' modules import this one.
    from rlfleet.grpo.advantages import ADVANTAGE_ESTIMATORS
    from rlfleet.grpo.losses import KL_ESTIMATORS, POLICY_LOSSES
    from rlfleet.registries import RegistryError

    defaults = {name: f.default for name, f in GRPOConfig.model_fields.items()}
    for field, registry in (
        ("advantage_estimator", ADVANTAGE_ESTIMATORS),
        ("policy_loss", POLICY_LOSSES),
        ("kl_estimator", KL_ESTIMATORS),
    ):
        name = values.get(field, defaults[field])
        if name not in registry:
            raise RegistryError(
                f"GRPOConfig.{field}={name!r} is not registered: "
                f"{registry.unknown_message(name, where)} (a plugin reaches every process "
                f"as an entry point of group {registry.group!r})")


def _check_real(
    name: str,
    value: object,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"GRPOConfig.{name} must be a finite number, got {value!r}")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"GRPOConfig.{name}={value!r} must be {'>' if low_open else '>='} {low}")
    if high is not None and (value >= high if high_open else value > high):
        raise ValueError(f"GRPOConfig.{name}={value!r} must be {'<' if high_open else '<='} {high}")


def _check_int(name: str, value: object, *, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"GRPOConfig.{name} must be an int, got {value!r}")
    if value < low:
        raise ValueError(f"GRPOConfig.{name}={value!r} must be >= {low}")
