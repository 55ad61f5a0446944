"""The typed service clients (rlfleet.clients) against real servers over loopback gRPC:
typed results, typed errors (a domain error, a deadline), and the channels' retry policy
(UNAVAILABLE re-sent for idempotent methods, also to the server that replaces one killed
mid-call)."""

from __future__ import annotations

import os
import signal
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from rlfleet.clients import EnvClient, RewardClient, SyncClient
from rlfleet.fleet import ReplicaDirectory, ReplicaInfo, connect
from rlfleet.fleet.adapter_records import acks_channel
from rlfleet.local.procs import Proc, ProcessGroup, free_port, rlfleet_argv
from rlfleet.local.redis import start_redis
from rlfleet.rpc.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    NotFound,
    RpcError,
    Unavailable,
)
from rlfleet.rpc.server import GrpcServer, ServerConfig
from rlfleet.storage import RunsRoot
from rlfleet.v1 import common_pb2, env_pb2, env_pb2_grpc, reward_pb2
from tests.factories import publish_version
from tests.waits import hang_process_group

RUN = "clients"


def _ckptsync(procs: ProcessGroup, redis_url: str, root: Path, port: int, name: str
              ) -> tuple[Proc, int]:
    """`rlfleet ckptsync serve` on `port`; (process, metrics port)."""
    metrics_port = free_port()
    argv = rlfleet_argv("ckptsync", "serve", "--port", str(port), "--metrics-port",
                        str(metrics_port), "--redis-url", redis_url, "--runs-root", str(root))
    return procs.start_service(name, argv, f"127.0.0.1:{port}"), metrics_port


def _calls(metrics_port: int, method: str, code: str) -> float:
    """How many calls of `method` the server ended with `code` (its /metrics)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read()
    total = 0.0
    for line in text.decode().splitlines():
        if line.startswith("rlfleet_grpc_requests_total{") and f'"{method}"' in line \
                and f'"{code}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _wait(what: str, condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout_s / 0.05)):
        if condition():
            return
        done.wait(0.05)
    raise AssertionError(f"not reached in {timeout_s}s: {what}")


def test_env_and_reward_clients_return_typed_results(start_env) -> None:
    proc = start_env()
    env, reward = EnvClient(proc.address), RewardClient(proc.address)
    assert "maze_2d" in [t.name for t in env.tasks()]
    spec = common_pb2.TaskSpec(task="maze_2d", seed=3)
    episodes = env.open([spec, spec])
    assert [type(e) for e in episodes] == [env_pb2.Episode] * 2
    assert len({e.episode_id for e in episodes}) == 2
    results = env.step([env_pb2.Action(episode_id=e.episode_id, text="('move', 0)")
                        for e in episodes])
    assert [r.episode_id for r in results] == [e.episode_id for e in episodes]
    assert all(isinstance(r, env_pb2.StepResult) and r.state.turns == 1 for r in results)
    ids = [e.episode_id for e in episodes]
    closed = env.close_episodes(ids)
    assert sorted(e.episode_id for e in closed.episodes) == sorted(ids)
    assert sorted(env.close_episodes(ids).not_found) == sorted(ids)  # closed: reported
    scored = reward.score([reward_pb2.EpisodeRecord(task=spec, actions=["('move', 0)"])])
    assert isinstance(scored, reward_pb2.ScoreResponse) and len(scored.scores) == 1
    assert scored.info.name == reward.info().name != ""


def test_domain_errors_arrive_as_their_typed_exception(start_env) -> None:
    proc = start_env()
    env, reward = EnvClient(proc.address), RewardClient(proc.address)
    with pytest.raises(NotFound) as err:
        env.open([common_pb2.TaskSpec(task="no_such_task")])
    assert err.value.peer == proc.address
    assert err.value.method == "/rlfleet.v1.EnvService/Open"
    assert "no_such_task" in err.value.message
    with pytest.raises(NotFound):
        env.step([env_pb2.Action(episode_id="never-opened", text="stop")])
    with pytest.raises(NotFound):
        reward.score([reward_pb2.EpisodeRecord(task=common_pb2.TaskSpec(task="no_such_task"),
                                               actions=["stop"])])
    done = env.open([common_pb2.TaskSpec(task="maze_2d", seed=1, max_turns=1)])[0]
    env.step([env_pb2.Action(episode_id=done.episode_id, text="stop")])
    with pytest.raises(FailedPrecondition):  # a step after done
        env.step([env_pb2.Action(episode_id=done.episode_id, text="stop")])


def test_a_deadline_fires_as_the_typed_error(start_env, procs: ProcessGroup) -> None:
    proc = start_env()
    env = EnvClient(proc.address, timeout_s=1.0)
    assert env.tasks()  # connected
    hang_process_group(proc.popen.pid)  # hung: holds its socket, never answers
    try:
        with pytest.raises(DeadlineExceeded) as err:
            env.tasks()
        assert isinstance(err.value, RpcError) and err.value.peer == proc.address
    finally:
        os.killpg(proc.popen.pid, signal.SIGCONT)
    assert env.tasks()  # and the same client works again


def test_idempotent_calls_are_resent_on_unavailable(procs: ProcessGroup, tmp_path: Path
                                                   ) -> None:
    _, redis_url = start_redis(procs)
    root = RunsRoot(tmp_path)
    sync_proc, metrics_port = _ckptsync(procs, redis_url, root.root, free_port(), "ckptsync")
    client = SyncClient(sync_proc.address, timeout_s=60)
    with pytest.raises(NotFound):  # a domain error: answered once, never re-sent
        client.latest(RUN)
    assert _calls(metrics_port, "GetLatest", "NOT_FOUND") == 1
    manifest = publish_version(root, RUN, 1)
    published = client.publish(RUN, 1)
    assert published.adapter.sha256 == manifest.manifest_sha256
    # Redis turns read-only (a replica of a master that is not there): ckpt-sync answers
    # UNAVAILABLE to every write, naming the cause
    connect(redis_url).replicaof("127.0.0.1", free_port())
    with pytest.raises(Unavailable) as err:
        client.acknowledge("r1", published.adapter)
    assert "read-only" in err.value.message
    # the channel's retry policy sent it max_attempts times, each answered UNAVAILABLE
    attempts = client.transport.policy.max_attempts
    assert attempts > 1
    assert _calls(metrics_port, "Acknowledge", "UNAVAILABLE") == attempts
    with pytest.raises(Unavailable):  # a client that does not retry sends it once
        SyncClient(sync_proc.address, max_attempts=1).acknowledge("r1", published.adapter)
    assert _calls(metrics_port, "Acknowledge", "UNAVAILABLE") == attempts + 1


def test_a_call_survives_its_server_being_killed_mid_call(procs: ProcessGroup, tmp_path: Path
                                                         ) -> None:
    """Two ckpt-sync servers behind one gRPC target (a Service whose pod is replaced): a
    WaitForReplicas in flight on the first when it is SIGKILLed is re-sent by the retry
    policy, lands on the second, and returns there."""
    _, redis_url = start_redis(procs)
    redis = connect(redis_url)
    first_port, second_port = free_port(), free_port()
    first, _ = _ckptsync(procs, redis_url, tmp_path, first_port, "ckptsync-1")
    target = f"ipv4:127.0.0.1:{first_port},127.0.0.1:{second_port}"
    client = SyncClient(target, timeout_s=60)
    result: dict = {}

    def wait() -> None:
        try:
            result["reply"] = client.wait_for_replicas(RUN, 1, min_replicas=1, timeout_s=60)
        except RpcError as exc:
            result["error"] = exc

    def waiting_servers() -> int:  # WaitForReplicas subscribes to the run's acks
        return redis.pubsub_numsub(acks_channel(RUN))[0][1]

    waiter = threading.Thread(target=wait)
    waiter.start()
    # the call is on the first server: the second one does not exist yet
    _wait("the call waiting on the first server", lambda: waiting_servers() == 1)
    _ckptsync(procs, redis_url, tmp_path, second_port, "ckptsync-2")
    procs.kill(first)  # the connection breaks under the call: UNAVAILABLE, re-sent
    ReplicaDirectory(redis).heartbeat(ReplicaInfo("r1", "127.0.0.1:1", run=RUN,
                                                  adapter_version=1), 30)
    waiter.join(60)
    assert not waiter.is_alive()
    assert "error" not in result, result.get("error")
    assert result["reply"].replicas == 1 and list(result["reply"].replica_ids) == ["r1"]


class _Relay(env_pb2_grpc.EnvServiceServicer):
    """An env front that opens episodes on a real env service and lets its client's
    error escape (as a handler that does not catch it would)."""

    def __init__(self, upstream: EnvClient) -> None:
        self.upstream = upstream

    def Open(self, request, context):  # noqa: N802, ANN001, ANN201
        return env_pb2.OpenResponse(episodes=self.upstream.open(request.tasks))


def test_a_peers_error_escaping_a_handler_is_unavailable_not_the_peers_code(start_env
                                                                           ) -> None:
    upstream = start_env()
    server = GrpcServer("relay", ServerConfig(port=0, metrics_port=None), [
        lambda s: env_pb2_grpc.add_EnvServiceServicer_to_server(
            _Relay(EnvClient(upstream.address)), s) or EnvClient.SERVICE]).start()
    try:
        relay = EnvClient(server.address)
        assert relay.open([common_pb2.TaskSpec(task="maze_2d", seed=1)])
        # the upstream's NOT_FOUND is not the relay's own answer: the relay cannot answer
        with pytest.raises(Unavailable) as err:
            relay.open([common_pb2.TaskSpec(task="no_such_task")])
        assert "a peer service failed: NOT_FOUND" in err.value.message
    finally:
        server.stop(0)
