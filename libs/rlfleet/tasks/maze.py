"""The VisGym maze as an env task (``maze_2d`` 9×9, ``maze_2d_hard`` 11×11).

`episode_from_spec` turns a protobuf `TaskSpec` into a `MazeEpisode`, validating every
field; the env service (open an episode) and every reward service (replay the actions of
a finished episode) go through it, so both always agree on what a spec means.
"""

from __future__ import annotations

from typing import Any

from rlfleet import limits
from rlfleet.maze.episode import MazeEpisode, default_max_turns
from rlfleet.maze.generate import generate_layout
from rlfleet.maze.layout import Layout
from rlfleet.maze.oracle import distance_to_target
from rlfleet.maze.render import Frame
from rlfleet.maze.tasks import TASKS, get_task
from rlfleet.names import from_wire
from rlfleet.rpc.errors import InvalidArgument
from rlfleet.tasks import StepResult, Task, TaskEpisode, TaskInfo
from rlfleet.v1 import common_pb2


def _check_range(what: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise InvalidArgument(f"{what} must be in {low}..{high}, got {value}")


def episode_from_spec(spec: Any) -> MazeEpisode:
    """A fresh maze episode for `spec` (a protobuf `TaskSpec` of a maze task);
    ValueError (InvalidArgument) for bad values."""
    preset = get_task(spec.task or "maze_2d")
    _check_range("seed", spec.seed, 0, limits.MAX_SEED)
    _check_range("max_turns", spec.max_turns, 0, limits.MAX_TURNS)
    _check_range("turn_margin", spec.turn_margin, 0, limits.MAX_TURNS)
    _check_range("render.cell_px", spec.render.cell_px, 0, limits.MAX_CELL_PX)
    try:
        if spec.HasField("layout"):
            layout = _layout_from_proto(spec.layout)
        else:
            size = spec.size or preset.size
            if not (limits.MIN_GRID <= size <= limits.MAX_GRID) or size % 2 == 0:
                raise InvalidArgument(
                    f"size must be odd and in {limits.MIN_GRID}..{limits.MAX_GRID}, got {size}"
                )
            layout = generate_layout(spec.seed, size)
        max_turns = spec.max_turns or (
            preset.max_turns
            if layout.height == preset.size
            else default_max_turns(layout.height, layout.width)
        )
        if spec.turn_margin:
            # the shortest solution's moves, the stop, and the margin
            max_turns = min(max_turns, distance_to_target(layout) + 1 + spec.turn_margin)
        return MazeEpisode(
            layout,
            max_turns=max_turns,
            # an unknown value is a ValueError naming the known ones (InvalidArgument)
            action_format=from_wire(common_pb2.ActionFormat, spec.format)
            or preset.action_format,
            cell_px=spec.render.cell_px or preset.cell_px,
        )
    except InvalidArgument:
        raise
    except ValueError as exc:  # LayoutError, bad format, bad cell size
        raise InvalidArgument(str(exc)) from exc


def _layout_from_proto(layout: Any) -> Layout:
    for what, value in (("layout.height", layout.height), ("layout.width", layout.width)):
        _check_range(what, value, limits.MIN_GRID, limits.MAX_GRID)
    return Layout.from_bytes(
        layout.height,
        layout.width,
        layout.walls,
        (layout.agent.row, layout.agent.col),
        (layout.target.row, layout.target.col),
    )


class MazeTaskEpisode(TaskEpisode):
    """A `MazeEpisode` behind the task interface; `maze` is the episode itself (layout,
    counters), for reward functions that need more than the common fields."""

    __slots__ = ("maze",)

    def __init__(self, maze: MazeEpisode) -> None:
        self.maze = maze

    @property
    def instruction(self) -> str:  # type: ignore[override]
        return self.maze.instruction

    def step(self, text: str) -> StepResult:
        outcome = self.maze.step(text)
        return StepResult(
            reward=outcome.reward,
            parsed=outcome.parsed,
            action=outcome.action.name if outcome.action else "",
            done=outcome.done,
            solved=outcome.solved,
            feedback=outcome.feedback,
        )

    @property
    def done(self) -> bool:
        return self.maze.done

    @property
    def turns(self) -> int:
        return self.maze.stats.turns

    @property
    def truncated(self) -> bool:
        return self.maze.stats.truncated

    @property
    def solved(self) -> bool:
        return self.maze.stats.solved

    @property
    def feedback(self) -> str:
        return self.maze.feedback

    @property
    def format_ok_turns(self) -> int:
        return self.maze.stats.format_ok_turns

    @property
    def invalid_turns(self) -> int:
        return self.maze.stats.invalid_turns

    @property
    def env_return(self) -> float:
        return float(self.maze.stats.solved)  # 1.0 on the solving stop, nothing else

    def status(self) -> str:
        return self.maze.status()

    def frame_key(self) -> tuple | None:
        # VisGym's frames (JPEG, the disc left on the target) have a cache of their own:
        # None sends the service to `image()` for them
        if self.maze.visgym:
            return None
        return self.maze.layout, self.maze.agent, self.maze.cell_px

    def image(self) -> Frame:
        return self.maze.frame()

    def state_fields(self) -> dict[str, Any]:
        maze = self.maze
        s = maze.stats
        agent, target = maze.agent, maze.layout.target
        return {
            "agent": {"row": agent[0], "col": agent[1]},
            "target": {"row": target[0], "col": target[1]},
            "turns": s.turns,
            "done": maze.done,
            "solved": s.solved,
            "truncated": s.truncated,
            "format_ok_turns": s.format_ok_turns,
            "invalid_turns": s.invalid_turns,
            "wall_bumps": s.wall_bumps,
        }

    def observation_fields(self, *, first: bool) -> dict[str, Any]:
        # The first observation carries the whole instruction; later ones only the status
        # (feedback and turns left), as a chat would: the instruction is already in context.
        maze = self.maze
        instruction = maze.instruction if first else ""
        return {
            "text": maze.observation_text(first),
            "feedback": maze.feedback,
            "done": maze.done,
            "turn": maze.stats.turns,
            "truncated": maze.stats.truncated,
            "instruction": instruction,
        }


class MazeTask(Task):
    """One maze preset (`rlfleet.maze.tasks.TASKS`)."""

    def __init__(self, name: str) -> None:
        preset = get_task(name)
        self.info = TaskInfo(
            name=name,
            description=f"VisGym-style 2D maze, {preset.size}x{preset.size}",
            default_size=preset.size,
            default_max_turns=preset.max_turns,
        )

    def open(self, spec: Any) -> MazeTaskEpisode:
        return MazeTaskEpisode(episode_from_spec(spec))


def maze_tasks() -> list[MazeTask]:
    return [MazeTask(name) for name in TASKS]


def maze_of(episode: TaskEpisode) -> MazeEpisode | None:
    """The `MazeEpisode` behind a task episode, or None for another task."""
    return episode.maze if isinstance(episode, MazeTaskEpisode) else None
