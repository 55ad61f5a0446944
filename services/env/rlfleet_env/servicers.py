"""The env and reward contracts for the maze."""

from __future__ import annotations

import grpc

from rlfleet import limits
from rlfleet.maze.episode import EpisodeDone
from rlfleet.maze.render import render_frames, submit_frames
from rlfleet.maze.tasks import TASKS
from rlfleet.rpc.errors import FailedPrecondition, InvalidArgument
from rlfleet.v1 import env_pb2, env_pb2_grpc, reward_pb2, reward_pb2_grpc
from rlfleet_env.convert import frame_state, image_fields, observation_fields, state_fields
from rlfleet_env.episodes import EpisodeTable
from rlfleet_env.rewards import RewardFunction, replay
from rlfleet_env.tasks import episode_from_spec

# Steps of a batch whose frames are handed to the encoder threads together.
_FRAME_CHUNK = 16


def _check_batch(what: str, n: int) -> None:
    if n == 0:
        raise InvalidArgument(f"{what}: empty batch")
    if n > limits.MAX_BATCH:
        raise InvalidArgument(f"{what}: {n} items, at most {limits.MAX_BATCH} per call")


class EnvServicer(env_pb2_grpc.EnvServiceServicer):
    def __init__(self, table: EpisodeTable) -> None:
        self.table = table

    def Open(self, request: env_pb2.OpenRequest, context: grpc.ServicerContext):  # noqa: N802
        _check_batch("Open", len(request.tasks))
        episodes = [episode_from_spec(spec) for spec in request.tasks]  # all validated first
        ids = self.table.add(episodes)
        # Nobody else has these ids yet, so the episodes are read without their locks.
        frames = (
            render_frames([frame_state(ep) for ep in episodes])
            if request.include_image
            else [None] * len(episodes)
        )
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
            # Frames are a pure function of the state read here: new ones are encoded on
            # the frame cache's threads while this one steps the rest of the batch.
            results, states, pending = [], [], []
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
                        "action": outcome.action.name if outcome.action else "",
                    }
                )
                if include_image:
                    states.append(frame_state(ep))
                    if len(states) == _FRAME_CHUNK:
                        pending.append(submit_frames(states))
                        states = []
        finally:
            for i in order:
                entries[i].lock.release()
        if include_image:
            # A lone step (batch of one) encodes in this thread: no hand-off to wait for.
            pending.append(submit_frames(states, inline=len(results) == 1))
            frames = (frame for collect in pending for frame in collect())
            for result, frame in zip(results, frames, strict=True):
                result["observation"]["image"] = image_fields(frame)
        return env_pb2.StepResponse(results=results)

    def Close(self, request: env_pb2.CloseRequest, context: grpc.ServicerContext):  # noqa: N802
        _check_batch("Close", len(request.episode_ids))
        closed, missing = self.table.pop(list(request.episode_ids))
        return env_pb2.CloseResponse(
            episodes=[
                {"episode_id": episode_id, "state": state_fields(ep)} for episode_id, ep in closed
            ],
            not_found=missing,
        )

    def ListTasks(self, request, context):  # noqa: N802, ANN001, ANN201
        return env_pb2.ListTasksResponse(
            tasks=[
                env_pb2.TaskInfo(
                    name=t.name,
                    description=f"VisGym-style 2D maze, {t.size}x{t.size}",
                    default_size=t.size,
                    default_max_turns=t.max_turns,
                )
                for t in TASKS.values()
            ]
        )


class RewardServicer(reward_pb2_grpc.RewardServiceServicer):
    def __init__(self, reward: RewardFunction) -> None:
        self.reward = reward
        self.info = reward_pb2.RewardInfo(
            name=reward.name, version=reward.version, components=list(reward.components)
        )

    def Score(self, request: reward_pb2.ScoreRequest, context: grpc.ServicerContext):  # noqa: N802
        _check_batch("Score", len(request.episodes))
        scores = []
        for i, record in enumerate(request.episodes):
            if len(record.actions) > limits.MAX_TURNS:
                raise InvalidArgument(f"episode {i}: more than {limits.MAX_TURNS} actions")
            if any(len(a.encode()) > limits.MAX_ACTION_TEXT_BYTES for a in record.actions):
                raise InvalidArgument(
                    f"episode {i}: an action is longer than {limits.MAX_ACTION_TEXT_BYTES} bytes"
                )
            episode = replay(episode_from_spec(record.task), list(record.actions))
            result = self.reward.score(episode)
            scores.append(
                reward_pb2.Score(
                    reward=result.reward, components=result.components, solved=result.solved
                )
            )
        return reward_pb2.ScoreResponse(scores=scores, info=self.info)

    def Info(self, request, context):  # noqa: N802, ANN001, ANN201
        return self.info
