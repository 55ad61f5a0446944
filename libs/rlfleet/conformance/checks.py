"""The conformance checks. Each check takes a Target and raises AssertionError (with a
message) when the service misbehaves, or `Skip` when the target does not serve what the
check needs.

Two kinds of checks:

- **core** checks hold for any implementation of the contracts, whatever its tasks:
  health and reflection; the env contract's behaviour on any task the service lists
  (open, step, turn accounting, close, determinism); batches are all or nothing; deadlines;
  bad input answers the documented status codes; the size bounds each message allows
  (accepted at the bound, refused one past it); the reward contract (name and version,
  one score per episode, finite and deterministic scores, its errors).
- **task** checks run only for the rlfleet tasks a service lists (``ListTasks`` for the
  env contract, ``RewardInfo.tasks`` for the reward contract): for ``maze_2d`` and
  ``maze_2d_hard`` the pictures, the BFS oracle solving with reward 1, the turn limit,
  the maze's spec errors, VisGym's action semantics, and a reward that scores a true solve
  above everything else.

A service that lists none of rlfleet's tasks runs (and can pass) the core checks only.
"""

from __future__ import annotations

import hashlib
import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rlfleet import limits
from rlfleet.maze.actions import ActionFormat, format_action
from rlfleet.maze.generate import generate_layout
from rlfleet.maze.oracle import oracle_actions
from rlfleet.maze.tasks import TASKS as MAZE_TASKS
from rlfleet.rpc.client import open_channel
from rlfleet.v1 import common_pb2, env_pb2, env_pb2_grpc, reward_pb2, reward_pb2_grpc

ENV = "rlfleet.v1.EnvService"
REWARD = "rlfleet.v1.RewardService"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TIMEOUT_S = 10.0
# A call that carries a whole batch (MAX_BATCH episodes) does up to MAX_BATCH times the
# work of a one-episode call: it gets this many times the deadline.
BATCH_TIMEOUT_FACTOR = 6
CONNECT_TIMEOUT_S = 5.0
MAX_OBSERVATION_TEXT_BYTES = 16 * 1024
MAX_FEEDBACK_BYTES = 1024


class Skip(Exception):
    """The target does not serve what this check needs."""


class Unreachable(Exception):
    """Nothing answers at the target's address."""


@dataclass
class CheckResult:
    name: str
    outcome: str  # "pass", "fail", "skip"
    detail: str = ""


class Target:
    """The service under test. `timeout_s` is the deadline of each one-episode call (raise
    it for a busy or distant service); a call of a whole batch gets BATCH_TIMEOUT_FACTOR
    times it."""

    def __init__(self, address: str, token: str | None = None,
                 timeout_s: float = TIMEOUT_S, tls: dict[str, Any] | None = None) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r}: a positive number of seconds")
        self.address = address
        self.timeout_s = timeout_s
        self.batch_timeout_s = BATCH_TIMEOUT_FACTOR * timeout_s
        self.channel = open_channel(address, token=token, **(tls or {}))
        self.env = env_pb2_grpc.EnvServiceStub(self.channel)
        self.reward = reward_pb2_grpc.RewardServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self._services: set[str] | None = None
        self._tasks: list[env_pb2.TaskInfo] | None = None
        self._info: reward_pb2.RewardInfo | None = None

    def probe(self, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        """Unreachable unless the server answers a health check within `timeout_s`."""
        try:
            self.health.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError as err:
            detail = (err.details() or "").splitlines()[0] if err.details() else ""
            raise Unreachable(f"cannot reach {self.address}: {err.code().name}"
                              + (f" ({detail})" if detail else "")) from None

    @property
    def services(self) -> set[str]:
        if self._services is None:
            stub = reflection_pb2_grpc.ServerReflectionStub(self.channel)
            (reply,) = list(
                stub.ServerReflectionInfo(
                    iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                    timeout=self.timeout_s,
                )
            )
            self._services = {s.name for s in reply.list_services_response.service}
        return self._services

    def need(self, service: str) -> None:
        if service not in self.services:
            raise Skip(f"target does not serve {service}")

    # -- what the target lists -------------------------------------------------------

    @property
    def tasks(self) -> list[env_pb2.TaskInfo]:
        """The env contract's tasks ([] without an env contract)."""
        if self._tasks is None:
            self._tasks = (list(self.env.ListTasks(env_pb2.ListTasksRequest(),
                                                   timeout=self.timeout_s).tasks)
                           if ENV in self.services else [])
        return self._tasks

    @property
    def task_names(self) -> list[str]:
        return [t.name for t in self.tasks]

    @property
    def info(self) -> reward_pb2.RewardInfo:
        if self._info is None:
            self.need(REWARD)
            self._info = self.reward.Info(reward_pb2.RewardInfoRequest(), timeout=self.timeout_s)
        return self._info

    @property
    def scored_tasks(self) -> list[str]:
        """The tasks the reward contract scores: RewardInfo.tasks, or (when the service
        does not report them) the tasks its env contract lists."""
        return list(self.info.tasks) or self.task_names

    def core_task(self) -> str:
        """A task this env serves, for the core checks (the first it lists)."""
        self.need(ENV)
        if not self.task_names:
            raise AssertionError("ListTasks lists no task: an env service serves at least one")
        return self.task_names[0]

    # -- calls -----------------------------------------------------------------------

    def deadline(self, n: int) -> float:
        """The deadline of a call that carries `n` episodes."""
        return self.batch_timeout_s if n > 1 else self.timeout_s

    def open(self, *specs: common_pb2.TaskSpec, image: bool = True) -> env_pb2.OpenResponse:
        return self.env.Open(env_pb2.OpenRequest(tasks=list(specs), include_image=image),
                             timeout=self.deadline(len(specs)))

    def step(self, episode_id: str, text: str, image: bool = False) -> env_pb2.StepResult:
        reply = self.env.Step(
            env_pb2.StepRequest(actions=[env_pb2.Action(episode_id=episode_id, text=text)],
                                include_image=image),
            timeout=self.timeout_s,
        )
        return reply.results[0]

    def close_episodes(self, *ids: str) -> env_pb2.CloseResponse:
        return self.env.Close(env_pb2.CloseRequest(episode_ids=list(ids)),
                              timeout=self.deadline(len(ids)))

    def close(self) -> None:
        self.channel.close()


def expect_code(code: grpc.StatusCode, call: Callable[[], object], what: str) -> None:
    try:
        call()
    except grpc.RpcError as err:
        assert err.code() == code, f"{what}: expected {code.name}, got {err.code().name}"
        assert err.details(), f"{what}: {code.name} without a message"
        return
    raise AssertionError(f"{what}: expected {code.name}, the call succeeded")


def spec(seed: int = 7, task: str = "maze_2d", **kw: object) -> common_pb2.TaskSpec:
    return common_pb2.TaskSpec(task=task, seed=seed, **kw)


def _check_image(image: common_pb2.Image, what: str) -> None:
    if not image.png:
        return
    if image.media_type == "image/jpeg":  # the visgym profile's frames, as VisGym sends them
        assert image.png.startswith(b"\xff\xd8"), f"{what}: the image is not a JPEG"
    else:
        assert image.png.startswith(PNG_MAGIC), f"{what}: the image is not a PNG"
    assert image.width > 0 and image.height > 0, f"{what}: the image has no size"
    assert image.sha256 == hashlib.sha256(image.png).hexdigest(), \
        f"{what}: the image's sha256 is not the digest of its PNG"


def _check_observation(obs: common_pb2.Observation, what: str) -> None:
    assert len(obs.text.encode()) <= MAX_OBSERVATION_TEXT_BYTES, \
        f"{what}: observation text longer than {MAX_OBSERVATION_TEXT_BYTES} bytes"
    assert len(obs.feedback.encode()) <= MAX_FEEDBACK_BYTES, \
        f"{what}: feedback longer than {MAX_FEEDBACK_BYTES} bytes"
    _check_image(obs.image, what)


# == core checks: any implementation ===================================================


def check_health(t: Target) -> None:
    for service in ["", *sorted(t.services & {ENV, REWARD})]:
        reply = t.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=t.timeout_s)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, (
            f"health of {service or 'server'}: {reply.status}"
        )


def check_reflection(t: Target) -> None:
    assert t.services & {ENV, REWARD}, f"reflection lists neither {ENV} nor {REWARD}"


def check_list_tasks(t: Target) -> None:
    t.need(ENV)
    names = t.task_names
    assert names, "ListTasks lists no task: an env service serves at least one"
    assert len(set(names)) == len(names), f"ListTasks lists a name twice: {names}"
    for task in t.tasks:
        assert task.name and len(task.name.encode()) <= limits.MAX_TASK_NAME_BYTES, \
            f"task name {task.name!r} is empty or longer than {limits.MAX_TASK_NAME_BYTES} bytes"
        assert task.default_size >= 0 and 0 <= task.default_max_turns <= limits.MAX_TURNS, \
            f"task {task.name!r}: negative size or a turn limit outside 0..{limits.MAX_TURNS}"


def check_open_observation(t: Target) -> None:
    task = t.core_task()
    ep = t.open(spec(task=task, seed=1_000_007)).episodes[0]
    assert ep.episode_id, "empty episode id"
    assert len(ep.episode_id.encode()) <= limits.MAX_EPISODE_ID_BYTES, \
        f"episode id longer than {limits.MAX_EPISODE_ID_BYTES} bytes"
    obs = ep.observation
    assert obs.text, "observation has no text"
    assert obs.turn == 0 and not obs.done, "a new episode must be at turn 0 and not done"
    assert ep.state.turns == 0 and not ep.state.done, "a new episode's state must be fresh"
    _check_observation(obs, "first observation")
    no_image = t.open(spec(task=task, seed=1_000_007), image=False).episodes[0].observation
    assert not no_image.image.png, "include_image=false still sent a PNG"
    assert no_image.text == obs.text, "include_image changed the observation text"
    t.close_episodes(ep.episode_id)


def check_determinism(t: Target) -> None:
    task = t.core_task()
    a, b = t.open(spec(task=task, seed=1_000_011), spec(task=task, seed=1_000_011)).episodes
    assert a.episode_id != b.episode_id, "two episodes share an id"
    assert a.observation.text == b.observation.text, "the same spec gave different text"
    assert a.observation.image.sha256 == b.observation.image.sha256, \
        "the same spec gave different pictures"
    ra, rb = t.step(a.episode_id, "hello", image=True), t.step(b.episode_id, "hello", image=True)
    assert (ra.observation.text, ra.reward, ra.parsed, ra.action) == \
        (rb.observation.text, rb.reward, rb.parsed, rb.action), \
        "the same text on the same spec gave different results"
    t.close_episodes(a.episode_id, b.episode_id)


def check_turns_and_step_after_done(t: Target) -> None:
    task = t.core_task()
    ep = t.open(spec(task=task, seed=1_000_013, max_turns=3)).episodes[0]
    results = []
    for text in ["", "hello", "x" * 100]:
        result = t.step(ep.episode_id, text)
        results.append(result)
        assert result.episode_id == ep.episode_id, "a result names another episode"
        assert result.observation.turn == len(results), "turns are not counted one per step"
        assert result.state.turns == len(results), "state.turns disagrees with the turn"
        assert math.isfinite(result.reward), "a step reward that is not a finite number"
        _check_observation(result.observation, f"step {len(results)}")
        if result.observation.done:
            break
    last = results[-1]
    assert last.observation.done and last.state.done, "max_turns=3 did not end the episode"
    if last.observation.truncated:
        assert len(results) == 3, "truncated before the turn limit"
    expect_code(grpc.StatusCode.FAILED_PRECONDITION, lambda: t.step(ep.episode_id, "again"),
                "step after done")


def check_close(t: Target) -> None:
    task = t.core_task()
    ep = t.open(spec(task=task, seed=1_000_017, max_turns=5)).episodes[0]
    t.step(ep.episode_id, "hello")
    closed = t.close_episodes(ep.episode_id)
    assert [e.episode_id for e in closed.episodes] == [ep.episode_id]
    assert closed.episodes[0].state.turns == 1, "closed episode lost its state"
    again = t.close_episodes(ep.episode_id)
    assert list(again.not_found) == [ep.episode_id], "a closed id was not reported not_found"
    expect_code(grpc.StatusCode.NOT_FOUND, lambda: t.step(ep.episode_id, "x"), "step closed")


def check_batch_all_or_nothing(t: Target) -> None:
    task = t.core_task()
    ep = t.open(spec(task=task, seed=1_000_019, max_turns=5)).episodes[0]
    unknown = env_pb2.StepRequest(actions=[
        env_pb2.Action(episode_id=ep.episode_id, text="hello"),
        env_pb2.Action(episode_id="no-such-episode", text="hello"),
    ])
    expect_code(grpc.StatusCode.NOT_FOUND, lambda: t.env.Step(unknown, timeout=t.timeout_s),
                "Step batch with an unknown id")
    twice = env_pb2.StepRequest(actions=[
        env_pb2.Action(episode_id=ep.episode_id, text="hello"),
        env_pb2.Action(episode_id=ep.episode_id, text="hello"),
    ])
    expect_code(grpc.StatusCode.INVALID_ARGUMENT, lambda: t.env.Step(twice, timeout=t.timeout_s),
                "Step batch naming one episode twice")
    result = t.step(ep.episode_id, "hello")
    assert result.observation.turn == 1, "a refused batch still stepped an episode"
    expect_code(grpc.StatusCode.NOT_FOUND,
                lambda: t.open(spec(task=task), common_pb2.TaskSpec(task="no-such-task")),
                "Open batch with an unknown task")
    t.close_episodes(ep.episode_id)


def check_env_errors(t: Target) -> None:
    task = t.core_task()
    bad = {
        "unknown task": (common_pb2.TaskSpec(task="no-such-task"), grpc.StatusCode.NOT_FOUND),
        "negative seed": (spec(task=task, seed=-1), grpc.StatusCode.INVALID_ARGUMENT),
        "huge seed": (spec(task=task, seed=2**62), grpc.StatusCode.INVALID_ARGUMENT),
        "negative turns": (spec(task=task, max_turns=-1), grpc.StatusCode.INVALID_ARGUMENT),
        "too many turns": (spec(task=task, max_turns=limits.MAX_TURNS + 1),
                           grpc.StatusCode.INVALID_ARGUMENT),
        "negative turn margin": (spec(task=task, turn_margin=-1),
                                 grpc.StatusCode.INVALID_ARGUMENT),
    }
    for what, (task_spec, code) in bad.items():
        expect_code(code, lambda task_spec=task_spec: t.open(task_spec), what)
    expect_code(grpc.StatusCode.INVALID_ARGUMENT, lambda: t.open(), "empty Open batch")
    expect_code(grpc.StatusCode.INVALID_ARGUMENT,
                lambda: t.env.Step(env_pb2.StepRequest(), timeout=t.timeout_s), "empty Step batch")
    expect_code(grpc.StatusCode.INVALID_ARGUMENT,
                lambda: t.env.Close(env_pb2.CloseRequest(), timeout=t.timeout_s),
                "empty Close batch")
    expect_code(grpc.StatusCode.NOT_FOUND, lambda: t.step("nope", "x"), "unknown episode")


def check_message_sizes(t: Target) -> None:
    """Each bound holds at its limit and is enforced one past it."""
    task = t.core_task()
    n = limits.MAX_BATCH
    try:
        opened = t.open(*[spec(task=task, seed=1_000_100 + i, max_turns=5) for i in range(n)],
                        image=False)
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, \
            f"an Open batch of {n} (the bound) was refused: {err.code().name}"
        opened = None
    if opened is not None:
        ids = [e.episode_id for e in opened.episodes]
        assert len(ids) == n, f"an Open batch of {n} opened {len(ids)} episodes"
        step = env_pb2.StepRequest(actions=[env_pb2.Action(episode_id=i, text="x") for i in ids])
        stepped = t.env.Step(step, timeout=t.batch_timeout_s).results
        assert len(stepped) == n, f"a Step batch of {n} failed"
        assert len(t.close_episodes(*ids).episodes) == n, f"a Close batch of {n} failed"
    expect_code(grpc.StatusCode.INVALID_ARGUMENT,
                lambda: t.open(*[spec(task=task)] * (n + 1), image=False),
                f"Open batch of {n + 1}")
    expect_code(grpc.StatusCode.INVALID_ARGUMENT,
                lambda: t.env.Step(env_pb2.StepRequest(actions=[
                    env_pb2.Action(episode_id=f"e{i}", text="x") for i in range(n + 1)]),
                    timeout=t.batch_timeout_s), f"Step batch of {n + 1}")
    expect_code(grpc.StatusCode.INVALID_ARGUMENT,
                lambda: t.close_episodes(*[f"e{i}" for i in range(n + 1)]),
                f"Close batch of {n + 1}")
    ep = t.open(spec(task=task, seed=1_000_023, max_turns=5)).episodes[0]
    at_bound = t.step(ep.episode_id, "x" * limits.MAX_ACTION_TEXT_BYTES)
    assert at_bound.observation.turn == 1, "an action text of exactly 8 KiB was not taken"
    expect_code(grpc.StatusCode.INVALID_ARGUMENT,
                lambda: t.step(ep.episode_id, "x" * (limits.MAX_ACTION_TEXT_BYTES + 1)),
                "action text one byte over 8 KiB")
    expect_code(grpc.StatusCode.INVALID_ARGUMENT,
                lambda: t.step(ep.episode_id, "é" * (limits.MAX_ACTION_TEXT_BYTES // 2 + 1)),
                "action text over 8 KiB in UTF-8 bytes (fewer characters)")
    name = "t" * limits.MAX_TASK_NAME_BYTES
    expect_code(grpc.StatusCode.NOT_FOUND, lambda: t.open(common_pb2.TaskSpec(task=name)),
                "a task name of exactly 64 bytes (unknown)")
    expect_code(grpc.StatusCode.INVALID_ARGUMENT,
                lambda: t.open(common_pb2.TaskSpec(task=name + "t")), "a task name of 65 bytes")
    t.close_episodes(ep.episode_id)


def check_malformed_bytes(t: Target) -> None:
    methods = ([f"/{ENV}/Open", f"/{ENV}/Step"] if ENV in t.services else []) + \
        ([f"/{REWARD}/Score"] if REWARD in t.services else [])
    if not methods:
        raise Skip("target serves neither contract")
    for method in methods:
        raw = t.channel.unary_unary(method, request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        expect_code(grpc.StatusCode.INVALID_ARGUMENT,
                    lambda raw=raw: raw(b"\xff\xff\xff\xffnot a protobuf", timeout=t.timeout_s),
                    f"malformed protobuf to {method}")


def check_deadline(t: Target) -> None:
    calls = []
    if ENV in t.services and t.task_names:
        task = t.task_names[0]
        calls.append(lambda: t.env.Open(env_pb2.OpenRequest(
            tasks=[spec(task=task)] * 256, include_image=True), timeout=0.0005))
    if REWARD in t.services and t.scored_tasks:
        task = t.scored_tasks[0]
        calls.append(lambda: t.reward.Score(reward_pb2.ScoreRequest(episodes=[
            reward_pb2.EpisodeRecord(task=spec(task=task), actions=["x"] * 10)] * 256),
            timeout=0.0005))
    if not calls:
        raise Skip("no task to call with")
    for call in calls:
        try:
            call()
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, f"got {err.code().name}"
    time.sleep(0.05)
    check_health(t)


def check_reward_info(t: Target) -> None:
    t.need(REWARD)
    info = t.info
    assert info.name and info.version, "reward service must report its name and version"
    assert len(set(info.components)) == len(info.components), "a component is listed twice"


def _score(t: Target, *records: reward_pb2.EpisodeRecord) -> reward_pb2.ScoreResponse:
    return t.reward.Score(reward_pb2.ScoreRequest(episodes=list(records)),
                          timeout=t.deadline(len(records)))


def check_reward_scores(t: Target) -> None:
    t.need(REWARD)
    if not t.scored_tasks:
        raise Skip("the reward service lists no task it scores, and serves no env")
    task = t.scored_tasks[0]
    records = [
        reward_pb2.EpisodeRecord(task=spec(task=task, seed=1_000_031), actions=[]),
        reward_pb2.EpisodeRecord(task=spec(task=task, seed=1_000_031), actions=["hello"]),
        reward_pb2.EpisodeRecord(task=spec(task=task, seed=1_000_037),
                                 actions=["x", "", "y" * 100]),
    ]
    reply = _score(t, *records)
    assert len(reply.scores) == len(records), "one score per episode, in order"
    assert reply.info.name == t.info.name and reply.info.version == t.info.version, \
        "ScoreResponse.info differs from Info"
    declared = set(t.info.components)
    for i, score in enumerate(reply.scores):
        assert math.isfinite(score.reward), f"episode {i}: reward is not a finite number"
        for name, value in score.components.items():
            assert math.isfinite(value), f"episode {i}: component {name} is not finite"
            assert not declared or name in declared, \
                f"episode {i}: component {name!r} is not one of Info.components {declared}"
    again = _score(t, *records)
    assert [s.SerializeToString(deterministic=True) for s in again.scores] == \
        [s.SerializeToString(deterministic=True) for s in reply.scores], \
        "the same episodes scored twice got different scores"


def check_reward_errors(t: Target) -> None:
    t.need(REWARD)
    task = t.scored_tasks[0] if t.scored_tasks else "maze_2d"
    good = reward_pb2.EpisodeRecord(task=spec(task=task), actions=["x"])
    expect_code(grpc.StatusCode.INVALID_ARGUMENT, lambda: _score(t), "empty Score batch")
    expect_code(grpc.StatusCode.NOT_FOUND,
                lambda: _score(t, reward_pb2.EpisodeRecord(task=common_pb2.TaskSpec(
                    task="no-such-task"))), "unknown task")
    expect_code(grpc.StatusCode.INVALID_ARGUMENT,
                lambda: _score(t, reward_pb2.EpisodeRecord(
                    task=spec(task=task), actions=["x"] * (limits.MAX_TURNS + 1))),
                f"{limits.MAX_TURNS + 1} actions")
    expect_code(grpc.StatusCode.INVALID_ARGUMENT,
                lambda: _score(t, reward_pb2.EpisodeRecord(
                    task=spec(task=task), actions=["x" * (limits.MAX_ACTION_TEXT_BYTES + 1)])),
                "an action one byte over 8 KiB")
    expect_code(grpc.StatusCode.INVALID_ARGUMENT,
                lambda: _score(t, *[good] * (limits.MAX_BATCH + 1)),
                f"Score batch of {limits.MAX_BATCH + 1}")
    if t.scored_tasks:
        expect_code(grpc.StatusCode.INVALID_ARGUMENT,
                    lambda: _score(t, reward_pb2.EpisodeRecord(task=spec(task=task, seed=-1))),
                    "negative seed")
    # all or nothing: one bad record fails the whole batch
    expect_code(grpc.StatusCode.NOT_FOUND,
                lambda: _score(t, good, reward_pb2.EpisodeRecord(
                    task=common_pb2.TaskSpec(task="no-such-task"))),
                "Score batch with one unknown task")
    if t.scored_tasks:
        at_bounds = reward_pb2.EpisodeRecord(
            task=spec(task=task), actions=["x" * limits.MAX_ACTION_TEXT_BYTES]
            + ["x"] * (limits.MAX_TURNS - 1))
        assert len(_score(t, at_bounds).scores) == 1, \
            f"{limits.MAX_TURNS} actions, one of exactly 8 KiB, were not scored"


CORE_CHECKS: list[Callable[[Target], None]] = [
    check_health,
    check_reflection,
    check_list_tasks,
    check_open_observation,
    check_determinism,
    check_turns_and_step_after_done,
    check_close,
    check_batch_all_or_nothing,
    check_env_errors,
    check_message_sizes,
    check_malformed_bytes,
    check_deadline,
    check_reward_info,
    check_reward_scores,
    check_reward_errors,
]


# == task checks: the maze (maze_2d, maze_2d_hard) ========================================


def _maze_env(t: Target, task: str) -> int:
    t.need(ENV)
    if task not in t.task_names:
        raise Skip(f"the env does not list {task}")
    return MAZE_TASKS[task].size


def maze_observation(t: Target, task: str) -> None:
    size = _maze_env(t, task)
    ep = t.open(spec(task=task)).episodes[0]
    image = ep.observation.image
    assert image.png.startswith(PNG_MAGIC), "a maze observation is a PNG"
    assert (image.width, image.height) == (size * 25, size * 25), \
        f"a {size}x{size} maze at the default 25 px per cell is {size * 25} px square"
    assert ep.state.agent != ep.state.target, "the agent starts off the target"


def maze_determinism(t: Target, task: str) -> None:
    _maze_env(t, task)
    a, b, c = t.open(spec(task=task, seed=11), spec(task=task, seed=11),
                     spec(task=task, seed=12)).episodes
    digest = [hashlib.sha256(e.observation.image.png).hexdigest() for e in (a, b, c)]
    assert digest[0] == digest[1], "the same seed gave different pictures"
    assert a.state.agent == b.state.agent and a.state.target == b.state.target
    size = MAZE_TASKS[task].size
    layout = generate_layout(11, size)
    assert (a.state.agent.row, a.state.agent.col) == layout.agent, \
        "seed 11 does not start where VisGym's maze for seed 11 starts"


def maze_garbage_text(t: Target, task: str) -> None:
    _maze_env(t, task)
    ep = t.open(spec(task=task)).episodes[0]
    for text in ["", "hello", "('move', 9)", "\x00\x01\xff" * 10, "<action>jump</action>"]:
        result = t.step(ep.episode_id, text)
        assert not result.parsed, f"{text!r} was taken as an action"
        assert result.observation.feedback, f"no feedback for {text!r}"
        assert result.reward == 0.0


def maze_oracle_solves(t: Target, task: str) -> None:
    size = _maze_env(t, task)
    seed = 21
    ep = t.open(spec(task=task, seed=seed, max_turns=limits.MAX_TURNS)).episodes[0]
    texts = [format_action(a, ActionFormat.LITERAL)
             for a in oracle_actions(generate_layout(seed, size))]
    result = None
    for text in texts:
        result = t.step(ep.episode_id, text)
        assert result.parsed, f"{text!r} was not read as an action"
    assert result is not None and result.observation.done, "oracle episode did not end"
    assert result.state.solved and result.reward == 1.0, "oracle did not solve with reward 1"
    assert result.state.turns == len(texts), "the oracle's turns are not counted"
    expect_code(grpc.StatusCode.FAILED_PRECONDITION,
                lambda: t.step(ep.episode_id, texts[-1]), "step after done")


def maze_turn_limit(t: Target, task: str) -> None:
    _maze_env(t, task)
    ep = t.open(spec(task=task, max_turns=3)).episodes[0]
    results = [t.step(ep.episode_id, "no action here") for _ in range(3)]
    assert [r.observation.turn for r in results] == [1, 2, 3], "turns are not counted"
    assert results[-1].observation.done and results[-1].observation.truncated, (
        "the turn limit did not end the episode as truncated"
    )
    assert MAZE_TASKS[task].max_turns == next(
        x.default_max_turns for x in t.tasks if x.name == task), \
        f"{task}'s default turn limit is VisGym's ({MAZE_TASKS[task].max_turns})"


def maze_spec_errors(t: Target, task: str) -> None:
    _maze_env(t, task)
    bad = {
        "even size": spec(task=task, size=8),
        "huge size": spec(task=task, size=10_001),
        "negative size": spec(task=task, size=-9),
        "huge cell": spec(task=task, render=common_pb2.RenderOptions(cell_px=10_000)),
        # a value of no ActionFormat (e.g. a newer client's): refused, never the default
        "bad format": spec(task=task, format=99),
        "bad layout": spec(task=task, layout=common_pb2.MazeLayout(height=5, width=5,
                                                                   walls=b"\x00")),
    }
    for what, task_spec in bad.items():
        expect_code(grpc.StatusCode.INVALID_ARGUMENT, lambda s=task_spec: t.open(s), what)


def maze_visgym_actions(t: Target, task: str) -> None:
    """The literal format is read as VisGym reads it."""
    _maze_env(t, task)
    ep = t.open(spec(task=task, seed=5)).episodes[0]
    tag = t.step(ep.episode_id, "<action>up</action>")
    assert not tag.parsed, "<action>up</action> is not a Python literal: VisGym refuses it"
    up = t.step(ep.episode_id, "('move', True)")
    assert up.parsed and up.action == "up", "('move', True) is move 1 (up): bool is an int"
    bare = t.step(ep.episode_id, "'move', 0")
    assert bare.parsed and bare.action == "right", "'move', 0 is a tuple: move 0 (right)"
    stop = t.step(ep.episode_id, "('stop', 'ok')")
    assert stop.parsed and stop.observation.done, "('stop', 'ok') ends the episode (Text(4))"
    other = t.open(spec(task=task, seed=5)).episodes[0]
    refused = t.step(other.episode_id, "('stop', 'stop!')")
    assert not refused.parsed and not refused.observation.done, \
        "('stop', 'stop!') is outside Text(4): nothing is executed"


def maze_reward_scores(t: Target, task: str) -> None:
    t.need(REWARD)
    if task not in t.scored_tasks:
        raise Skip(f"the reward service does not list {task}")
    size = MAZE_TASKS[task].size
    seed = 5
    solve = [format_action(a, ActionFormat.LITERAL)
             for a in oracle_actions(generate_layout(seed, size))]
    records = [
        reward_pb2.EpisodeRecord(task=spec(task=task, seed=seed), actions=solve),
        reward_pb2.EpisodeRecord(task=spec(task=task, seed=seed), actions=["('stop', 'stop')"]),
        reward_pb2.EpisodeRecord(task=spec(task=task, seed=seed), actions=solve[:-1]),
        # A lying final state must not turn a non-solve into a solve.
        reward_pb2.EpisodeRecord(task=spec(task=task, seed=seed), actions=["garbage"],
                                 final_state=common_pb2.EpisodeState(solved=True, done=True)),
    ]
    reply = _score(t, *records)
    assert len(reply.scores) == len(records), "one score per episode"
    solved, stopped_early, no_stop, liar = reply.scores
    assert solved.solved and solved.reward > 0, "an oracle solve was not scored as solved"
    for what, score in (("early stop", stopped_early), ("no stop", no_stop), ("liar", liar)):
        assert not score.solved, f"{what} scored as a solve"
        assert score.components.get("task", 0.0) == 0.0, f"{what} got task credit"
        assert score.reward < solved.reward, f"{what} scored as high as a solve"


# Each task check, with the contract it checks.
MAZE_CHECKS: list[tuple[Callable[[Target, str], None], str]] = [
    (maze_observation, ENV),
    (maze_determinism, ENV),
    (maze_garbage_text, ENV),
    (maze_oracle_solves, ENV),
    (maze_turn_limit, ENV),
    (maze_spec_errors, ENV),
    (maze_visgym_actions, ENV),
    (maze_reward_scores, REWARD),
]
# rlfleet's tasks and the checks that hold for each.
TASK_CHECKS: dict[str, list[tuple[Callable[[Target, str], None], str]]] = {
    name: MAZE_CHECKS for name in MAZE_TASKS
}


@dataclass(frozen=True)
class Check:
    """One check: a core check, or a task check bound to a task name and a contract."""

    name: str
    run: Callable[[Target], None]
    task: str = ""
    contract: str = ""


def core_checks() -> list[Check]:
    return [Check(f"core.{fn.__name__.removeprefix('check_')}", fn) for fn in CORE_CHECKS]


def task_checks(task: str) -> list[Check]:
    return [Check(f"{task}.{fn.__name__.removeprefix('maze_')}",
                  lambda t, fn=fn: fn(t, task), task, contract)
            for fn, contract in TASK_CHECKS.get(task, [])]


def all_checks() -> list[Check]:
    """Every check the kit has (core, then each rlfleet task's)."""
    return core_checks() + [c for task in TASK_CHECKS for c in task_checks(task)]


def checks_for(target: Target) -> list[Check]:
    """The core checks, then the task checks of the rlfleet tasks the target lists: env
    checks for the tasks ListTasks lists, reward checks for those RewardInfo lists."""
    listed = {ENV: set(target.task_names),
              REWARD: set(target.scored_tasks) if REWARD in target.services else set()}
    return core_checks() + [c for task in TASK_CHECKS for c in task_checks(task)
                            if task in listed[c.contract]]


def run_check(check: Check | Callable[[Target], None], target: Target) -> CheckResult:
    if not isinstance(check, Check):
        check = Check(check.__name__.removeprefix("check_"), check)
    try:
        check.run(target)
    except Skip as exc:
        return CheckResult(check.name, "skip", str(exc))
    except AssertionError as exc:
        return CheckResult(check.name, "fail", str(exc) or "assertion failed")
    except grpc.RpcError as err:
        return CheckResult(check.name, "fail", f"unexpected {err.code().name}: {err.details()}")
    except Exception as exc:  # noqa: BLE001 - a check that crashes is a failure to report
        return CheckResult(check.name, "fail",
                           "".join(traceback.format_exception_only(exc)).strip())
    return CheckResult(check.name, "pass")


def run_checks(address: str, token: str | None = None,
               timeout_s: float = TIMEOUT_S, tls: dict[str, Any] | None = None
               ) -> list[CheckResult]:
    """Every check that applies to the service at `address`; Unreachable (at once) when
    nothing answers there. `timeout_s`: see Target; `tls`: open_channel's TLS options."""
    target = Target(address, token, timeout_s, tls)
    try:
        target.probe()
        return [run_check(check, target) for check in checks_for(target)]
    finally:
        target.close()


# Kept for callers of the first kit: the core checks as plain functions.
CHECKS = CORE_CHECKS
