"""The learner's view of the rollout replicas: spread groups over live replicas, least
loaded first; survive replicas dying mid-request; pick up replicas that join mid-run.

Exactly-once delivery: a group is identified by its idempotency key and each trajectory
by its index. If a replica fails mid-stream, the group is sent to another replica under
the same key; trajectories already received are kept, and any index that arrives twice
is dropped, so every index is delivered once.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import grpc
import redis
from prometheus_client import Counter

from rlfleet.registry import ReplicaRegistry, connect
from rlfleet.rpc.client import RpcClient
from rlfleet.v1 import rollout_pb2, rollout_pb2_grpc

log = logging.getLogger(__name__)

GROUP_RETRIES = Counter("rlfleet_pool_group_retries_total", "groups re-sent to another replica",
                        ["code"])
DUPLICATES = Counter("rlfleet_pool_duplicate_trajectories_total",
                     "trajectories dropped because their index already arrived")

# The replica (or the way to it) failed: try another. Anything else is the answer.
RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.FAILED_PRECONDITION,  # replica has not loaded the adapter yet
}


class NoReplicas(RuntimeError):
    """No live replica appeared before the deadline."""


@dataclass
class Replica:
    replica_id: str
    address: str
    load: int  # episodes the replica reports + episodes this pool has sent it


class RolloutPool:
    def __init__(
        self,
        *,
        redis_url: str | None = None,
        addresses: Iterable[str] = (),
        run: str | None = None,
        token: str | None = None,
        stream_timeout_s: float = 1800.0,
        max_attempts: int = 8,
        wait_for_replicas_s: float = 120.0,
    ) -> None:
        self.registry = ReplicaRegistry(connect(redis_url)) if redis_url else None
        self.static = list(addresses)
        if self.registry is None and not self.static:
            raise ValueError("RolloutPool needs a redis_url or replica addresses")
        self.run = run
        self.token = token
        self.stream_timeout_s = stream_timeout_s
        self.max_attempts = max_attempts
        self.wait_for_replicas_s = wait_for_replicas_s
        self._clients: dict[str, RpcClient] = {}
        self._inflight: dict[str, int] = {}
        self._last_live: list[Replica] = []  # the registry's last answer (Redis outages)
        self._lock = threading.Lock()

    # -- replicas --------------------------------------------------------------------

    def replicas(self) -> list[Replica]:
        """Live replicas, least loaded first (ties in random order)."""
        if self.registry is not None:
            try:
                live = [Replica(r.replica_id, r.address, r.active_episodes)
                        for r in self.registry.live() if self.run is None or r.run == self.run]
                self._last_live = [Replica(r.replica_id, r.address, r.load) for r in live]
            except redis.RedisError as exc:
                # The registry is down (restarting), not the replicas: keep sending work to
                # the replicas it last listed; one that died meanwhile fails and is retried.
                log.warning("replica registry unreachable; using the last known replicas",
                            extra={"error": repr(exc), "replicas": len(self._last_live)})
                live = [Replica(r.replica_id, r.address, r.load) for r in self._last_live]
        else:
            live = [Replica(a, a, 0) for a in self.static]
        with self._lock:
            for r in live:
                r.load = max(r.load, self._inflight.get(r.address, 0))
        random.shuffle(live)
        return sorted(live, key=lambda r: r.load)

    def _pick(self, exclude: set[str]) -> Replica:
        deadline = time.monotonic() + self.wait_for_replicas_s
        while True:
            candidates = [r for r in self.replicas() if r.address not in exclude]
            if not candidates:
                candidates = self.replicas()  # every replica failed once: try again
            if candidates:
                return candidates[0]
            if time.monotonic() > deadline:
                raise NoReplicas(f"no live rollout replica after {self.wait_for_replicas_s}s")
            time.sleep(0.2)

    def _client(self, address: str) -> RpcClient:
        with self._lock:
            if address not in self._clients:
                self._clients[address] = RpcClient(address, token=self.token,
                                                   timeout_s=self.stream_timeout_s)
            return self._clients[address]

    # -- groups ----------------------------------------------------------------------

    def run_group(self, request: rollout_pb2.GroupRequest) -> list[rollout_pb2.Trajectory]:
        """All `group_size` trajectories of the group, each index exactly once."""
        received: dict[int, rollout_pb2.Trajectory] = {}
        failed: set[str] = set()
        for attempt in range(self.max_attempts):
            replica = self._pick(failed)
            with self._lock:
                self._inflight[replica.address] = (self._inflight.get(replica.address, 0)
                                                   + request.group_size)
            try:
                stream = self._client(replica.address).stream(
                    rollout_pb2_grpc.RolloutServiceStub, "RolloutGroup", request,
                    address=replica.address)
                for trajectory in stream:
                    if trajectory.index in received or not (
                            0 <= trajectory.index < request.group_size):
                        DUPLICATES.inc()
                        continue
                    received[trajectory.index] = trajectory
                if len(received) == request.group_size:
                    return [received[i] for i in range(request.group_size)]
                code = grpc.StatusCode.UNKNOWN  # stream ended early: treat as a failure
                detail = f"stream ended after {len(received)} of {request.group_size}"
            except grpc.RpcError as err:
                code, detail = err.code(), err.details()
                if code not in RETRYABLE:
                    raise
            finally:
                with self._lock:
                    self._inflight[replica.address] -= request.group_size
            failed.add(replica.address)
            GROUP_RETRIES.labels(code.name).inc()
            log.warning("group failed on a replica; retrying elsewhere", extra={
                "replica": replica.replica_id, "code": code.name, "detail": detail,
                "key": request.idempotency_key, "received": len(received)})
            time.sleep(min(2.0, 0.1 * 2 ** attempt))
        raise RuntimeError(f"group {request.idempotency_key} failed on {self.max_attempts} "
                           f"attempts ({len(received)} of {request.group_size} received)")

    def run_groups(self, requests: Iterable[rollout_pb2.GroupRequest], max_in_flight: int = 4
                   ) -> Iterator[tuple[rollout_pb2.GroupRequest, list[rollout_pb2.Trajectory]]]:
        """Runs groups concurrently; yields (request, trajectories) as each completes."""
        pending = iter(requests)
        with ThreadPoolExecutor(max_in_flight, thread_name_prefix="group") as pool:
            running: dict[Future, rollout_pb2.GroupRequest] = {}
            for request in pending:
                running[pool.submit(self.run_group, request)] = request
                if len(running) >= max_in_flight:
                    break
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    request = running.pop(future)
                    yield request, future.result()
                    nxt = next(pending, None)
                    if nxt is not None:
                        running[pool.submit(self.run_group, nxt)] = nxt

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()
