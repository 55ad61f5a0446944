"""Settings of a rollout replica."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from rlfleet import defaults, limits
from rlfleet.config import ProfileName
from rlfleet.names import ENGINE_NAMES
from rlfleet.service import ServiceSettings


class RolloutSettings(ServiceSettings):
    port: int = Field(defaults.ROLLOUT_PORT, ge=0, le=65535)
    metrics_port: int | None = Field(defaults.ROLLOUT_METRICS_PORT, ge=0, le=65535)
    engine: Literal[ENGINE_NAMES] = Field(  # type: ignore[valid-type]  # the proto enum
        "hf", description="inference engine")
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description='extra keyword arguments for the engine (JSON), '
        'e.g. for vllm {"max_lora_rank": 64, "gpu_memory_utilization": 0.85, "dtype": '
        '"bfloat16"}')
    profile: ProfileName = Field("tiny", description="policy profile (model family and "
                                 "serving limits; rlfleet.policy.profiles)")
    model: Path | None = Field(None, description="model directory; none: the tiny model, "
                               "built into model_cache")
    model_cache: Path = Field(defaults.cache_dir(), description="where the tiny model is "
                              "built")
    device: str = Field("cpu", description="torch device of the hf engine (cpu, cuda, "
                        "cuda:1)")
    torch_threads: int | None = Field(None, ge=1, description="torch intra-op threads; "
                                      "none: torch's own")
    env_address: str = Field(defaults.local_address(defaults.ENV_PORT),
                             description="the env service's HOST:PORT")
    reward_address: str = Field("", description="the reward service's HOST:PORT; '': the "
                                "env address (one env/reward process)")
    redis_url: str = Field("", description="the fleet store; '': none (no heartbeats, no "
                           "hot-load events)")
    sync_address: str = Field("", description="ckpt-sync, for acknowledgements; '': none")
    runs_root: Path = Field(defaults.RUNS_ROOT, description="where runs are kept (/shared)")
    run: str = Field("default", description="the run whose adapters this replica serves")
    replica_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}",
                            description="this replica's name in the fleet store (default: "
                            "HOSTNAME-PID)")
    advertise_address: str = Field("", description="how the learner reaches this replica; "
                                   "'': host:port")
    heartbeat_s: float = Field(2.0, gt=0, description="fleet store heartbeat period")
    heartbeat_ttl_s: float = Field(10.0, gt=0, description="fleet store entry lifetime "
                                   "without a heartbeat")
    max_batch: int = Field(64, ge=1, le=1024, description="sequences per engine batch")
    # Capacity, advertised in the heartbeat and GetStatus: a group is admitted while the
    # replica plays fewer than max_groups groups and active episodes + group_size stay
    # <= max_episodes; anything more answers RESOURCE_EXHAUSTED. An idle replica admits any
    # one group, even one larger than max_episodes, so big groups are never starved.
    max_groups: int = Field(16, ge=1, description="groups played at once")
    max_episodes: int = Field(64, ge=1, le=65536, description="episodes played at once, all "
                              "groups")
    adapter_wait_s: float = Field(30.0, ge=0, description="how long a group waits for its "
                                  "min_adapter_version")
    max_staleness: int = Field(
        1, ge=0, le=64, description="the learner's staleness bound: versions older than "
        "live - max_staleness are unloaded even while groups use them (they end "
        "FAILED_PRECONDITION); vLLM holds max_staleness + 1 adapters at once")
    cell_px: int = Field(0, ge=0, le=64, description="maze render size asked of the env "
                         "(0: the profile's)")
    idempotency_cache: int = Field(256, ge=1, description="answered groups remembered, so "
                                   "a retried Play is answered once")
    env_timeout_s: float = Field(30.0, gt=0, description="deadline of a call to the env "
                                 "service")
    # every image entering the replica is checked from its header before it is decoded;
    # one over a bound fails its group with INVALID_ARGUMENT (rlfleet.limits)
    max_image_bytes: int = Field(limits.MAX_IMAGE_BYTES, ge=1, description="bytes of one "
                                 "encoded image (an env's observation)")
    max_image_pixels: int = Field(limits.MAX_IMAGE_PIXELS, ge=1, description="pixels "
                                  "(width x height) of one image")
    max_prompt_image_bytes: int = Field(limits.MAX_PROMPT_IMAGE_BYTES, ge=1,
                                        description="bytes of every image of one prompt")
    max_prompt_image_pixels: int = Field(limits.MAX_PROMPT_IMAGE_PIXELS, ge=1,
                                         description="pixels of every image of one prompt")

    def image_bounds(self) -> limits.ImageBounds:
        return limits.ImageBounds(self.max_image_bytes, self.max_image_pixels,
                                  self.max_prompt_image_bytes, self.max_prompt_image_pixels)

    def render_cell_px(self) -> int:
        """The tiny policy sees one image token per maze cell at 16 px; the 8B the env's
        default (VisGym's 25 px)."""
        if self.cell_px:
            return self.cell_px
        return 16 if self.profile == "tiny" else 0
