"""Maze objects to protobuf messages.

The env service answers batches of up to `limits.MAX_BATCH` steps, so the hot path builds
each result as plain dicts and the whole response in one constructor call: upb converts
nested dicts in C, where building a message per field (and copying each submessage into
its parent) costs several times more. `*_proto` wrap the same dicts for single messages;
both give the same bytes.
"""

from __future__ import annotations

from typing import Any

from rlfleet.maze.episode import MazeEpisode
from rlfleet.maze.layout import Layout, Position
from rlfleet.maze.render import Frame
from rlfleet.v1 import common_pb2


def state_fields(episode: MazeEpisode) -> dict[str, Any]:
    """The `EpisodeState` of `episode` as message fields."""
    s = episode.stats
    agent, target = episode.agent, episode.layout.target
    return {
        "agent": {"row": agent[0], "col": agent[1]},
        "target": {"row": target[0], "col": target[1]},
        "turns": s.turns,
        "done": episode.done,
        "solved": s.solved,
        "truncated": s.truncated,
        "format_ok_turns": s.format_ok_turns,
        "invalid_turns": s.invalid_turns,
        "wall_bumps": s.wall_bumps,
    }


def image_fields(frame: Frame | None) -> dict[str, Any]:
    """An `Image` with the frame's PNG and sha256; without a frame, present but empty (no
    PNG is looked up, encoded or hashed)."""
    if frame is None:
        return {}
    return {"png": frame.png, "width": frame.width, "height": frame.height,
            "sha256": frame.sha256}


def observation_fields(
    episode: MazeEpisode, *, first: bool, frame: Frame | None
) -> dict[str, Any]:
    """The `Observation` of `episode` as message fields, with `frame` as its image (see
    `image_fields`; the caller gets frames in bulk from the frame cache).

    The first observation carries the whole instruction; later ones only the status
    (feedback and turns left), as a chat would: the instruction is already in context."""
    status = episode.status()
    instruction = episode.instruction if first else ""
    return {
        "image": image_fields(frame),
        "text": f"{instruction}\n\n{status}" if first else status,
        "feedback": episode.feedback,
        "done": episode.done,
        "turn": episode.stats.turns,
        "truncated": episode.stats.truncated,
        "instruction": instruction,
    }


def frame_state(episode: MazeEpisode) -> tuple[Layout, Position, int]:
    """What `episode`'s current frame is a function of, for `render_frames`."""
    return episode.layout, episode.agent, episode.cell_px


def state_proto(episode: MazeEpisode) -> common_pb2.EpisodeState:
    return common_pb2.EpisodeState(**state_fields(episode))


def observation_proto(
    episode: MazeEpisode, *, first: bool, include_image: bool
) -> common_pb2.Observation:
    frame = episode.frame() if include_image else None
    return common_pb2.Observation(**observation_fields(episode, first=first, frame=frame))
