"""From a protobuf TaskSpec to a maze episode, validating every field.

The same conversion serves the env (open an episode) and the reward service (replay the
actions of a finished episode), so both always agree on what a task spec means.
"""

from __future__ import annotations

from rlfleet import limits
from rlfleet.maze.episode import MazeEpisode, default_max_turns
from rlfleet.maze.generate import generate_layout
from rlfleet.maze.layout import Layout
from rlfleet.maze.oracle import distance_to_target
from rlfleet.maze.tasks import TASKS, get_task
from rlfleet.rpc.errors import InvalidArgument, NotFound
from rlfleet.v1 import common_pb2


def episode_from_spec(spec: common_pb2.TaskSpec) -> MazeEpisode:
    """A fresh episode for `spec`; NotFound for an unknown task, InvalidArgument for bad
    values."""
    name = spec.task or "maze_2d"
    if len(name.encode()) > limits.MAX_TASK_NAME_BYTES:
        raise InvalidArgument(f"task name longer than {limits.MAX_TASK_NAME_BYTES} bytes")
    if name not in TASKS:
        raise NotFound(f"unknown task {name!r}; this service has {sorted(TASKS)}")
    preset = get_task(name)
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
            action_format=spec.action_format or preset.action_format,
            cell_px=spec.render.cell_px or preset.cell_px,
        )
    except ValueError as exc:  # LayoutError, bad format, bad cell size
        raise InvalidArgument(str(exc)) from exc


def _layout_from_proto(layout: common_pb2.MazeLayout) -> Layout:
    for what, value in (("layout.height", layout.height), ("layout.width", layout.width)):
        _check_range(what, value, limits.MIN_GRID, limits.MAX_GRID)
    return Layout.from_bytes(
        layout.height,
        layout.width,
        layout.walls,
        (layout.agent.row, layout.agent.col),
        (layout.target.row, layout.target.col),
    )


def _check_range(what: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise InvalidArgument(f"{what} must be in {low}..{high}, got {value}")
