"""ckpt-sync as a real process with a real Redis and a runs root on disk."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest

from rlfleet.fleet import (
    AdapterDirectory,
    AdapterRecord,
    ReplicaDirectory,
    ReplicaInfo,
    connect,
)
from rlfleet.fleet.adapter_records import PendingVersion
from rlfleet.rpc import RpcClient
from rlfleet.storage import RunsRoot, list_versions
from rlfleet.v1 import common_pb2, sync_pb2, sync_pb2_grpc
from tests.factories import publish_version
from tests.waits import scaled, wait_until

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
    events = AdapterDirectory(redis).events(RUN, poll_s=0.1, pending=True)
    next(events)  # subscribed
    manifest = publish_version(root, RUN, 1)
    reply = publish(client, 1, path=f"{RUN}/adapters/v000001")
    assert reply.adapter.sha256 == manifest.manifest_sha256
    latest = client.call(Sync, "GetLatest", sync_pb2.GetLatestRequest(run=RUN))
    assert (latest.version, latest.sha256) == (1, manifest.manifest_sha256)
    got = [e for e in (next(events) for _ in range(20)) if e is not None]
    # first the hint that it is being verified, then the announcement with its identity
    assert [type(e) for e in got[:2]] == [PendingVersion, AdapterRecord]
    assert got[0].record.version == 1 and got[0].record.path == f"{RUN}/adapters/v000001"
    assert (got[1].version, got[1].sha256) == (1, manifest.manifest_sha256)
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
    events = AdapterDirectory(redis).events(RUN, poll_s=0.1)
    next(events)  # subscribed
    assert code_of(lambda: publish(client, 3)) == grpc.StatusCode.FAILED_PRECONDITION
    assert AdapterDirectory(redis).latest(RUN) is None  # nothing recorded
    assert [e for e in (next(events) for _ in range(5)) if e is not None] == []  # nor announced
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
    replicas = ReplicaDirectory(redis)
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
    deadline = time.monotonic() + scaled(20)
    latest = None
    while time.monotonic() < deadline:
        latest = AdapterDirectory(redis).latest(RUN)
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


def _wait_versions(root: RunsRoot, want: list[int]) -> list[int]:
    deadline = time.monotonic() + scaled(30)  # a loaded machine sweeps later, not never
    while list_versions(root, RUN) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    return list_versions(root, RUN)


def test_garbage_collection_keeps_served_and_newest(tmp_path: Path, redis_url: str,
                                                    start_ckptsync) -> None:
    # No replica acknowledges here: old versions go when the fallback delay has passed.
    root = RunsRoot(tmp_path / "runs")
    root.root.mkdir(parents=True)
    proc = start_ckptsync(redis_url, root.root, "--keep-last", "2", "--gc-delay-s", "0.5")
    client, redis = RpcClient(proc.address, timeout_s=10), connect(redis_url)
    ReplicaDirectory(redis).heartbeat(
        ReplicaInfo("r1", "127.0.0.1:1", run=RUN, adapter_version=2), ttl_s=30)
    for v in range(1, 6):
        publish_version(root, RUN, v)
        publish(client, v)
    assert _wait_versions(root, [2, 4, 5]) == [2, 4, 5]
    # the history entry goes right after the files (a removal that fails keeps both)
    wait_until("the removed versions' history entries gone",
               lambda: [r.version for r in AdapterDirectory(redis).history(RUN)] == [2, 4, 5],
               timeout_s=10)


def test_garbage_collection_once_every_replica_has_moved(tmp_path: Path, redis_url: str,
                                                        start_ckptsync) -> None:
    # The fallback is an hour away: only the last acknowledgement can start it.
    root = RunsRoot(tmp_path / "runs")
    root.root.mkdir(parents=True)
    proc = start_ckptsync(redis_url, root.root, "--keep-last", "2", "--gc-delay-s", "3600")
    client, redis = RpcClient(proc.address, timeout_s=10), connect(redis_url)
    replicas = ReplicaDirectory(redis)
    for v in range(1, 5):
        manifest = publish_version(root, RUN, v)
        publish(client, v)
    ack = sync_pb2.AcknowledgeRequest(replica_id="r1", adapter=common_pb2.AdapterRef(
        run=RUN, version=4, sha256=manifest.manifest_sha256))
    replicas.heartbeat(ReplicaInfo("r1", "127.0.0.1:1", run=RUN, adapter_version=4), 30)
    replicas.heartbeat(ReplicaInfo("r2", "127.0.0.1:2", run=RUN, adapter_version=1), 30)
    client.call(Sync, "Acknowledge", ack)
    time.sleep(1.0)  # r2 still serves 1: nothing may go yet
    assert list_versions(root, RUN) == [1, 2, 3, 4]
    replicas.heartbeat(ReplicaInfo("r2", "127.0.0.1:2", run=RUN, adapter_version=4), 30)
    client.call(Sync, "Acknowledge", sync_pb2.AcknowledgeRequest(
        replica_id="r2", adapter=ack.adapter))
    assert _wait_versions(root, [3, 4]) == [3, 4]


def test_wait_for_replicas_wakes_on_acknowledgements(fleet) -> None:
    root, client, redis, _ = fleet
    manifest = publish_version(root, RUN, 1)
    publish(client, 1)
    replicas = ReplicaDirectory(redis)
    for rid in ("r1", "r2"):
        replicas.heartbeat(ReplicaInfo(rid, "127.0.0.1:1", run=RUN, adapter_version=0), 30)
    result: dict = {}

    def wait() -> None:
        result["reply"] = client.call(Sync, "WaitForReplicas", sync_pb2.WaitForReplicasRequest(
            run=RUN, version=1, min_replicas=2, timeout_s=60), timeout_s=70)

    waiter = threading.Thread(target=wait)
    waiter.start()
    for rid in ("r1", "r2"):  # what a replica does once live: heartbeat, then acknowledge
        replicas.heartbeat(ReplicaInfo(rid, "127.0.0.1:1", run=RUN, adapter_version=1), 30)
        client.call(Sync, "Acknowledge", sync_pb2.AcknowledgeRequest(
            replica_id=rid, adapter=common_pb2.AdapterRef(
                run=RUN, version=1, sha256=manifest.manifest_sha256)))
    waiter.join(70)
    reply = result["reply"]
    assert reply.replicas == 2 and list(reply.replica_ids) == ["r1", "r2"]
    assert reply.publish_to_live_s >= 0


def test_ack_waiter_and_one_script_publish(redis_url: str) -> None:
    store = AdapterDirectory(connect(redis_url))
    events = store.events(RUN, poll_s=0.1)
    next(events)  # subscribed
    with store.ack_waiter(RUN) as acks:
        assert acks.wait(0.05) is False  # nothing acknowledged yet
        store.acknowledge(RUN, 1, "r1")
        assert acks.wait(30) is True
        assert set(store.acks(RUN, 1)) == {"r1"}
    two = AdapterRecord(run=RUN, version=2, path=f"{RUN}/adapters/v000002", sha256="a" * 64)
    one = AdapterRecord(run=RUN, version=1, path=f"{RUN}/adapters/v000001", sha256="b" * 64)
    assert store.publish(two) is True
    assert store.publish(one) is False  # older: recorded in the history, not latest
    assert store.latest(RUN).version == 2
    assert sorted(r.version for r in store.history(RUN)) == [1, 2]
    got = [e for e in (next(events) for _ in range(20)) if e is not None]
    assert [e.version for e in got] == [2]  # only the newer one was announced


def test_garbage_collection_spares_versions_that_checkpoints_serve(
        tmp_path: Path, redis_url: str, start_ckptsync) -> None:
    # a run's checkpoints at steps 1 and 3 were serving versions 1 and 3;
    # a restarted attempt publishes 4..6. GC keeps the newest 2 and both pinned versions.
    import torch

    from rlfleet.storage import save_checkpoint

    root = RunsRoot(tmp_path / "runs")
    root.root.mkdir(parents=True)
    for step, version in ((1, 1), (3, 3)):
        save_checkpoint(root, RUN, step, adapter_state={"a": torch.zeros(2)},
                        optimizer_state={"state": {}, "param_groups": []},
                        data_cursor={"cursor": step, "version": version})
    proc = start_ckptsync(redis_url, root.root, "--keep-last", "2", "--gc-delay-s", "0.5")
    client = RpcClient(proc.address, timeout_s=10)
    for v in range(1, 7):
        publish_version(root, RUN, v)
        publish(client, v)
    assert _wait_versions(root, [1, 3, 5, 6]) == [1, 3, 5, 6]
