"""Item 8: property-based fuzzing (hypothesis) of every gRPC method of every service, on real
processes: malformed bytes, oversized messages and out-of-range fields.

Every answer must be a proper status for a client mistake (OK, INVALID_ARGUMENT,
NOT_FOUND, FAILED_PRECONDITION, OUT_OF_RANGE, RESOURCE_EXHAUSTED), never UNKNOWN, INTERNAL
or UNAVAILABLE, never a hang; afterwards every service is healthy, answers a normal call,
and holds no leftover episodes or groups. Garbage model output never breaks an episode.
Paths outside the runs root are refused on Publish and for checkpoints (`..`, absolute,
symlinks).

Example counts are bounded so the module runs in about two minutes; the examples are
derandomized (the same every run) unless RLFLEET_FUZZ_RANDOM=1.
"""

from __future__ import annotations

import collections
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rlfleet import limits
from rlfleet.fleet import AdapterDirectory, connect, keys
from rlfleet.local.procs import ProcessGroup
from rlfleet.rpc.client import open_channel
from rlfleet.rpc.health import check
from rlfleet.storage import PathOutsideRunsRoot, RunsRoot, publish_adapter_dir
from rlfleet.v1 import (
    common_pb2,
    env_pb2,
    env_pb2_grpc,
    reward_pb2,
    rollout_pb2,
    sync_pb2,
)
from tests.factories import adapter_files
from tests.reliability.conftest import METHODS, Fleet, metric_value, wait_until
from tests.waits import SCALE

SC = grpc.StatusCode
CLIENT_MISTAKE = {SC.OK, SC.INVALID_ARGUMENT, SC.NOT_FOUND, SC.FAILED_PRECONDITION,
                  SC.OUT_OF_RANGE, SC.RESOURCE_EXHAUSTED}
RUN = "fz"
# Every test here adds to TRIED and the last one checks it covers every method: the module
# runs on one xdist worker, in order (and shares its services through module fixtures).
pytestmark = pytest.mark.xdist_group("fuzz")

TRIED: collections.Counter[str] = collections.Counter()
CODES: collections.Counter[tuple[str, str]] = collections.Counter()

def fuzz(n: int):  # noqa: ANN201
    return settings(max_examples=n, deadline=None, database=None,
                    derandomize=os.environ.get("RLFLEET_FUZZ_RANDOM") != "1",
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.large_base_example,
                                           HealthCheck.function_scoped_fixture])


@dataclass
class Target:
    fleet: Fleet
    channels: dict[str, grpc.Channel] = field(default_factory=dict)
    opened: list[str] = field(default_factory=list)  # env episodes the fuzzer opened

    def address(self, method: str) -> str:
        service = method.split("/")[0]
        if service in ("EnvService", "RewardService"):
            return self.fleet.env.address or ""
        if service == "RolloutService":
            return self.fleet.replicas["rz"].address or ""
        return self.fleet.sync.address or ""

    def channel(self, address: str) -> grpc.Channel:
        if address not in self.channels:
            self.channels[address] = grpc.insecure_channel(address, options=[
                ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)])
        return self.channels[address]

    def raw(self, method: str, payload: bytes, timeout_s: float = 60) -> tuple[SC, str]:
        """Sends `payload` as the request bytes of `method`; (code, details)."""
        _, _, streaming = METHODS[method]
        channel = self.channel(self.address(method))
        path = f"/rlfleet.v1.{method}"
        try:
            if streaming:
                for _ in channel.unary_stream(path)(payload, timeout=timeout_s):
                    pass
            else:
                channel.unary_unary(path)(payload, timeout=timeout_s)
        except grpc.RpcError as err:
            return err.code(), err.details() or ""
        return SC.OK, ""

    def call(self, method: str, request: object, timeout_s: float = 60) -> tuple[SC, object]:
        stub_cls, _, streaming = METHODS[method]
        stub = stub_cls(self.channel(self.address(method)))
        fn = getattr(stub, method.split("/")[1])
        try:
            reply = list(fn(request, timeout=timeout_s)) if streaming else fn(
                request, timeout=timeout_s)
        except grpc.RpcError as err:
            return err.code(), err.details()
        return SC.OK, reply


def expect_client_status(method: str, code: SC, details: object,
                         also: frozenset[SC] = frozenset()) -> None:
    TRIED[method] += 1
    CODES[(method, code.name)] += 1
    assert code in CLIENT_MISTAKE | also, f"{method} answered {code.name}: {details}"
    # an error message that quotes oversized input must not outgrow the trailer limits
    # (the client would see RESOURCE_EXHAUSTED instead of the real answer)
    assert "metadata size" not in str(details), f"{method}: {details}"


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Target]:
    tmp = tmp_path_factory.mktemp("fuzz")
    procs = ProcessGroup(tmp / "logs", wait_scale=SCALE)
    root = RunsRoot(tmp / "runs")
    root.root.mkdir(parents=True)
    for v in (1, 2):
        publish_adapter_dir(root, RUN, v, adapter_files(v), base_model="tiny", step=v)
    fleet = Fleet(procs, root, RUN, tiny_model_dir)
    try:
        fleet.start_redis()
        fleet.start_env()
        fleet.start_sync()
        fleet.start_replicas(["rz"], "--adapter-wait-s", "0.1", "--max-groups", "4",
                             fleet_store=False)
        t = Target(fleet)
        yield t
        for channel in t.channels.values():
            channel.close()
    finally:
        fleet.close()


# -- strategies ---------------------------------------------------------------------------

i32 = st.integers(-2**31, 2**31 - 1)
i64 = st.integers(-2**63, 2**63 - 1)
text = st.text(max_size=40)
long_text = st.one_of(text, st.text(min_size=60, max_size=400),
                      st.sampled_from(["x" * 129, "y" * 8193, "é" * 4097]))
bad_paths = st.sampled_from(["..", "../..", "../../etc/passwd", "/etc/passwd", "/", "//x",
                             "fz/adapters/v000001/../../..", "fz/../../x", "fz\x00/a",
                             "\\\\server\\share", "~/x", "fz/adapters/v000001",
                             "fz/adapters/v000002", "a" * 300, "fz/" + "b" * 1100])


def or_invalid(valid: st.SearchStrategy, invalid: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(valid, invalid)


points = st.builds(common_pb2.Point, row=or_invalid(st.integers(-1, 10), i32),
                   col=or_invalid(st.integers(-1, 10), i32))


BAD_TASK_FIELDS = {
    "task": st.one_of(st.sampled_from(["", "nope", "maze_2d ", "MAZE_2D"]), long_text),
    "seed": st.one_of(st.integers(-2**63, -1), st.integers(limits.MAX_SEED + 1, 2**63 - 1)),
    "size": st.one_of(st.sampled_from([1, 2, 4, 6, 64, 65, 99]), i32),
    "max_turns": st.one_of(st.integers(-2**31, -1), st.integers(limits.MAX_TURNS + 1,
                                                                2**31 - 1)),
    "cell_px": st.one_of(st.integers(-2**31, -1), st.integers(limits.MAX_CELL_PX + 1,
                                                              2**31 - 1)),
    # numbers of no ActionFormat (proto3 enums are open: any int32 crosses the wire)
    "format": st.one_of(st.integers(-2**31, -1),
                        st.integers(len(common_pb2.ActionFormat.values()), 2**31 - 1)),
    "layout": st.just(None),  # drawn below: a random (mostly broken) explicit layout
}


@st.composite
def task_specs(draw: st.DrawFn, cheap: bool = False, corrupt: int = 2) -> common_pb2.TaskSpec:
    """A valid spec with up to `corrupt` fields made out of range (or none)."""
    spec = common_pb2.TaskSpec(
        task="maze_2d", seed=draw(st.integers(0, 10**6)),
        size=draw(st.sampled_from([0, 5, 7] if cheap else [0, 5, 7, 9, 11])),
        max_turns=draw(st.integers(1, 2) if cheap else st.integers(0, 30)))
    spec.render.cell_px = draw(st.integers(0, 8))
    for name in draw(st.sets(st.sampled_from(sorted(BAD_TASK_FIELDS)), max_size=corrupt)):
        if name == "layout":
            dims = or_invalid(st.sampled_from([5, 7, 9]), i32)
            spec.layout.CopyFrom(common_pb2.MazeLayout(
                height=draw(dims), width=draw(dims), walls=draw(st.binary(max_size=120)),
                agent=draw(points), target=draw(points)))
        elif name == "cell_px":
            spec.render.cell_px = draw(BAD_TASK_FIELDS[name])
        else:
            setattr(spec, name, draw(BAD_TASK_FIELDS[name]))
    return spec


open_requests = st.builds(env_pb2.OpenRequest,
                          tasks=st.one_of(st.lists(task_specs(), max_size=3),
                                          st.just([common_pb2.TaskSpec()] *
                                                  (limits.MAX_BATCH + 1))),
                          include_image=st.booleans())

reward_records = st.builds(
    reward_pb2.EpisodeRecord, task=task_specs(),
    actions=st.one_of(st.lists(long_text, max_size=4),
                      st.just(["up"] * (limits.MAX_TURNS + 1))),
    final_state=st.builds(common_pb2.EpisodeState, turns=i32, done=st.booleans(),
                          solved=st.booleans(), wall_bumps=i32))

BAD_GROUP_FIELDS = {
    "group_size": st.one_of(st.integers(-2**31, 0), st.integers(limits.MAX_GROUP_SIZE + 1,
                                                                2**31 - 1)),
    "temperature": st.one_of(st.floats(width=32).filter(lambda f: not 0 <= f <= 5),
                             st.just(float("nan"))),
    "top_p": st.one_of(st.floats(width=32).filter(lambda f: not 0 <= f <= 1),
                       st.just(float("nan"))),
    "top_k": st.one_of(st.integers(-2**31, -1), st.integers(100_001, 2**31 - 1)),
    "max_new_tokens": st.one_of(st.integers(-2**31, -1),
                                st.integers(limits.MAX_NEW_TOKENS + 1, 2**31 - 1)),
    "min_adapter_version": st.one_of(st.integers(-2**63, -1), st.integers(1, 2**63 - 1)),
    "idempotency_key": st.sampled_from(["", "k" * 129, "é" * 65]),
    "context_mode": st.one_of(st.integers(-2**31, -1),
                              st.integers(len(common_pb2.Context.values()), 2**31 - 1)),
    "task": st.just(None),  # drawn below: a corrupted task spec
}
SAMPLING_FIELDS = {"temperature", "top_p", "top_k", "max_new_tokens"}


@st.composite
def group_requests(draw: st.DrawFn) -> rollout_pb2.GroupRequest:
    """A small valid group (so some really play), with up to 2 fields out of range."""
    request = rollout_pb2.GroupRequest(
        task=draw(task_specs(cheap=True, corrupt=0)), group_size=draw(st.integers(1, 2)),
        sampling=rollout_pb2.SamplingParams(
            temperature=draw(st.floats(0, 2, width=32)), top_p=draw(st.floats(0, 1, width=32)),
            top_k=draw(st.integers(0, 50)), max_new_tokens=draw(st.integers(1, 4)),
            seed=draw(i64)),
        idempotency_key=uuid.uuid4().hex + draw(st.text(max_size=10)),
        include_images=draw(st.booleans()),
        context_mode=draw(st.sampled_from([common_pb2.CONTEXT_UNSPECIFIED,
                                           common_pb2.CONTEXT_FULL,
                                           common_pb2.CONTEXT_LAST_FRAME])))
    for name in draw(st.sets(st.sampled_from(sorted(BAD_GROUP_FIELDS)), max_size=2)):
        if name == "task":
            request.task.CopyFrom(draw(task_specs(cheap=True, corrupt=2)))
        elif name in SAMPLING_FIELDS:
            setattr(request.sampling, name, draw(BAD_GROUP_FIELDS[name]))
        else:
            setattr(request, name, draw(BAD_GROUP_FIELDS[name]))
    return request


adapter_refs = st.builds(
    common_pb2.AdapterRef,
    run=st.one_of(st.sampled_from([RUN, "other", "", ".", "..", "a/b"]), long_text),
    version=or_invalid(st.integers(-1, 4), i64),
    path=st.one_of(st.just(""), bad_paths, text),
    sha256=st.one_of(st.just(""), text, st.text("0123456789abcdef", min_size=64,
                                                max_size=64)))


# -- raw bytes and oversized messages, every method --------------------------------------


def _plausible_long_call(method: str, payload: bytes) -> bool:
    """Random bytes that happen to parse into a valid, long-running request (a real group,
    a long wait) are not client mistakes; the structured tests below cover those."""
    request_cls = METHODS[method][1]
    try:
        msg = request_cls.FromString(payload)
    except Exception:  # noqa: BLE001 - unparseable: exactly what we want to send
        return False
    if method == "RolloutService/RolloutGroup":
        return 1 <= msg.group_size <= limits.MAX_GROUP_SIZE and bool(msg.idempotency_key)
    if method == "SyncService/WaitForReplicas":
        return 1 <= msg.min_replicas <= limits.MAX_REPLICAS and msg.timeout_s > 0.5
    return False


@pytest.mark.parametrize("method", sorted(METHODS))
@fuzz(40)
@given(payload=st.one_of(st.binary(max_size=300),
                         st.binary(min_size=1, max_size=20).map(lambda b: b"\xff" + b)))
def test_malformed_bytes(target: Target, method: str, payload: bytes) -> None:
    assume(not _plausible_long_call(method, payload))
    code, details = target.raw(method, payload)
    expect_client_status(method, code, details)


OVERSIZED = b"\x0a" + b"\x80" * 4 + b"\x00" * (limits.MAX_MESSAGE_BYTES + 16)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_oversized_message(target: Target, method: str) -> None:
    code, details = target.raw(method, OVERSIZED)
    expect_client_status(method, code, details)
    assert code == SC.RESOURCE_EXHAUSTED, details


# -- structured, out-of-range messages ---------------------------------------------------


@fuzz(150)
@given(request=open_requests)
def test_env_open(target: Target, request: env_pb2.OpenRequest) -> None:
    code, reply = target.call("EnvService/Open", request)
    expect_client_status("EnvService/Open", code, reply)
    if code == SC.OK:
        target.opened += [e.episode_id for e in reply.episodes]


def _episode(target: Target) -> str:
    code, reply = target.call("EnvService/Open", env_pb2.OpenRequest(
        tasks=[common_pb2.TaskSpec(task="maze_2d", seed=5, size=7, max_turns=1000)]))
    assert code == SC.OK
    target.opened.append(reply.episodes[0].episode_id)
    return reply.episodes[0].episode_id


@fuzz(150)
@given(data=st.data())
def test_env_step(target: Target, data: st.DataObject) -> None:
    live = _episode(target)
    ids = st.one_of(st.just(live), long_text, st.just(live + "x"))
    actions = data.draw(st.lists(st.builds(env_pb2.Action, episode_id=ids, text=long_text),
                                 max_size=3))
    request = env_pb2.StepRequest(actions=actions, include_image=data.draw(st.booleans()))
    code, reply = target.call("EnvService/Step", request)
    expect_client_status("EnvService/Step", code, reply)


@fuzz(120)
@given(texts=st.lists(st.one_of(st.text(max_size=200), st.binary(max_size=200).map(
    lambda b: b.decode("latin-1")), st.sampled_from(["", "\x00", "stop", "<answer>up</answer>",
                                                     "ⓤⓟ", "up" * 2000])),
                      min_size=1, max_size=8))
def test_garbage_model_output_never_breaks_an_episode(target: Target, texts: list[str]) -> None:
    """What a policy might emit, step after step: every step is answered OK until the
    episode ends, and the episode's turn count follows."""
    episode_id = _episode(target)
    for turn, text in enumerate(texts, start=1):
        code, reply = target.call("EnvService/Step", env_pb2.StepRequest(
            actions=[env_pb2.Action(episode_id=episode_id,
                                    text=text[:limits.MAX_ACTION_TEXT_BYTES // 4])]))
        expect_client_status("EnvService/Step", code, reply)
        assert code == SC.OK, reply
        (result,) = reply.results
        assert result.state.turns == turn
        if result.observation.done:
            break


@fuzz(80)
@given(ids=st.one_of(st.lists(long_text, max_size=4),
                     st.just(["x"] * (limits.MAX_BATCH + 1))))
def test_env_close(target: Target, ids: list[str]) -> None:
    code, reply = target.call("EnvService/Close", env_pb2.CloseRequest(episode_ids=ids))
    expect_client_status("EnvService/Close", code, reply)


@fuzz(150)
@given(records=st.one_of(st.lists(reward_records, max_size=3),
                         st.just([reward_pb2.EpisodeRecord()] * (limits.MAX_BATCH + 1))))
def test_reward_score(target: Target, records: list) -> None:
    code, reply = target.call("RewardService/Score", reward_pb2.ScoreRequest(episodes=records))
    expect_client_status("RewardService/Score", code, reply)


@fuzz(100)
@given(request=group_requests())
def test_rollout_group(target: Target, request: rollout_pb2.GroupRequest) -> None:
    code, reply = target.call("RolloutService/RolloutGroup", request)
    expect_client_status("RolloutService/RolloutGroup", code, reply)
    if code == SC.OK:
        assert sorted(t.index for t in reply) == list(range(request.group_size))


@fuzz(150)
@given(ref=adapter_refs)
def test_sync_publish(target: Target, ref: common_pb2.AdapterRef) -> None:
    code, reply = target.call("SyncService/Publish", sync_pb2.PublishRequest(adapter=ref))
    expect_client_status("SyncService/Publish", code, reply)


@fuzz(60)
@given(run=st.one_of(st.sampled_from([RUN, "none", ""]), long_text, bad_paths))
def test_sync_get_latest(target: Target, run: str) -> None:
    code, reply = target.call("SyncService/GetLatest", sync_pb2.GetLatestRequest(run=run))
    expect_client_status("SyncService/GetLatest", code, reply)


@fuzz(100)
@given(request=st.builds(
    sync_pb2.WaitForReplicasRequest,
    run=st.one_of(st.just(RUN), long_text), version=or_invalid(st.integers(0, 3), i64),
    min_replicas=or_invalid(st.integers(1, 3), st.sampled_from([0, -1, 1025, 2**31 - 1])),
    timeout_s=or_invalid(st.floats(0, 0.3), st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).filter(lambda f: not 0 <= f <= 3600),
        st.just(float("nan"))))))
def test_sync_wait_for_replicas(target: Target, request: sync_pb2.WaitForReplicasRequest
                                ) -> None:
    code, reply = target.call("SyncService/WaitForReplicas", request, timeout_s=30)
    # DEADLINE_EXCEEDED is the answer when too few replicas serve within timeout_s
    expect_client_status("SyncService/WaitForReplicas", code, reply,
                         also=frozenset({SC.DEADLINE_EXCEEDED}))
    if code == SC.DEADLINE_EXCEEDED:
        assert "replicas serve" in str(reply)  # the server's answer, not our deadline


@fuzz(100)
@given(replica_id=st.one_of(st.just("r1"), long_text), ref=adapter_refs)
def test_sync_acknowledge(target: Target, replica_id: str, ref: common_pb2.AdapterRef) -> None:
    code, reply = target.call("SyncService/Acknowledge",
                              sync_pb2.AcknowledgeRequest(replica_id=replica_id, adapter=ref))
    expect_client_status("SyncService/Acknowledge", code, reply)


# -- path traversal ------------------------------------------------------------------------


def test_publish_refuses_paths_outside_the_runs_root(target: Target, tmp_path: Path) -> None:
    root = target.fleet.root
    outside = RunsRoot(tmp_path / "outside")
    outside.root.mkdir()
    for run in ("esc", RUN):
        publish_adapter_dir(outside, run, 7, adapter_files(7), base_model="tiny", step=7)
    # a whole run that is a symlink to outside, and one version dir that is
    os.symlink(outside.run_dir("esc"), root.root / "esc")
    os.symlink(outside.adapter_dir(RUN, 7), root.adapters_root(RUN) / "v000007")
    try:
        cases = [(RUN, 1, "../../etc"), (RUN, 1, "/etc/passwd"),
                 (RUN, 1, f"{RUN}/adapters/v000001/../../../.."),
                 (RUN, 7, str(outside.adapter_dir(RUN, 7))),
                 ("esc", 7, ""), ("esc", 7, "esc/adapters/v000007"),
                 (RUN, 7, ""), (RUN, 7, f"{RUN}/adapters/v000007"), ("..", 1, ""),
                 ("/etc", 1, "")]
        for run, version, path in cases:
            code, details = target.call("SyncService/Publish", sync_pb2.PublishRequest(
                adapter=common_pb2.AdapterRef(run=run, version=version, path=path)))
            expect_client_status("SyncService/Publish", code, details)
            assert code == SC.INVALID_ARGUMENT, (run, version, path, code, details)
        code, latest = target.call("SyncService/GetLatest", sync_pb2.GetLatestRequest(run=RUN))
        assert code != SC.OK or latest.version < 7
        # a run whose adapters dir points outside must not stop ckpt-sync rebuilding the
        # others: drop the fleet store's record of RUN and see it re-announced from /shared
        publish_adapter_dir(outside, "esc2", 1, adapter_files(1), base_model="tiny", step=1)
        (root.root / "esc2").mkdir()
        os.symlink(outside.adapters_root("esc2"), root.root / "esc2" / "adapters")
        redis = connect(target.fleet.redis_url)
        redis.delete(keys.latest(RUN))
        wait_until("RUN re-announced by the reconciler",
                   lambda: getattr(AdapterDirectory(redis).latest(RUN), "version", 0) == 2,
                   timeout_s=20)
        assert AdapterDirectory(redis).latest("esc2") is None
    finally:
        (root.root / "esc").unlink()
        (root.adapters_root(RUN) / "v000007").unlink()
        if (root.root / "esc2").exists():
            (root.root / "esc2" / "adapters").unlink()
            (root.root / "esc2").rmdir()


def test_resume_refuses_checkpoints_outside_the_runs_root(tmp_path: Path) -> None:
    from rlfleet.learner_config import FleetConfig, LearnerConfig
    from rlfleet_learner.loop import Learner

    root = RunsRoot(tmp_path / "runs")
    (tmp_path / "elsewhere" / "step_000001").mkdir(parents=True)
    (root.root / "r" / "checkpoints").mkdir(parents=True)
    os.symlink(tmp_path / "elsewhere" / "step_000001",
               root.root / "r" / "checkpoints" / "step_000001")
    cfg = LearnerConfig(run="r", fleet=FleetConfig(runs_root=root.root,
                                                   redis_url="redis://127.0.0.1:1/0"))
    for resume in ("../elsewhere/step_000001", str(tmp_path / "elsewhere" / "step_000001"),
                   "r/checkpoints/step_000001", "r/checkpoints/../../../etc"):
        with pytest.raises(PathOutsideRunsRoot):
            Learner(cfg, resume=resume)


# -- afterwards: healthy, nothing leaked ---------------------------------------------------


def test_services_healthy_and_nothing_leaked_after_fuzzing(target: Target) -> None:
    fleet = target.fleet
    for proc in (fleet.env, fleet.sync, fleet.replicas["rz"]):
        assert proc.alive, proc.log_tail()
        assert check(proc.address or "") == "SERVING"
        log = proc.log_path.read_text()
        assert "unhandled error" not in log and "Traceback" not in log, proc.name
    with open_channel(fleet.env.address or "") as channel:
        env_pb2_grpc.EnvServiceStub(channel).ListTasks(env_pb2.ListTasksRequest(), timeout=5)
    code, reply = target.call("RolloutService/RolloutGroup", rollout_pb2.GroupRequest(
        task=common_pb2.TaskSpec(task="maze_2d", seed=3, size=7, max_turns=2), group_size=2,
        sampling=rollout_pb2.SamplingParams(max_new_tokens=2),
        idempotency_key=uuid.uuid4().hex))
    assert code == SC.OK and len(reply) == 2
    status = target.call("RolloutService/GetStatus", rollout_pb2.StatusRequest())[1]
    assert (status.active_groups, status.active_episodes) == (0, 0)
    for i in range(0, len(target.opened), limits.MAX_BATCH):
        target.call("EnvService/Close", env_pb2.CloseRequest(
            episode_ids=target.opened[i:i + limits.MAX_BATCH]))
    port = fleet.env.extra["metrics_port"]
    wait_until("no open episodes", lambda: metric_value(port, "rlfleet_env_open_episodes") == 0,
               timeout_s=10)
    total = sum(TRIED.values())
    print(f"\nfuzzed {total} requests over {len(METHODS)} methods:")
    for method in sorted(METHODS):
        codes = {c: n for (m, c), n in CODES.items() if m == method}
        print(f"  {method:32s} {TRIED[method]:5d}  {codes}")
    assert set(TRIED) == set(METHODS)
