"""ckpt-sync's settings: one file plus environment (rlfleet.config), and the flags of
`rlfleet ckptsync serve` made from these fields."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from rlfleet import defaults
from rlfleet.service import ServiceSettings


class SyncSettings(ServiceSettings):
    port: int = Field(defaults.CKPTSYNC_PORT, ge=0, le=65535)
    metrics_port: int | None = Field(defaults.CKPTSYNC_METRICS_PORT, ge=0, le=65535)
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="the fleet store")
    runs_root: Path = Field(defaults.RUNS_ROOT, description="runs directory (adapter versions "
                            "on /shared)")
    keep_last: int = Field(3, ge=1, description="adapter versions kept per run, the newest")
    gc_delay_s: float = Field(
        10.0, ge=0, description="old versions are collected once every replica serves the "
        "new one, or this long after the publish at the latest")
    reconcile_s: float = Field(2.0, gt=0, description="how often Redis is reconciled with "
                               "/shared")
