"""A rollout replica's client: play a group (streamed trajectories), the replica's status.

This talks to ONE replica. The learner's `RolloutPool` (rollout_pool.py) spreads groups
over many and re-sends a failed group elsewhere; it uses this client per replica."""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from rlfleet.clients.base import ServiceClient
from rlfleet.rpc.errors import from_grpc
from rlfleet.v1 import rollout_pb2, rollout_pb2_grpc


class TrajectoryStream(Iterator[rollout_pb2.Trajectory]):
    """A group's trajectories as the replica streams them (in the order they finish);
    a failure while iterating raises its typed error. `cancel()` ends the call (the next
    iteration raises Cancelled)."""

    def __init__(self, call: grpc.Call, peer: str, method: str) -> None:
        self._call = call
        self._peer = peer
        self._method = method

    def __iter__(self) -> TrajectoryStream:
        return self

    def __next__(self) -> rollout_pb2.Trajectory:
        try:
            return next(self._call)  # type: ignore[call-overload]
        except grpc.RpcError as err:
            raise from_grpc(err, peer=self._peer, method=self._method) from err

    def cancel(self) -> None:
        self._call.cancel()


class RolloutClient(ServiceClient):
    """Errors: InvalidArgument (bad request), ResourceExhausted (the replica is full),
    FailedPrecondition (its adapter is older than min_adapter_version), Unavailable (the
    replica, or the env/reward service behind it, failed), DeadlineExceeded."""

    SERVICE = "rlfleet.v1.RolloutService"
    STUB = rollout_pb2_grpc.RolloutServiceStub
    # RolloutGroup is idempotent (its key), but not retried here: whoever plays groups
    # on several replicas (the pool) re-sends a failed one to another replica itself,
    # and counts it; retrying on the same dead replica first would only delay that.
    IDEMPOTENT = frozenset({"GetStatus"})

    def stream(self, request: rollout_pb2.GroupRequest, *, timeout_s: float | None = None
               ) -> TrajectoryStream:
        """The group's trajectories as they finish."""
        address = self.transport.addresses[0]
        call = self.transport.stream(self.STUB, "RolloutGroup", request, timeout_s=timeout_s,
                                     address=address)
        return TrajectoryStream(call, address, self._method("RolloutGroup"))

    def play(self, request: rollout_pb2.GroupRequest, *, timeout_s: float | None = None
             ) -> list[rollout_pb2.Trajectory]:
        """Every trajectory of the group, by index."""
        return sorted(self.stream(request, timeout_s=timeout_s), key=lambda t: t.index)

    def status(self, *, timeout_s: float | None = None) -> rollout_pb2.ReplicaStatus:
        """The replica's identity, live adapter, load and capacity."""
        return self._unary("GetStatus", rollout_pb2.StatusRequest(), timeout_s)
