"""Maze objects to protobuf messages."""

from __future__ import annotations

import hashlib

from rlfleet.maze.episode import MazeEpisode
from rlfleet.v1 import common_pb2


def state_proto(episode: MazeEpisode) -> common_pb2.EpisodeState:
    s = episode.stats
    return common_pb2.EpisodeState(
        agent=common_pb2.Point(row=episode.agent[0], col=episode.agent[1]),
        target=common_pb2.Point(row=episode.layout.target[0], col=episode.layout.target[1]),
        turns=s.turns,
        done=episode.done,
        solved=s.solved,
        truncated=s.truncated,
        format_ok_turns=s.format_ok_turns,
        invalid_turns=s.invalid_turns,
        wall_bumps=s.wall_bumps,
    )


def observation_proto(
    episode: MazeEpisode, *, first: bool, include_image: bool
) -> common_pb2.Observation:
    """The first observation carries the whole instruction; later ones only the status
    (feedback and turns left), as a chat would: the instruction is already in context."""
    obs = episode.observe()
    image = common_pb2.Image()
    if include_image:
        side = episode.cell_px
        image = common_pb2.Image(
            png=obs.png,
            width=episode.layout.width * side,
            height=episode.layout.height * side,
            sha256=hashlib.sha256(obs.png).hexdigest(),
        )
    return common_pb2.Observation(
        image=image,
        text=obs.text if first else obs.status,
        feedback=episode.feedback,
        done=episode.done,
        turn=obs.turn,
        truncated=episode.stats.truncated,
        instruction=obs.instruction if first else "",
    )
