"""ckpt-sync's client: publish adapter versions, read the latest, wait until replicas serve
one, acknowledge a loaded one."""

from __future__ import annotations

from rlfleet.clients.base import ServiceClient
from rlfleet.v1 import common_pb2, sync_pb2, sync_pb2_grpc

# How much longer than the wait it asks for a WaitForReplicas call may take: ckpt-sync
# answers DEADLINE_EXCEEDED itself when its wait ends; this covers the way there and back.
WAIT_SLACK_S = 10.0


class SyncClient(ServiceClient):
    """Errors: InvalidArgument (bad run name, version, bounds), NotFound (no such version or
    adapter directory), FailedPrecondition (verification failed, version not newer),
    Unavailable (Redis down or full; retry), DeadlineExceeded (rlfleet.rpc.errors)."""

    SERVICE = "rlfleet.v1.SyncService"
    STUB = sync_pb2_grpc.SyncServiceStub
    # Every method is safe to re-send: publishing the version that is latest already
    # answers it again, acknowledging twice records the same, the others only read.
    IDEMPOTENT = frozenset({"Publish", "GetLatest", "WaitForReplicas", "Acknowledge"})

    def publish(self, run: str, version: int, *, sha256: str = "", path: str = "",
                timeout_s: float | None = None) -> sync_pb2.PublishResponse:
        """Verifies version `version` of `run` on /shared and makes it latest; `sha256`
        (the manifest's) must match when given. The answer carries the verified sha256."""
        adapter = common_pb2.AdapterRef(run=run, version=version, sha256=sha256, path=path)
        return self._unary("Publish", sync_pb2.PublishRequest(adapter=adapter), timeout_s)

    def latest(self, run: str) -> common_pb2.AdapterRef:
        """The latest published version of `run` (NotFound if none)."""
        return self._unary("GetLatest", sync_pb2.GetLatestRequest(run=run))

    def wait_for_replicas(self, run: str, version: int, min_replicas: int, timeout_s: float
                          ) -> sync_pb2.WaitForReplicasResponse:
        """Blocks until `min_replicas` live replicas serve `version` or newer; after
        `timeout_s` DeadlineExceeded, saying how many did."""
        request = sync_pb2.WaitForReplicasRequest(run=run, version=version,
                                                  min_replicas=min_replicas, timeout_s=timeout_s)
        return self._unary("WaitForReplicas", request, timeout_s + WAIT_SLACK_S)

    def acknowledge(self, replica_id: str, adapter: common_pb2.AdapterRef) -> None:
        """Reports that replica `replica_id` verified and serves `adapter`."""
        self._unary("Acknowledge", sync_pb2.AcknowledgeRequest(replica_id=replica_id,
                                                               adapter=adapter))
