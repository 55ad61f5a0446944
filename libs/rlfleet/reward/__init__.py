"""Writing a reward service: implement ``score(episode) -> Score`` and `serve` it.

A reward service scores finished episodes. Rollout replicas call it once per finished
group (``RewardService.Score``, see ``protos/rlfleet/v1/reward.proto``); the learner knows
it only by the name and version it reports, which every trajectory and every step record
carries. A service never trusts what the client says happened: it replays the episode's
actions from its task spec with the same task code the env service runs
(`rlfleet.tasks`), and scores the replay.

    from rlfleet.maze.oracle import distance_to_target
    from rlfleet.reward import RewardFunction, Score, serve

    class PathEfficiency(RewardFunction):
        name = "path-efficiency"
        version = "1.0.0"
        components = ("task", "efficiency")
        tasks = ("maze_2d", "maze_2d_hard")      # None: every task the service has

        def score(self, episode):
            maze = episode.maze                    # the replayed MazeEpisode
            shortest = distance_to_target(maze.layout) + 1   # moves + the stop
            efficiency = shortest / episode.turns if episode.turns else 0.0
            return Score(float(episode.solved) * efficiency,
                         {"task": float(episode.solved), "efficiency": efficiency},
                         solved=episode.solved)

    if __name__ == "__main__":
        serve(PathEfficiency(), port=50061)

`serve` starts the standard rlfleet gRPC server (`rlfleet.rpc`): health checking,
reflection, Prometheus metrics, the fleet's shared token (``RLFLEET_AUTH_TOKEN``), optional
TLS, message size limits, and a drain on SIGTERM. `main` does the same with rlfleet's
standard flags (``--port``, ``--metrics-port``, ``--config``, ...) parsed from the command
line. ``examples/path-efficiency-reward/`` is a complete service in its own package.

Reward functions are also plugins: a package that declares one in the
``rlfleet.rewards`` entry-point group can be served by ``rlfleet env serve --role reward
--reward <name>`` without a server of its own.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlfleet import defaults
from rlfleet.registries import BUILT_IN, REWARDS_GROUP, Registry, RegistryError
from rlfleet.tasks import StepResult, TaskEpisode

__all__ = [
    "REWARDS_GROUP",
    "Episode",
    "RegistryError",
    "RewardFunction",
    "RewardRegistry",
    "Score",
    "default_rewards",
    "main",
    "reward_function",
    "serve",
]


@dataclass(frozen=True)
class Score:
    """A finished episode's score: the reward the learner trains on, its named components
    (for metrics; e.g. {"task": 1.0, "format": 0.75}), and whether it is a true solve (the
    goal reached and the episode ended by the policy, never given for format alone)."""

    reward: float
    components: Mapping[str, float] = field(default_factory=dict)
    solved: bool = False
    # The reward split over the turns, one per action in order, summing to `reward`
    # (per-turn credit: the learner can train each turn on what followed it); empty: the
    # reward credits the episode as a whole
    turn_rewards: Sequence[float] = ()

    def checked(self, where: str, reward_range: tuple[float, float] = (-math.inf, math.inf),
                turns: int | None = None) -> Score:
        """This score if every number is finite, the reward lies in `reward_range`
        (inclusive) and the turn rewards (if any) are one per turn (`turns`, when given)
        and sum to the reward; ValueError naming `where` and the value otherwise."""
        numbers = {"reward": self.reward, **{f"components[{k!r}]": v
                                              for k, v in self.components.items()},
                   **{f"turn_rewards[{i}]": v for i, v in enumerate(self.turn_rewards)}}
        for what, value in numbers.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                raise ValueError(f"{where}: {what} must be a finite number, got {value!r}")
        low, high = reward_range
        if not low <= self.reward <= high:
            raise ValueError(f"{where}: reward {self.reward!r} is outside the declared range "
                             f"[{low:g}, {high:g}]")
        if not all(isinstance(k, str) and k for k in self.components):
            raise ValueError(f"{where}: component names must be non-empty strings")
        if self.turn_rewards:
            if turns is not None and len(self.turn_rewards) != turns:
                raise ValueError(f"{where}: {len(self.turn_rewards)} turn rewards for "
                                 f"{turns} turns; give one per turn, or none")
            total = math.fsum(self.turn_rewards)
            if not math.isclose(total, self.reward, rel_tol=1e-9, abs_tol=1e-9):
                raise ValueError(f"{where}: turn rewards sum to {total!r}, not the reward "
                                 f"{self.reward!r}")
        return self


@dataclass(frozen=True)
class Episode:
    """A finished episode as a reward function sees it: the spec it played, the action
    texts in order, the state the client reported (informational only: never trust it),
    and the episode `replayed` from the spec by the task, with each step's result."""

    spec: Any                      # rlfleet.v1.common_pb2.TaskSpec
    actions: tuple[str, ...]
    final_state: Any               # rlfleet.v1.common_pb2.EpisodeState, as reported
    replayed: TaskEpisode
    steps: tuple[StepResult, ...] = ()

    @property
    def task(self) -> str:
        return self.spec.task or "maze_2d"

    @property
    def solved(self) -> bool:
        return self.replayed.solved

    @property
    def turns(self) -> int:
        return self.replayed.turns

    @property
    def done(self) -> bool:
        return self.replayed.done

    @property
    def truncated(self) -> bool:
        return self.replayed.truncated

    @property
    def env_return(self) -> float:
        """The sum of the env's own step rewards (the maze: 1.0 for the solving stop)."""
        return self.replayed.env_return

    @property
    def format_ok_turns(self) -> int:
        return self.replayed.format_ok_turns

    @property
    def invalid_turns(self) -> int:
        return self.replayed.invalid_turns

    @property
    def maze(self) -> Any:
        """The replayed `rlfleet.maze.MazeEpisode` (layout, agent, counters) for a maze
        task; None for another task."""
        from rlfleet.tasks.maze import maze_of

        return maze_of(self.replayed)


class RewardFunction(ABC):
    """A reward function: a name and version (reported to the fleet), the components it
    reports, the tasks it can score (None: any task the service has), the range its reward
    lies in, and `score`.

    `score` must be a pure function of the episode: the same episode gets the same score on
    every call and every process (a retried group is scored again). The service checks
    every score against `reward_range` (inclusive): a reward outside it, NaN, inf or
    anything but a `Score` is refused with FAILED_PRECONDITION naming the reward, the value
    and the episode, never passed on to the learner."""

    name: str = ""
    version: str = ""
    components: tuple[str, ...] = ()
    tasks: tuple[str, ...] | None = None
    reward_range: tuple[float, float] = (0.0, 1.0)

    @abstractmethod
    def score(self, episode: Episode) -> Score: ...

    def supports(self, task: str) -> bool:
        return self.tasks is None or task in self.tasks

    def __repr__(self) -> str:
        return f"<reward {self.name} {self.version}>"


class _FunctionReward(RewardFunction):
    def __init__(self, fn: Callable[[Episode], Score], name: str, version: str,
                 components: Sequence[str], tasks: Sequence[str] | None,
                 reward_range: tuple[float, float] = (0.0, 1.0)) -> None:
        self._fn = fn
        self.name, self.version = name, version
        self.components = tuple(components)
        self.tasks = None if tasks is None else tuple(tasks)
        self.reward_range = (float(reward_range[0]), float(reward_range[1]))
        self.__doc__ = fn.__doc__

    def score(self, episode: Episode) -> Score:
        return self._fn(episode)


def reward_function(name: str, version: str, components: Sequence[str] = (),
                    tasks: Sequence[str] | None = None,
                    reward_range: tuple[float, float] = (0.0, 1.0)
                    ) -> Callable[[Callable[[Episode], Score]], RewardFunction]:
    """A `RewardFunction` from a plain ``score(episode) -> Score`` function."""

    def wrap(fn: Callable[[Episode], Score]) -> RewardFunction:
        return _FunctionReward(fn, name, version, components, tasks, reward_range)

    return wrap


def check_reward(obj: object) -> RewardFunction:
    if not isinstance(obj, RewardFunction):
        raise RegistryError(f"{obj!r} is not an rlfleet.reward.RewardFunction")
    if not obj.name or not obj.version:
        raise RegistryError(f"reward {obj!r} must have a non-empty name and version")
    low, high = obj.reward_range
    if math.isnan(low) or math.isnan(high) or not low <= high:
        raise RegistryError(f"reward {obj!r}: reward_range must be (low, high) with low <= high,"
                          f" got {obj.reward_range!r}")
    return obj


class RewardRegistry:
    """Reward functions by name: rlfleet's built-ins and the ``rlfleet.rewards`` entry
    points. Duplicate names are refused; only the function that is used is imported."""

    def __init__(self) -> None:
        self._registry: Registry[RewardFunction] = Registry(
            "reward", REWARDS_GROUP, is_kind=lambda o: isinstance(o, RewardFunction),
            name_of=lambda r: r.name)

    def add(self, reward: RewardFunction, description: str = BUILT_IN
            ) -> RewardRegistry:
        self._registry.add(check_reward(reward).name, reward, description)
        return self

    def discover(self, eps: Any = None) -> RewardRegistry:
        self._registry.discover(eps)
        return self

    def names(self) -> list[str]:
        return self._registry.names()

    def __contains__(self, name: object) -> bool:
        return name in self._registry

    def source(self, name: str) -> str:
        return self._registry.source(name)

    def get(self, name: str) -> RewardFunction:
        return check_reward(self._registry.get(name))


def default_rewards(*, discover: bool = True) -> RewardRegistry:
    """rlfleet's `task`, `format+task` and `progress`, plus (with `discover`) every
    ``rlfleet.rewards`` entry point."""
    from rlfleet.reward.builtin import BUILTIN_REWARDS

    registry = RewardRegistry()
    for reward in BUILTIN_REWARDS:
        registry.add(reward)
    if discover:
        registry.discover()
    return registry


def serve(reward: RewardFunction, *, port: int = defaults.REWARD_PORT, host: str = "127.0.0.1",
          metrics_port: int | None = None, tasks: Any = None, block: bool = True,
          **settings: Any) -> Any:
    """Serves `reward` as an rlfleet reward service (see the module docstring).

    `tasks` is the `rlfleet.tasks.TaskRegistry` episodes are replayed with (default: the
    maze plus every installed ``rlfleet.tasks`` plugin). Other keyword arguments are
    `rlfleet.service.ServiceSettings` fields (``grace_s``, ``tls_cert``, ...). With
    `block` (the default) it runs until SIGTERM/SIGINT and returns the exit code;
    otherwise it returns the started `rlfleet.rpc.GrpcServer` (tests, embedding)."""
    from rlfleet.reward.service import build_server, run
    from rlfleet.reward.settings import RewardSettings

    config = RewardSettings(port=port, host=host, metrics_port=metrics_port, **settings)
    server = build_server(check_reward(reward), config, tasks=tasks)
    if not block:
        return server.start()
    from rlfleet.logs import setup_logging

    setup_logging(f"reward-{reward.name}", config.log_level)
    return run(server, reward, config)


def main(reward: RewardFunction, argv: Sequence[str] | None = None, *,
         prog: str | None = None, port: int = defaults.REWARD_PORT,
         metrics_port: int = defaults.REWARD_METRICS_PORT) -> int:
    """`serve` with rlfleet's standard service flags (``--port``, ``--metrics-port``,
    ``--host``, ``--config FILE``, ``--log-level``, ``--grace-s``) and ``RLFLEET_<KEY>``
    environment overrides; for a reward service's ``__main__``."""
    from rlfleet.reward.service import main as _main

    return _main(check_reward(reward), argv, prog=prog, port=port, metrics_port=metrics_port)
