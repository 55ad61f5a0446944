"""The env/reward service process: the env (every task of its registry), a reward
function, or both, on one server.

Roles: ``env+reward`` (the default: one process answers both contracts), ``env`` (episodes
only) and ``reward`` (scoring only). A fleet that runs them apart gives each replica an
env address and a reward address (`rlfleet rollout serve --env-address A --reward-address
B`; the same address by default), so either can be changed without the other.
"""

from __future__ import annotations

from rlfleet.reward.service import REWARD_SERVICE, RewardServicer, registration
from rlfleet.rpc.server import GrpcServer, ServerConfig
from rlfleet.v1 import env_pb2, env_pb2_grpc
from rlfleet_env.episodes import EpisodeTable
from rlfleet_env.servicer import EnvServicer
from rlfleet_env.settings import EnvSettings

ENV_SERVICE = env_pb2.DESCRIPTOR.services_by_name["EnvService"].full_name


def build_registrations(settings: EnvSettings, table: EpisodeTable) -> list:
    regs = []
    tasks = settings.task_registry()
    if settings.role in ("env+reward", "env"):
        env = EnvServicer(table, tasks)
        regs.append(lambda s: env_pb2_grpc.add_EnvServiceServicer_to_server(env, s) or ENV_SERVICE)
    if settings.role in ("env+reward", "reward"):
        regs.append(registration(RewardServicer(settings.reward_function(), tasks)))
    return regs


def make_server(settings: EnvSettings) -> tuple[GrpcServer, EpisodeTable]:
    """A ready-to-start server (used by the CLI and by in-process tests)."""
    table = EpisodeTable(settings.max_episodes, settings.episode_ttl_s)
    config: ServerConfig = settings.server_config()
    return GrpcServer("env", config, build_registrations(settings, table)), table


def banner(settings: EnvSettings) -> str:
    if settings.role == "env":
        return "env service"
    reward = settings.reward_function()
    what = "reward service" if settings.role == "reward" else "env/reward service"
    return f"{what} ({reward.name} {reward.version})"


__all__ = ["ENV_SERVICE", "REWARD_SERVICE", "banner", "make_server"]
