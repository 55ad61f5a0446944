"""ckpt-sync as a real process with a real Redis and a runs root on disk."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from rlfleet.registry import AdapterRegistry, ReplicaInfo, ReplicaRegistry, connect
from rlfleet.rpc import RpcClient
from rlfleet.storage import RunsRoot, list_versions
from rlfleet.v1 import common_pb2, sync_pb2, sync_pb2_grpc
from tests.factories import publish_version

Sync = sync_pb2_grpc.SyncServiceStub
RUN = "run-a"


def publish(client: RpcClient, version: int, path: str = "", sha: str = ""):  # noqa: ANN201
    return client.call(Sync, "Publish", sync_pb2.PublishRequest(
        adapter=common_pb2.AdapterRef(run=RUN, version=version, path=path, sha256=sha)))


def code_of(fn) -> grpc.StatusCode:  # noqa: ANN001
    with pytest.raises(grpc.RpcError) as err:
        fn()
    assert err.value.details()
    return err.value.code()


@pytest.fixture
def fleet(tmp_path: Path, redis_url: str, start_ckptsync):  # noqa: ANN201
    root = RunsRoot(tmp_path / "runs")
    root.root.mkdir(parents=True, exist_ok=True)
    proc = start_ckptsync(redis_url, root.root, "--keep-last", "2")
    return root, RpcClient(proc.address, timeout_s=10), connect(redis_url), proc


def test_publish_get_latest_and_event(fleet) -> None:
    root, client, redis, _ = fleet
    events = AdapterRegistry(redis).events(RUN, poll_s=0.1)
    next(events)  # subscribed
    manifest = publish_version(root, RUN, 1)
    reply = publish(client, 1, path=f"{RUN}/adapters/v000001")
    assert reply.adapter.sha256 == manifest.manifest_sha256
    latest = client.call(Sync, "GetLatest", sync_pb2.GetLatestRequest(run=RUN))
    assert (latest.version, latest.sha256) == (1, manifest.manifest_sha256)
    got = [e for e in (next(events) for _ in range(20)) if e is not None]
    assert got and got[0].version == 1
    # publishing the same version again is idempotent
    assert publish(client, 1).adapter.version == 1


def test_versions_never_go_backwards(fleet) -> None:
    root, client, _, _ = fleet
    publish_version(root, RUN, 1)
    publish_version(root, RUN, 2)
    publish(client, 2)
    assert code_of(lambda: publish(client, 1)) == grpc.StatusCode.FAILED_PRECONDITION
    assert client.call(Sync, "GetLatest", sync_pb2.GetLatestRequest(run=RUN)).version == 2


def test_bad_publishes_are_refused(fleet) -> None:
    root, client, redis, _ = fleet
    manifest = publish_version(root, RUN, 3)
    weights = root.adapter_dir(RUN, 3) / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert code_of(lambda: publish(client, 3)) == grpc.StatusCode.FAILED_PRECONDITION
    assert AdapterRegistry(redis).latest(RUN) is None  # nothing recorded
    assert code_of(lambda: publish(client, 4)) == grpc.StatusCode.NOT_FOUND
    for path in ("../../etc", "/etc/passwd", f"{RUN}/adapters/v000003/../../.."):
        assert code_of(lambda p=path: publish(client, 3, path=p)) == \
            grpc.StatusCode.INVALID_ARGUMENT
    publish_version(root, RUN, 5)
    assert code_of(lambda: publish(client, 5, sha="0" * 64)) == \
        grpc.StatusCode.FAILED_PRECONDITION
    assert code_of(lambda: client.call(Sync, "GetLatest", sync_pb2.GetLatestRequest(
        run="../x"))) == grpc.StatusCode.INVALID_ARGUMENT
    assert manifest.version == 3


def test_wait_for_replicas_and_acks(fleet) -> None:
    root, client, redis, _ = fleet
    manifest = publish_version(root, RUN, 1)
    publish(client, 1)
    replicas = ReplicaRegistry(redis)
    replicas.heartbeat(ReplicaInfo("r1", "127.0.0.1:1", run=RUN, adapter_version=1), ttl_s=30)
    replicas.heartbeat(ReplicaInfo("r2", "127.0.0.1:2", run=RUN, adapter_version=0), ttl_s=30)
    assert code_of(lambda: client.call(Sync, "WaitForReplicas", sync_pb2.WaitForReplicasRequest(
        run=RUN, version=1, min_replicas=2, timeout_s=0.3))) == grpc.StatusCode.DEADLINE_EXCEEDED
    ack = sync_pb2.AcknowledgeRequest(replica_id="r2", adapter=common_pb2.AdapterRef(
        run=RUN, version=1, sha256=manifest.manifest_sha256))
    client.call(Sync, "Acknowledge", ack)
    replicas.heartbeat(ReplicaInfo("r2", "127.0.0.1:2", run=RUN, adapter_version=1), ttl_s=30)
    reply = client.call(Sync, "WaitForReplicas", sync_pb2.WaitForReplicasRequest(
        run=RUN, version=1, min_replicas=2, timeout_s=5))
    assert reply.replicas == 2 and list(reply.replica_ids) == ["r1", "r2"]
    assert reply.publish_to_live_s >= 0
    wrong = sync_pb2.AcknowledgeRequest(replica_id="r3", adapter=common_pb2.AdapterRef(
        run=RUN, version=1, sha256="f" * 64))
    assert code_of(lambda: client.call(Sync, "Acknowledge", wrong)) == \
        grpc.StatusCode.FAILED_PRECONDITION


def test_redis_flush_is_healed_from_shared(fleet) -> None:
    root, client, redis, _ = fleet
    for v in (1, 2):
        publish_version(root, RUN, v)
        publish(client, v)
    redis.flushall()
    deadline = time.monotonic() + 20
    latest = None
    while time.monotonic() < deadline:
        latest = AdapterRegistry(redis).latest(RUN)
        if latest is not None:
            break
        time.sleep(0.2)
    assert latest is not None and latest.version == 2


def test_restart_rebuilds_state(tmp_path: Path, redis_url: str, start_ckptsync, procs) -> None:
    root = RunsRoot(tmp_path / "runs")
    root.root.mkdir(parents=True)
    for v in (1, 2, 3):
        publish_version(root, RUN, v)
    proc = start_ckptsync(redis_url, root.root)
    client = RpcClient(proc.address)
    assert client.call(Sync, "GetLatest", sync_pb2.GetLatestRequest(run=RUN)).version == 3
    procs.kill(proc)
    connect(redis_url).flushall()
    proc2 = start_ckptsync(redis_url, root.root, name="ckptsync-2")
    reply = RpcClient(proc2.address).call(Sync, "GetLatest", sync_pb2.GetLatestRequest(run=RUN))
    assert reply.version == 3


def test_garbage_collection_keeps_served_and_newest(fleet) -> None:
    root, client, redis, _ = fleet
    ReplicaRegistry(redis).heartbeat(
        ReplicaInfo("r1", "127.0.0.1:1", run=RUN, adapter_version=2), ttl_s=30)
    for v in range(1, 6):
        publish_version(root, RUN, v)
        publish(client, v)
    assert list_versions(root, RUN) == [2, 4, 5]
