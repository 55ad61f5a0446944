"""Env tasks: what the env service plays, as plugins.

A task turns a `TaskSpec` (the contract's message: a task name, a seed, a turn limit, ...)
into episodes; an episode takes the policy's text one turn at a time. The env service
serves every task of its registry: rlfleet's own (the VisGym maze, ``maze_2d`` and
``maze_2d_hard``), the tasks installed packages add through the ``rlfleet.tasks``
entry-point group, and SkyRL environments (`rlfleet.tasks.skyrl`). The reward service
replays finished episodes with the same tasks, so both always agree on what a spec means.

Writing a task: subclass `Task` and `SimpleEpisode` (which keeps the turn count, the turn
limit and the counters), and declare the task in your package's ``pyproject.toml``::

    [project.entry-points."rlfleet.tasks"]
    countdown = "my_package:CountdownTask"

`rlfleet env serve` then lists and plays it; `rlfleet conformance` checks it. See
``tests/plugins/`` for a complete small task.
"""

from __future__ import annotations

import hashlib
import struct
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from rlfleet import limits
from rlfleet.maze.episode import EpisodeDone
from rlfleet.registries import BUILT_IN, TASKS_GROUP, Registry, RegistryError
from rlfleet.rpc.errors import InvalidArgument, NotFound

__all__ = [
    "TASKS_GROUP",
    "EpisodeDone",
    "Image",
    "RegistryError",
    "SimpleEpisode",
    "StepResult",
    "Task",
    "TaskEpisode",
    "TaskInfo",
    "TaskRegistry",
    "default_tasks",
    "image_from_png",
]

# The contract's bounds on what an observation carries (common.proto).
MAX_OBSERVATION_TEXT_BYTES = 16 * 1024
MAX_FEEDBACK_BYTES = 1024


@dataclass(frozen=True)
class TaskInfo:
    """What `ListTasks` says about a task. Sizes and turn limits are 0 when they do not
    apply."""

    name: str
    description: str = ""
    default_size: int = 0
    default_max_turns: int = 0


@dataclass(frozen=True)
class StepResult:
    """What one step did: the env's own reward for it, whether the text was read as an
    action, the canonical action applied ("" if none), and whether the task ended the
    episode (and with a solve)."""

    reward: float = 0.0
    parsed: bool = True
    action: str = ""
    done: bool = False
    solved: bool = False
    feedback: str = ""


@dataclass(frozen=True)
class Image:
    """An observation's picture: PNG bytes, their sha256 (hex), the size in pixels."""

    png: bytes
    sha256: str
    width: int
    height: int


def image_from_png(png: bytes) -> Image:
    """An `Image` of PNG bytes (size read from the IHDR chunk); ValueError if not a PNG."""
    if len(png) < 24 or png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        raise ValueError("not a PNG image")
    width, height = struct.unpack(">II", png[16:24])
    return Image(png, hashlib.sha256(png).hexdigest(), width, height)


class TaskEpisode(ABC):
    """One episode of a task, as the env and reward services see it. Not thread-safe: the
    env service holds a lock per episode. `step` raises `EpisodeDone` after the end."""

    #: The task instruction, sent with the first observation.
    instruction: str = ""

    @abstractmethod
    def step(self, text: str) -> StepResult: ...

    @property
    @abstractmethod
    def done(self) -> bool: ...

    @property
    @abstractmethod
    def turns(self) -> int: ...

    @property
    def truncated(self) -> bool:
        return False

    @property
    def solved(self) -> bool:
        return False

    @property
    def feedback(self) -> str:
        """The last step's feedback (or a start message before the first step)."""
        return ""

    @property
    def format_ok_turns(self) -> int:
        """Turns whose text was read as an action (in the episode's expected format)."""
        return 0

    @property
    def invalid_turns(self) -> int:
        return 0

    @property
    def env_return(self) -> float:
        """The sum of the env's own step rewards so far."""
        return 0.0

    def status(self) -> str:
        """The text of an observation after the first (the first is the instruction, a
        blank line, then this)."""
        return self.feedback

    def image(self) -> Image | None:
        """The current picture, or None for a text-only task."""
        return None

    def frame_key(self) -> Any:
        """A hashable key the env service renders batches of pictures by (the maze's
        frame cache); None (the default) means `image()` is asked instead."""
        return None

    def state_fields(self) -> dict[str, Any]:
        """`EpisodeState` fields (agent/target/wall_bumps only where they mean something)."""
        return {
            "turns": self.turns,
            "done": self.done,
            "solved": self.solved,
            "truncated": self.truncated,
            "format_ok_turns": self.format_ok_turns,
            "invalid_turns": self.invalid_turns,
        }

    def observation_fields(self, *, first: bool) -> dict[str, Any]:
        """`Observation` fields without the image (the service adds it)."""
        status = self.status()
        instruction = self.instruction if first else ""
        text = status
        if first and instruction:
            text = f"{instruction}\n\n{status}" if status else instruction
        return {
            "text": _truncate(text, MAX_OBSERVATION_TEXT_BYTES),
            "feedback": _truncate(self.feedback, MAX_FEEDBACK_BYTES),
            "done": self.done,
            "turn": self.turns,
            "truncated": self.truncated,
            "instruction": instruction,
        }


class SimpleEpisode(TaskEpisode):
    """A `TaskEpisode` that keeps the bookkeeping: subclasses implement `act` (apply one
    text, return a `StepResult`), and may override `status` and `image`.

    `max_turns` (0 = no limit) ends the episode as truncated once that many turns are
    played and the task has not ended it itself."""

    def __init__(self, *, instruction: str = "", max_turns: int = 0,
                 start_feedback: str = "") -> None:
        self.instruction = instruction
        self.max_turns = max_turns
        self._turns = 0
        self._done = False
        self._truncated = False
        self._solved = False
        self._feedback = start_feedback
        self._parsed = 0
        self._return = 0.0

    @abstractmethod
    def act(self, text: str) -> StepResult: ...

    def step(self, text: str) -> StepResult:
        if self._done:
            raise EpisodeDone("the episode is over; start a new one")
        result = self.act(text)
        self._turns += 1
        self._parsed += bool(result.parsed)
        self._return += float(result.reward)
        self._feedback = result.feedback
        if result.done:
            self._done = True
            self._solved = bool(result.solved)
        elif self.max_turns and self._turns >= self.max_turns:
            self._done = self._truncated = True
        return result

    @property
    def done(self) -> bool:
        return self._done

    @property
    def turns(self) -> int:
        return self._turns

    @property
    def truncated(self) -> bool:
        return self._truncated

    @property
    def solved(self) -> bool:
        return self._solved

    @property
    def feedback(self) -> str:
        return self._feedback

    @property
    def format_ok_turns(self) -> int:
        return self._parsed

    @property
    def invalid_turns(self) -> int:
        return self._turns - self._parsed

    @property
    def env_return(self) -> float:
        return self._return


class Task(ABC):
    """A task: its `info` and how to open an episode of a spec.

    `open` gets the contract's `TaskSpec` after the service has checked the fields every
    task shares (seed, max_turns and turn_margin within their bounds). It raises
    ValueError (or `rlfleet.rpc.InvalidArgument`) for a spec it cannot play; the service
    answers INVALID_ARGUMENT with the message. It must be deterministic: the same spec
    gives the same episode, on every process (the reward service replays episodes)."""

    info: TaskInfo

    @property
    def name(self) -> str:
        return self.info.name

    @abstractmethod
    def open(self, spec: Any) -> TaskEpisode: ...

    def replay(self, spec: Any, actions: list[str]) -> tuple[TaskEpisode, list[StepResult]]:
        """A fresh episode of `spec` with `actions` played; actions after the end are
        ignored."""
        episode = self.open(spec)
        results = []
        for text in actions:
            if episode.done:
                break
            results.append(episode.step(text))
        return episode, results


def _truncate(text: str, max_bytes: int) -> str:
    """`text` cut to at most `max_bytes` of UTF-8 (on a character boundary)."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes].decode(errors="ignore")


def _check_range(what: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise InvalidArgument(f"{what} must be in {low}..{high}, got {value}")


class TaskRegistry:
    """The tasks one service plays, by name: built-ins, entry points, tasks added in code.

    `open(spec)` checks what every task shares (name, seed, turn bounds), finds the task
    (NOT_FOUND naming the ones there are), and opens the episode (INVALID_ARGUMENT for a
    spec the task refuses)."""

    default_task = "maze_2d"

    def __init__(self) -> None:
        self._registry: Registry[Task] = Registry(
            "task", TASKS_GROUP, is_kind=lambda o: isinstance(o, Task),
            name_of=lambda t: t.info.name)

    def add(self, task: Task | Any, name: str | None = None,
            description: str = BUILT_IN) -> TaskRegistry:
        self._registry.add(name or task.info.name, task, description)
        return self

    def discover(self, eps: Any = None) -> TaskRegistry:
        self._registry.discover(eps)
        return self

    def names(self) -> list[str]:
        return self._registry.names()

    def only(self, names: list[str]) -> TaskRegistry:
        """A registry serving `names` only."""
        other = TaskRegistry()
        other._registry = self._registry.subset(names)
        if self.default_task not in names and names:
            other.default_task = names[0]
        return other

    def __contains__(self, name: object) -> bool:
        return name in self._registry

    def get(self, name: str) -> Task:
        if name not in self._registry:
            raise NotFound(f"unknown task {name!r}; this service has {self.names()}")
        return self._registry.get(name)

    def load_all(self) -> list[Task]:
        """Every task, loaded now (a plugin that fails to load fails here, at start-up)."""
        return list(self._registry.load_all().values())

    def task_of(self, spec: Any) -> Task:
        name = spec.task or self.default_task
        if len(name.encode()) > limits.MAX_TASK_NAME_BYTES:
            raise InvalidArgument(f"task name longer than {limits.MAX_TASK_NAME_BYTES} bytes")
        task = self.get(name)
        _check_range("seed", spec.seed, 0, limits.MAX_SEED)
        _check_range("max_turns", spec.max_turns, 0, limits.MAX_TURNS)
        _check_range("turn_margin", spec.turn_margin, 0, limits.MAX_TURNS)
        return task

    def open(self, spec: Any) -> TaskEpisode:
        task = self.task_of(spec)
        try:
            return task.open(spec)
        except (InvalidArgument, NotFound):
            raise
        except ValueError as exc:
            raise InvalidArgument(f"task {task.name!r}: {exc}") from exc

    def replay(self, spec: Any, actions: list[str]) -> tuple[TaskEpisode, list[StepResult]]:
        task = self.task_of(spec)
        try:
            return task.replay(spec, actions)
        except (InvalidArgument, NotFound):
            raise
        except ValueError as exc:
            raise InvalidArgument(f"task {task.name!r}: {exc}") from exc


def default_tasks(*, discover: bool = True) -> TaskRegistry:
    """rlfleet's maze tasks, plus (with `discover`) every ``rlfleet.tasks`` entry point."""
    from rlfleet.tasks.maze import maze_tasks

    registry = TaskRegistry()
    for task in maze_tasks():
        registry.add(task)
    if discover:
        registry.discover()
    return registry
