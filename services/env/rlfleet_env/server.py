"""The env/reward service process: the env (every task of its registry), a reward
function, or both, on one server.

Roles: ``env+reward`` (the default: one process answers both contracts), ``env`` (episodes
only) and ``reward`` (scoring only). A fleet that runs them apart gives each replica an
env address and a reward address (`rlfleet rollout serve --env-address A --reward-address
B`; the same address by default), so either can be changed without the other.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from rlfleet import defaults
from rlfleet.registries import RegistryError
from rlfleet.reward import RewardFunction, default_rewards
from rlfleet.reward.service import REWARD_SERVICE, RewardServicer, registration
from rlfleet.rpc.server import GrpcServer, ServerConfig
from rlfleet.service import ServiceSettings
from rlfleet.tasks import TaskRegistry, default_tasks
from rlfleet.v1 import env_pb2, env_pb2_grpc
from rlfleet_env.episodes import EpisodeTable
from rlfleet_env.servicers import EnvServicer

ENV_SERVICE = env_pb2.DESCRIPTOR.services_by_name["EnvService"].full_name
ROLES = ("env+reward", "env", "reward")


def _split(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class EnvSettings(ServiceSettings):
    port: int = Field(defaults.ENV_PORT, ge=0, le=65535)
    metrics_port: int | None = Field(defaults.ENV_METRICS_PORT, ge=0, le=65535)
    max_connection_age_s: float | None = Field(
        30.0, gt=0, description="env and reward calls are short: a replica's connection "
        "moves to whatever the Service selects (a reward swap by `helm upgrade`) within "
        "this long")
    reward: str = Field("task", description="reward function: task, format+task, or the "
                        "name of an `rlfleet.rewards` entry point")
    max_episodes: int = Field(100_000, ge=1, description="episodes open at once")
    episode_ttl_s: float = Field(600.0, gt=0, description="an idle episode is closed after "
                                 "this long")
    role: Literal["env+reward", "env", "reward"] = Field(
        "env+reward", description="which contracts to serve (env+reward: both on one port; "
        "run env and reward apart to change one without the other, and point replicas at "
        "both with --env-address and --reward-address)")
    # comma-separated in RLFLEET_TASKS / RLFLEET_SKYRL_ENV (NoDecode: not JSON)
    tasks: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="task names to serve, comma-separated; empty: "
        "every registered task")
    skyrl_env: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="registered skyrl-gym environments to serve as "
        "tasks skyrl:ENV_ID (rlfleet.tasks.skyrl): ENV_ID or ENV_ID=DATA, DATA a JSON-lines "
        "file of SkyRL dataset rows (prompt, reward_spec, extra_info), row = seed mod rows "
        "(a repeatable flag)")

    @field_validator("tasks", "skyrl_env", mode="before")
    @classmethod
    def _comma_lists(cls, value: object) -> object:
        return _split(value)

    @model_validator(mode="after")
    def _resolvable(self) -> EnvSettings:
        # clear errors at start-up: an unknown reward, task or SkyRL env, a duplicate name,
        # a plugin that does not load
        if self.role != "env":
            self.reward_function()
        self.task_registry().load_all()
        return self

    def reward_function(self) -> RewardFunction:
        try:
            return default_rewards().get(self.reward)
        except RegistryError as exc:
            raise ValueError(str(exc)) from None

    def task_registry(self) -> TaskRegistry:
        try:
            registry = default_tasks()
            for spec in self.skyrl_env:
                from rlfleet.tasks.skyrl import skyrl_task

                registry.add(skyrl_task(spec), description=f"--skyrl-env {spec}")
            if self.tasks:
                unknown = [t for t in self.tasks if t not in registry]
                if unknown:
                    raise RegistryError(f"unknown task(s) {unknown}; known: {registry.names()}")
                registry = registry.only(self.tasks)
            return registry
        except RegistryError as exc:
            raise ValueError(str(exc)) from None


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


__all__ = ["ENV_SERVICE", "REWARD_SERVICE", "ROLES", "EnvSettings", "banner", "make_server"]
