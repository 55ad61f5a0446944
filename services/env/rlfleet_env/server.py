"""The env/reward service process: the maze env and one reward function, one server."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlfleet.rpc.server import GrpcServer, ServerConfig
from rlfleet.service import ServiceSettings
from rlfleet.v1 import env_pb2, env_pb2_grpc, reward_pb2, reward_pb2_grpc
from rlfleet_env.episodes import EpisodeTable
from rlfleet_env.rewards import REWARDS, get_reward
from rlfleet_env.servicers import EnvServicer, RewardServicer

ENV_SERVICE = env_pb2.DESCRIPTOR.services_by_name["EnvService"].full_name
REWARD_SERVICE = reward_pb2.DESCRIPTOR.services_by_name["RewardService"].full_name


class EnvSettings(ServiceSettings):
    port: int = Field(50051, ge=0, le=65535)
    metrics_port: int | None = Field(9101, ge=0, le=65535)
    reward: str = "task"
    max_episodes: int = Field(100_000, ge=1)
    episode_ttl_s: float = Field(600.0, gt=0)
    role: Literal["env+reward", "env", "reward"] = "env+reward"

    def model_post_init(self, _context: object) -> None:
        get_reward(self.reward)  # a clear error for an unknown reward, at start-up


def build_registrations(settings: EnvSettings, table: EpisodeTable) -> list:
    regs = []
    if settings.role in ("env+reward", "env"):
        env = EnvServicer(table)
        regs.append(lambda s: env_pb2_grpc.add_EnvServiceServicer_to_server(env, s) or ENV_SERVICE)
    if settings.role in ("env+reward", "reward"):
        reward = RewardServicer(get_reward(settings.reward))
        regs.append(
            lambda s: reward_pb2_grpc.add_RewardServiceServicer_to_server(reward, s)
            or REWARD_SERVICE
        )
    return regs


def make_server(settings: EnvSettings) -> tuple[GrpcServer, EpisodeTable]:
    """A ready-to-start server (used by the CLI and by in-process tests)."""
    table = EpisodeTable(settings.max_episodes, settings.episode_ttl_s)
    config: ServerConfig = settings.server_config()
    return GrpcServer("env", config, build_registrations(settings, table)), table


__all__ = ["REWARDS", "EnvSettings", "make_server"]
