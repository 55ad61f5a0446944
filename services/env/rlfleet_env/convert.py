"""Task episodes to protobuf messages.

The env service answers batches of up to `limits.MAX_BATCH` steps, so the hot path builds
each result as plain dicts and the whole response in one constructor call: upb converts
nested dicts in C, where building a message per field (and copying each submessage into
its parent) costs several times more. `*_proto` wrap the same dicts for single messages;
both give the same bytes. The fields themselves come from the episode
(`rlfleet.tasks.TaskEpisode.observation_fields` / `state_fields`), so any task serves.
"""

from __future__ import annotations

from typing import Any

from rlfleet.tasks import TaskEpisode
from rlfleet.v1 import common_pb2


def state_fields(episode: TaskEpisode) -> dict[str, Any]:
    """The `EpisodeState` of `episode` as message fields."""
    return episode.state_fields()


def image_fields(frame: Any) -> dict[str, Any]:
    """An `Image` with the frame's PNG and sha256; without a frame, present but empty (no
    PNG is looked up, encoded or hashed)."""
    if frame is None:
        return {}
    fields = {"png": frame.png, "width": frame.width, "height": frame.height,
              "sha256": frame.sha256}
    media_type = getattr(frame, "media_type", "image/png")
    if media_type != "image/png":  # "" on the wire is PNG
        fields["media_type"] = media_type
    return fields


def observation_fields(episode: TaskEpisode, *, first: bool, frame: Any) -> dict[str, Any]:
    """The `Observation` of `episode` as message fields, with `frame` as its image (the
    caller gets frames in bulk, see `servicers.frames_of`)."""
    fields = episode.observation_fields(first=first)
    fields["image"] = image_fields(frame)
    return fields


def observation_proto(
    episode: TaskEpisode, *, first: bool, include_image: bool
) -> common_pb2.Observation:
    frame = episode.image() if include_image else None
    return common_pb2.Observation(**observation_fields(episode, first=first, frame=frame))
