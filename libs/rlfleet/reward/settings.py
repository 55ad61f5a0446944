"""A stand-alone reward service's settings: one file plus environment (rlfleet.config),
and the flags of the process `rlfleet.reward.main` makes from these fields."""

from __future__ import annotations

from pydantic import Field

from rlfleet import defaults
from rlfleet.service import ServiceSettings


class RewardSettings(ServiceSettings):
    """Settings of a stand-alone reward service (`rlfleet.reward.serve` / `main`)."""

    port: int = Field(defaults.REWARD_PORT, ge=0, le=65535)
    metrics_port: int | None = Field(defaults.REWARD_METRICS_PORT, ge=0, le=65535)
    max_connection_age_s: float | None = Field(
        30.0, gt=0, description="short calls: replicas follow a swap behind a Kubernetes "
        "Service within this long")
