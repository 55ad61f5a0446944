"""A refused adapter version is not refused forever, nor retried forever.

Real Redis, ckpt-sync and two rollout replicas. A version whose weights changed after
ckpt-sync's check (a byte flipped after the manifest was written; announced behind
ckpt-sync's back, as if the bytes changed between its check and the replicas' read):

1. both replicas refuse it; WaitForReplicas' DEADLINE_EXCEEDED says which replica refused
   which version, how many times and why;
2. the bytes restored on /shared (the manifest verifies again), both replicas try it again
   on their own and serve it; nobody is reported as refusing any more;
3. a version that stays corrupt, announced 5 times (4 re-announcements: what ckpt-sync
   sends when the latest version is published again), is tried at most 3 times per
   replica; the next good version loads everywhere.
"""

from __future__ import annotations

import grpc
import pytest

from rlfleet.fleet import AdapterDirectory, AdapterRecord, connect
from rlfleet.v1 import sync_pb2
from tests.reliability.conftest import Fleet, Sync, metric_value, wait_until

REFUSED = ("rlfleet_rollout_adapter_loads_total", 'outcome="refused"')


def corrupt(fleet: Fleet, version: int) -> tuple[AdapterRecord, bytes]:
    """Writes `version` with one weights byte flipped after its manifest; its record and
    the original bytes."""
    manifest = fleet.write_version(version)
    weights = fleet.root.adapter_dir(fleet.run, version) / "adapter_model.safetensors"
    original = weights.read_bytes()
    data = bytearray(original)
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    return AdapterRecord(run=fleet.run, version=version,
                         path=f"{fleet.run}/adapters/v{version:06d}",
                         sha256=manifest.manifest_sha256), original


def wait_error(fleet: Fleet, version: int) -> str:
    """WaitForReplicas for both replicas with no time to wait: its DEADLINE_EXCEEDED."""
    with pytest.raises(grpc.RpcError) as err:
        fleet.sync_client().call(Sync, "WaitForReplicas", sync_pb2.WaitForReplicasRequest(
            run=fleet.run, version=version, min_replicas=2, timeout_s=0))
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    return err.value.details() or ""


@pytest.mark.slow
def test_a_refused_version_is_retried_when_it_verifies_within_a_bound(fleet: Fleet) -> None:
    fleet.start_redis()
    fleet.start_sync()
    fleet.start_env()
    fleet.start_replicas(["ra", "rb"])
    store = AdapterDirectory(connect(fleet.redis_url))
    fleet.publish(1)
    assert sorted(fleet.wait_replicas(1, 2)) == ["ra", "rb"]

    def refused() -> dict[str, float]:
        return {n: metric_value(p.extra["metrics_port"], *REFUSED)
                for n, p in fleet.replicas.items()}

    # 1. refused by both, and WaitForReplicas says so
    record, original = corrupt(fleet, 2)
    assert store.publish(record)
    def both_refused(version: int, attempts: int) -> str | None:
        details = wait_error(fleet, version)
        return details if all(f"replica {r} refused version {version} ({attempts} attempts)"
                              in details for r in ("ra", "rb")) else None

    details = wait_until("both refusals reported by WaitForReplicas",
                         lambda: both_refused(2, 1), timeout_s=60)
    assert "0 of 2 replicas serve" in details and "sha256" in details, details
    assert refused() == {"ra": 1, "rb": 1}

    # 2. the bytes restored: the manifest verifies, both retry on their own and serve it
    weights = fleet.root.adapter_dir(fleet.run, 2) / "adapter_model.safetensors"
    weights.write_bytes(original)
    assert sorted(fleet.wait_replicas(2, 2)) == ["ra", "rb"]
    reply = fleet.sync_client().call(Sync, "WaitForReplicas", sync_pb2.WaitForReplicasRequest(
        run=fleet.run, version=2, min_replicas=2, timeout_s=0))
    assert list(reply.refusals) == []  # loaded on the retry: not reported as refusing
    assert refused() == {"ra": 1, "rb": 1}

    # 3. corrupt for good, announced 5 times: at most 3 attempts per replica
    record, _ = corrupt(fleet, 3)
    assert store.publish(record)
    for _ in range(4):
        store.announce_again(record)
    wait_until("3 attempts by each replica", lambda: both_refused(3, 3), timeout_s=60)
    fleet.publish(4)  # events are handled in order: after this, every v3 one was seen
    assert sorted(fleet.wait_replicas(4, 2)) == ["ra", "rb"]
    assert refused() == {"ra": 4, "rb": 4}  # 1 (v2) + 3 (v3), not 1 + 5
    for proc in fleet.replicas.values():
        assert "Traceback" not in proc.log_path.read_text()
