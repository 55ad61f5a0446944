"""The reward service's client: score finished episodes; the service's name and version."""

from __future__ import annotations

from collections.abc import Sequence

from rlfleet.clients.base import ServiceClient
from rlfleet.v1 import reward_pb2, reward_pb2_grpc


class RewardClient(ServiceClient):
    """Errors: InvalidArgument (empty or oversized batch, bad record), NotFound (a task the
    service does not score), Unavailable, DeadlineExceeded (rlfleet.rpc.errors)."""

    SERVICE = "rlfleet.v1.RewardService"
    STUB = reward_pb2_grpc.RewardServiceStub
    IDEMPOTENT = frozenset({"Score", "Info"})  # a score is a function of the request
    # A reward is swapped behind one Service address: between the old pod's end and the
    # new one's readiness the address refuses connections, and a score waits for the new
    # pod within its deadline rather than failing the group it belongs to.
    WAIT_FOR_READY = True

    def score(self, episodes: Sequence[reward_pb2.EpisodeRecord], *,
              timeout_s: float | None = None) -> reward_pb2.ScoreResponse:
        """One score per episode, in order (`scores`), and the service's `info`."""
        return self._unary("Score", reward_pb2.ScoreRequest(episodes=episodes), timeout_s)

    def info(self) -> reward_pb2.RewardInfo:
        """The service's name, version, components and the tasks it scores."""
        return self._unary("Info", reward_pb2.RewardInfoRequest())
