"""The env and reward contracts for every task of the service's registry."""

from __future__ import annotations

import grpc

from rlfleet import limits
from rlfleet.maze.render import render_frames, submit_frames
from rlfleet.reward.service import RewardServicer, check_batch
from rlfleet.rpc.errors import FailedPrecondition, InvalidArgument
from rlfleet.tasks import EpisodeDone, TaskEpisode, TaskRegistry, default_tasks
from rlfleet.v1 import env_pb2, env_pb2_grpc
from rlfleet_env.convert import image_fields, observation_fields, state_fields
from rlfleet_env.episodes import EpisodeTable

# Steps of a batch whose frames are handed to the encoder threads together.
_FRAME_CHUNK = 16

_check_batch = check_batch  # the same rules for Open/Step/Close/Score
MAX_REQUEST_ID_BYTES = 128

__all__ = ["EnvServicer", "RewardServicer"]


def frames_of(episodes: list[TaskEpisode]) -> list:
    """The current picture of each episode: the maze's through the frame cache, rendered
    as one batch; other tasks' from `image()` (None for text-only tasks)."""
    keys = [ep.frame_key() for ep in episodes]
    batched = [k for k in keys if k is not None]
    rendered = iter(render_frames(batched) if batched else [])
    return [next(rendered) if key is not None else ep.image()
            for ep, key in zip(episodes, keys, strict=True)]


class EnvServicer(env_pb2_grpc.EnvServiceServicer):
    def __init__(self, table: EpisodeTable, tasks: TaskRegistry | None = None) -> None:
        self.table = table
        self.tasks = tasks if tasks is not None else default_tasks()
        # ListTasks' answer, built once (loading every task now: a broken plugin fails at
        # start-up, not on the first call).
        self._task_list = env_pb2.ListTasksResponse(tasks=[
            env_pb2.TaskInfo(name=t.info.name, description=t.info.description,
                             default_size=t.info.default_size,
                             default_max_turns=t.info.default_max_turns)
            for t in self.tasks.load_all()
        ])

    def Open(self, request: env_pb2.OpenRequest, context: grpc.ServicerContext):  # noqa: N802
        _check_batch("Open", len(request.tasks))
        if len(request.request_id.encode()) > MAX_REQUEST_ID_BYTES:
            raise InvalidArgument(f"request_id is longer than {MAX_REQUEST_ID_BYTES} bytes")
        episodes = [self.tasks.open(spec) for spec in request.tasks]  # all validated first
        ids = self.table.add(episodes, request.request_id)
        # Nobody else has these ids yet, so the episodes are read without their locks.
        frames = frames_of(episodes) if request.include_image else [None] * len(episodes)
        return env_pb2.OpenResponse(
            episodes=[
                {
                    "episode_id": episode_id,
                    "observation": observation_fields(ep, first=True, frame=frame),
                    "state": state_fields(ep),
                }
                for episode_id, ep, frame in zip(ids, episodes, frames, strict=True)
            ]
        )

    def Step(self, request: env_pb2.StepRequest, context: grpc.ServicerContext):  # noqa: N802
        _check_batch("Step", len(request.actions))
        # Each field read from a upb message makes a new Python object: read them once.
        actions = [(a.episode_id, a.text) for a in request.actions]
        ids = [episode_id for episode_id, _ in actions]
        if len(set(ids)) != len(ids):
            raise InvalidArgument("Step: an episode id appears twice in one batch")
        for episode_id, text in actions:
            if len(text.encode()) > limits.MAX_ACTION_TEXT_BYTES:
                raise InvalidArgument(
                    f"action text for {episode_id[:64]!r} is longer than "
                    f"{limits.MAX_ACTION_TEXT_BYTES} bytes"
                )
        entries = self.table.get_all(ids)
        include_image = request.include_image
        # Lock in a fixed order so concurrent batches sharing episodes cannot deadlock.
        order = sorted(range(len(entries)), key=ids.__getitem__)
        for i in order:
            entries[i].lock.acquire()
        try:
            for entry, episode_id in zip(entries, ids, strict=True):
                if entry.episode.done:  # all-or-nothing: check before stepping any
                    raise FailedPrecondition(f"episode {episode_id!r} is done; open a new one")
            # Plain values only, read under the locks; the message is built after them.
            # Maze frames are a pure function of the state read here: new ones are encoded
            # on the frame cache's threads while this one steps the rest of the batch.
            # Other tasks' pictures are taken now, under the lock.
            results, states, pending, direct = [], [], [], {}
            for entry, (episode_id, text) in zip(entries, actions, strict=True):
                ep = entry.episode
                try:
                    outcome = ep.step(text)
                except EpisodeDone as exc:  # pragma: no cover - checked above under the lock
                    raise FailedPrecondition(str(exc)) from exc
                results.append(
                    {
                        "episode_id": episode_id,
                        "observation": observation_fields(ep, first=False, frame=None),
                        "reward": outcome.reward,
                        "state": state_fields(ep),
                        "parsed": outcome.parsed,
                        "action": outcome.action,
                    }
                )
                if include_image:
                    key = ep.frame_key()
                    if key is None:
                        direct[len(results) - 1] = ep.image()
                        continue
                    states.append(key)
                    if len(states) == _FRAME_CHUNK:
                        pending.append(submit_frames(states))
                        states = []
        finally:
            for i in order:
                entries[i].lock.release()
        if include_image:
            # A lone step (batch of one) encodes in this thread: no hand-off to wait for.
            if states:
                pending.append(submit_frames(states, inline=len(results) == 1))
            frames = (frame for collect in pending for frame in collect())
            for i, result in enumerate(results):
                frame = direct[i] if i in direct else next(frames)
                result["observation"]["image"] = image_fields(frame)
        return env_pb2.StepResponse(results=results)

    def Close(self, request: env_pb2.CloseRequest, context: grpc.ServicerContext):  # noqa: N802
        named = list(request.request_ids)
        _check_batch("Close", len(request.episode_ids) + len(named))
        if any(len(r.encode()) > MAX_REQUEST_ID_BYTES for r in named):
            raise InvalidArgument(f"a request_id is longer than {MAX_REQUEST_ID_BYTES} bytes")
        ids = list(request.episode_ids)
        given = set(ids)
        ids += [i for i in self.table.opened_by(named) if i not in given]
        closed, missing = self.table.pop(ids)
        return env_pb2.CloseResponse(
            episodes=[
                {"episode_id": episode_id, "state": state_fields(ep)} for episode_id, ep in closed
            ],
            not_found=missing,
        )

    def ListTasks(self, request, context):  # noqa: N802, ANN001, ANN201
        return self._task_list
