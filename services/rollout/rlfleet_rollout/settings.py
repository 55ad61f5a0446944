"""Settings of a rollout replica."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from rlfleet import defaults
from rlfleet.config import ProfileName
from rlfleet.names import ENGINE_NAMES
from rlfleet.service import ServiceSettings


class RolloutSettings(ServiceSettings):
    port: int = Field(defaults.ROLLOUT_PORT, ge=0, le=65535)
    metrics_port: int | None = Field(defaults.ROLLOUT_METRICS_PORT, ge=0, le=65535)
    engine: Literal[ENGINE_NAMES] = "hf"  # type: ignore[valid-type]  # the proto enum Engine
    # extra keyword arguments for the engine, e.g. for vllm {"max_lora_rank": 64,
    # "gpu_memory_utilization": 0.85, "dtype": "bfloat16"}
    engine_args: dict[str, Any] = Field(default_factory=dict)
    profile: ProfileName = "tiny"
    model: Path | None = None  # model directory; tiny: built into model_cache if unset
    model_cache: Path = defaults.cache_dir()
    device: str = "cpu"
    torch_threads: int | None = Field(None, ge=1)
    env_address: str = defaults.local_address(defaults.ENV_PORT)
    reward_address: str = ""  # "" = the env address (one env/reward process)
    redis_url: str = ""  # "" = no fleet store: no heartbeats, no hot-load events
    sync_address: str = ""  # ckpt-sync, for acknowledgements; "" = none
    runs_root: Path = defaults.RUNS_ROOT
    run: str = "default"
    replica_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    advertise_address: str = ""  # how the learner reaches us; "" = host:port
    heartbeat_s: float = Field(2.0, gt=0)
    heartbeat_ttl_s: float = Field(10.0, gt=0)
    max_batch: int = Field(64, ge=1, le=1024)
    # Capacity, advertised in the heartbeat and GetStatus: a group is admitted while the
    # replica plays fewer than max_groups groups and active episodes + group_size stay
    # <= max_episodes; anything more answers RESOURCE_EXHAUSTED. An idle replica admits any
    # one group, even one larger than max_episodes, so big groups are never starved.
    max_groups: int = Field(16, ge=1)  # concurrent groups
    max_episodes: int = Field(64, ge=1, le=65536)  # concurrent episodes (all groups)
    adapter_wait_s: float = Field(30.0, ge=0)  # how long a group waits for min_adapter_version
    # the learner's staleness bound: versions older than live - max_staleness are unloaded
    # even while groups use them (they end FAILED_PRECONDITION); vLLM holds
    # max_staleness + 1 adapters at once
    max_staleness: int = Field(1, ge=0, le=64)
    cell_px: int = Field(0, ge=0, le=64)  # render size asked of the env; 0 = per profile
    idempotency_cache: int = Field(256, ge=1)
    env_timeout_s: float = Field(30.0, gt=0)

    def render_cell_px(self) -> int:
        """The tiny policy sees one image token per maze cell at 16 px; the 8B the env's
        default (VisGym's 25 px)."""
        if self.cell_px:
            return self.cell_px
        return 16 if self.profile == "tiny" else 0
