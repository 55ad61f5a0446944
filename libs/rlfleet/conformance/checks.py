"""The conformance checks. Each check takes a Target and raises AssertionError (with a
message) when the service misbehaves.

What is checked: health and reflection; the env contract's behaviours (open, step, close,
determinism, feedback on garbage text, turn accounting); its errors (unknown task and
episode, out-of-range values, oversized text and batches, step after done, malformed
bytes); deadlines (a too-short deadline ends the call, the service stays healthy); the
reward contract (name/version, true solve scored as solved, format credit never counted
as a solve, replay ignores client-side state). Checks of a contract the target does not
serve are skipped and reported as such.
"""

from __future__ import annotations

import hashlib
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rlfleet import limits
from rlfleet.maze.actions import ActionFormat, format_action
from rlfleet.maze.generate import generate_layout
from rlfleet.maze.oracle import oracle_actions
from rlfleet.rpc.client import open_channel
from rlfleet.v1 import common_pb2, env_pb2, env_pb2_grpc, reward_pb2, reward_pb2_grpc

ENV = "rlfleet.v1.EnvService"
REWARD = "rlfleet.v1.RewardService"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TIMEOUT_S = 10.0


class Skip(Exception):
    """The target does not serve what this check needs."""


@dataclass
class CheckResult:
    name: str
    outcome: str  # "pass", "fail", "skip"
    detail: str = ""


class Target:
    def __init__(self, address: str, token: str | None = None) -> None:
        self.address = address
        self.channel = open_channel(address, token=token)
        self.env = env_pb2_grpc.EnvServiceStub(self.channel)
        self.reward = reward_pb2_grpc.RewardServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self._services: set[str] | None = None

    @property
    def services(self) -> set[str]:
        if self._services is None:
            stub = reflection_pb2_grpc.ServerReflectionStub(self.channel)
            (reply,) = list(
                stub.ServerReflectionInfo(
                    iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                    timeout=TIMEOUT_S,
                )
            )
            self._services = {s.name for s in reply.list_services_response.service}
        return self._services

    def need(self, service: str) -> None:
        if service not in self.services:
            raise Skip(f"target does not serve {service}")

    def open(self, *specs: common_pb2.TaskSpec, image: bool = True) -> env_pb2.OpenResponse:
        return self.env.Open(env_pb2.OpenRequest(tasks=list(specs), include_image=image),
                             timeout=TIMEOUT_S)

    def step(self, episode_id: str, text: str) -> env_pb2.StepResult:
        reply = self.env.Step(
            env_pb2.StepRequest(actions=[env_pb2.Action(episode_id=episode_id, text=text)]),
            timeout=TIMEOUT_S,
        )
        return reply.results[0]

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


def spec(seed: int = 7, **kw: object) -> common_pb2.TaskSpec:
    return common_pb2.TaskSpec(task="maze_2d", seed=seed, **kw)


# -- health and discovery -------------------------------------------------------------


def check_health(t: Target) -> None:
    for service in ["", *sorted(t.services & {ENV, REWARD})]:
        reply = t.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT_S)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, (
            f"health of {service or 'server'}: {reply.status}"
        )


def check_reflection(t: Target) -> None:
    assert t.services & {ENV, REWARD}, f"reflection lists neither {ENV} nor {REWARD}"


# -- env behaviours -------------------------------------------------------------------


def check_list_tasks(t: Target) -> None:
    t.need(ENV)
    tasks = t.env.ListTasks(env_pb2.ListTasksRequest(), timeout=TIMEOUT_S).tasks
    assert any(task.name == "maze_2d" for task in tasks), "maze_2d not listed"


def check_open_observation(t: Target) -> None:
    t.need(ENV)
    ep = t.open(spec()).episodes[0]
    obs = ep.observation
    assert ep.episode_id, "empty episode id"
    assert obs.image.png.startswith(PNG_MAGIC), "observation image is not a PNG"
    assert obs.text, "observation has no text"
    assert obs.turn == 0 and not obs.done, "a new episode must be at turn 0 and not done"
    no_image = t.open(spec(), image=False).episodes[0].observation
    assert not no_image.image.png, "include_image=false still sent a PNG"


def check_determinism(t: Target) -> None:
    t.need(ENV)
    a, b = t.open(spec(seed=11), spec(seed=11)).episodes
    assert a.episode_id != b.episode_id, "two episodes share an id"
    digest = [hashlib.sha256(e.observation.image.png).hexdigest() for e in (a, b)]
    assert digest[0] == digest[1], "the same seed gave different pictures"
    other = t.open(spec(seed=12)).episodes[0]
    assert other.state.SerializeToString() or other.observation.image.png


def check_garbage_text(t: Target) -> None:
    t.need(ENV)
    ep = t.open(spec()).episodes[0]
    for text in ["", "hello", "('move', 9)", "\x00\x01\xff" * 10, "<action>jump</action>"]:
        result = t.step(ep.episode_id, text)
        assert not result.parsed, f"{text!r} was taken as an action"
        assert result.observation.feedback, f"no feedback for {text!r}"
        assert result.reward == 0.0


def check_solve_and_step_after_done(t: Target) -> None:
    t.need(ENV)
    seed = 21
    ep = t.open(spec(seed=seed)).episodes[0]
    texts = [format_action(a, ActionFormat.LITERAL) for a in oracle_actions(
        generate_layout(seed, 9))]
    result = None
    for text in texts:
        result = t.step(ep.episode_id, text)
    assert result is not None and result.observation.done, "oracle episode did not end"
    assert result.state.solved and result.reward == 1.0, "oracle did not solve with reward 1"
    expect_code(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: t.step(ep.episode_id, texts[-1]),
        "step after done",
    )


def check_turn_limit(t: Target) -> None:
    t.need(ENV)
    ep = t.open(spec(max_turns=3)).episodes[0]
    results = [t.step(ep.episode_id, "no action here") for _ in range(3)]
    assert [r.observation.turn for r in results] == [1, 2, 3], "turns are not counted"
    assert results[-1].observation.done and results[-1].observation.truncated, (
        "the turn limit did not end the episode as truncated"
    )


def check_close(t: Target) -> None:
    t.need(ENV)
    ep = t.open(spec()).episodes[0]
    t.step(ep.episode_id, "('move', 0)")
    closed = t.env.Close(env_pb2.CloseRequest(episode_ids=[ep.episode_id]), timeout=TIMEOUT_S)
    assert [e.episode_id for e in closed.episodes] == [ep.episode_id]
    assert closed.episodes[0].state.turns == 1, "closed episode lost its state"
    again = t.env.Close(env_pb2.CloseRequest(episode_ids=[ep.episode_id]), timeout=TIMEOUT_S)
    assert list(again.not_found) == [ep.episode_id], "a closed id was not reported not_found"
    expect_code(grpc.StatusCode.NOT_FOUND, lambda: t.step(ep.episode_id, "x"), "step closed")


def check_batch_all_or_nothing(t: Target) -> None:
    t.need(ENV)
    ep = t.open(spec()).episodes[0]
    bad = env_pb2.StepRequest(actions=[
        env_pb2.Action(episode_id=ep.episode_id, text="('move', 0)"),
        env_pb2.Action(episode_id="no-such-episode", text="('move', 0)"),
    ])
    expect_code(grpc.StatusCode.NOT_FOUND, lambda: t.env.Step(bad, timeout=TIMEOUT_S),
                "batch with an unknown id")
    result = t.step(ep.episode_id, "nothing")
    assert result.observation.turn == 1, "a failed batch still stepped an episode"


# -- env errors -----------------------------------------------------------------------


def check_env_errors(t: Target) -> None:
    t.need(ENV)
    bad = {
        "unknown task": (common_pb2.TaskSpec(task="no-such-task"), grpc.StatusCode.NOT_FOUND),
        "negative seed": (spec(seed=-1), grpc.StatusCode.INVALID_ARGUMENT),
        "huge seed": (spec(seed=2**62), grpc.StatusCode.INVALID_ARGUMENT),
        "even size": (spec(size=8), grpc.StatusCode.INVALID_ARGUMENT),
        "huge size": (spec(size=10_001), grpc.StatusCode.INVALID_ARGUMENT),
        "negative size": (spec(size=-9), grpc.StatusCode.INVALID_ARGUMENT),
        "negative turns": (spec(max_turns=-1), grpc.StatusCode.INVALID_ARGUMENT),
        "huge cell": (spec(render=common_pb2.RenderOptions(cell_px=10_000)),
                      grpc.StatusCode.INVALID_ARGUMENT),
        "bad format": (spec(action_format="yaml"), grpc.StatusCode.INVALID_ARGUMENT),
        "bad layout": (spec(layout=common_pb2.MazeLayout(height=5, width=5, walls=b"\x00")),
                       grpc.StatusCode.INVALID_ARGUMENT),
    }
    for what, (task, code) in bad.items():
        expect_code(code, lambda task=task: t.open(task), what)
    expect_code(grpc.StatusCode.INVALID_ARGUMENT, lambda: t.open(), "empty Open batch")
    expect_code(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: t.open(*[spec()] * (limits.MAX_BATCH + 1), image=False),
        "oversized Open batch",
    )
    ep = t.open(spec()).episodes[0]
    expect_code(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: t.step(ep.episode_id, "x" * (limits.MAX_ACTION_TEXT_BYTES + 1)),
        "oversized action text",
    )
    expect_code(grpc.StatusCode.NOT_FOUND, lambda: t.step("nope", "x"), "unknown episode")


def check_malformed_bytes(t: Target) -> None:
    t.need(ENV)
    raw = t.channel.unary_unary(
        f"/{ENV}/Open", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    expect_code(grpc.StatusCode.INVALID_ARGUMENT,
                lambda: raw(b"\xff\xff\xff\xffnot a protobuf", timeout=TIMEOUT_S),
                "malformed protobuf")


def check_deadline(t: Target) -> None:
    t.need(ENV)
    try:
        t.env.Open(env_pb2.OpenRequest(tasks=[spec()] * 256, include_image=True), timeout=0.0005)
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, f"got {err.code().name}"
    time.sleep(0.05)
    check_health(t)


# -- reward ---------------------------------------------------------------------------


def check_reward_info(t: Target) -> None:
    t.need(REWARD)
    info = t.reward.Info(reward_pb2.RewardInfoRequest(), timeout=TIMEOUT_S)
    assert info.name and info.version, "reward service must report its name and version"


def check_reward_scores(t: Target) -> None:
    t.need(REWARD)
    seed = 5
    solve = [format_action(a, ActionFormat.LITERAL) for a in oracle_actions(
        generate_layout(seed, 9))]
    records = [
        reward_pb2.EpisodeRecord(task=spec(seed=seed), actions=solve),
        reward_pb2.EpisodeRecord(task=spec(seed=seed), actions=["('stop', 'stop')"]),
        reward_pb2.EpisodeRecord(task=spec(seed=seed), actions=solve[:-1]),
        # A lying final state must not turn a non-solve into a solve.
        reward_pb2.EpisodeRecord(task=spec(seed=seed), actions=["garbage"],
                                 final_state=common_pb2.EpisodeState(solved=True, done=True)),
    ]
    reply = t.reward.Score(reward_pb2.ScoreRequest(episodes=records), timeout=TIMEOUT_S)
    assert len(reply.scores) == len(records), "one score per episode"
    solved, stopped_early, no_stop, liar = reply.scores
    assert solved.solved and solved.reward > 0, "an oracle solve was not scored as solved"
    for what, score in (("early stop", stopped_early), ("no stop", no_stop), ("liar", liar)):
        assert not score.solved, f"{what} scored as a solve"
        assert score.components.get("task", 0.0) == 0.0, f"{what} got task credit"
        assert score.reward < solved.reward, f"{what} scored as high as a solve"
    assert reply.info.name, "ScoreResponse lacks the service's name"


def check_reward_errors(t: Target) -> None:
    t.need(REWARD)
    expect_code(grpc.StatusCode.INVALID_ARGUMENT,
                lambda: t.reward.Score(reward_pb2.ScoreRequest(), timeout=TIMEOUT_S),
                "empty Score batch")
    expect_code(grpc.StatusCode.NOT_FOUND,
                lambda: t.reward.Score(reward_pb2.ScoreRequest(episodes=[
                    reward_pb2.EpisodeRecord(task=common_pb2.TaskSpec(task="nope"))]),
                    timeout=TIMEOUT_S),
                "unknown task")
    expect_code(grpc.StatusCode.INVALID_ARGUMENT,
                lambda: t.reward.Score(reward_pb2.ScoreRequest(episodes=[
                    reward_pb2.EpisodeRecord(task=spec(), actions=["x"] * (limits.MAX_TURNS + 1))
                ]), timeout=TIMEOUT_S),
                "too many actions")


CHECKS: list[Callable[[Target], None]] = [
    check_health,
    check_reflection,
    check_list_tasks,
    check_open_observation,
    check_determinism,
    check_garbage_text,
    check_solve_and_step_after_done,
    check_turn_limit,
    check_close,
    check_batch_all_or_nothing,
    check_env_errors,
    check_malformed_bytes,
    check_deadline,
    check_reward_info,
    check_reward_scores,
    check_reward_errors,
]


def run_check(check: Callable[[Target], None], target: Target) -> CheckResult:
    name = check.__name__.removeprefix("check_")
    try:
        check(target)
    except Skip as exc:
        return CheckResult(name, "skip", str(exc))
    except AssertionError as exc:
        return CheckResult(name, "fail", str(exc) or "assertion failed")
    except grpc.RpcError as err:
        return CheckResult(name, "fail", f"unexpected {err.code().name}: {err.details()}")
    except Exception as exc:  # noqa: BLE001 - a check that crashes is a failure to report
        return CheckResult(name, "fail", "".join(traceback.format_exception_only(exc)).strip())
    return CheckResult(name, "pass")


def run_checks(address: str, token: str | None = None) -> list[CheckResult]:
    target = Target(address, token)
    try:
        return [run_check(check, target) for check in CHECKS]
    finally:
        target.close()
