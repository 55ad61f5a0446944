"""The env/reward service's settings: one file plus environment (rlfleet.config), and
the flags of `rlfleet env serve` made from these fields."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from rlfleet import defaults
from rlfleet.registries import RegistryError
from rlfleet.reward import RewardFunction, default_rewards
from rlfleet.service import ServiceSettings
from rlfleet.tasks import TaskRegistry, default_tasks

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
