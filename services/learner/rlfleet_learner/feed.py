"""Rollout groups on a background thread, so the learner can stop while it waits.

A ``GroupFeed`` runs group requests through the rollout pool (which spreads them over the
replicas within their capacity) and queues each completed group. The learner takes a
step's groups from the queue; when it is told to stop while waiting, it walks away with
nothing, and the groups it did not take are never trained (their seeds stay untrained).
A wait that lasts is logged every `report_s` (groups wanted and in, replicas seen).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable

from rlfleet.clients.rollout_pool import RolloutPool
from rlfleet.v1 import rollout_pb2
from rlfleet_learner.faults import RolloutsFailed
from rlfleet_learner.reporting import WAIT_REPORT_S, WaitReport, replica_state

Group = tuple[rollout_pb2.GroupRequest, list[rollout_pb2.Trajectory]]


class GroupFeed:
    def __init__(self, pool: RolloutPool, requests: Iterable[rollout_pb2.GroupRequest], *,
                 max_in_flight: int, max_queued: int = 0,
                 report_s: float = WAIT_REPORT_S) -> None:
        self._pool = pool
        self._report_s = report_s
        self._requests = requests
        self._max_in_flight = max_in_flight
        self._queue: queue.Queue[Group] = queue.Queue(maxsize=max_queued)
        self._closed = threading.Event()
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="group-feed", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for group in self._pool.run_groups(self._requests, self._max_in_flight):
                while not self._closed.is_set():
                    try:
                        self._queue.put(group, timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if self._closed.is_set():
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the learner's thread
            self._error = exc
        finally:
            self._done.set()

    def take(self, n: int, stop: threading.Event) -> list[Group] | None:
        """The next ``n`` completed groups, or None if ``stop`` is set first."""
        out: list[Group] = []
        report = WaitReport(f"{n} rollout group(s)", lambda: {
            "groups_wanted": n, "groups_received": len(out),
            **replica_state(self._pool)}, self._report_s)
        with report:
            while len(out) < n:
                if stop.is_set():
                    return None
                try:
                    out.append(self._queue.get(timeout=0.2))
                    continue
                except queue.Empty:
                    pass
                if self._error is not None:
                    raise RolloutsFailed(f"rollouts failed: {self._error}") from self._error
                if self._done.is_set() and self._queue.empty():
                    raise RuntimeError(
                        f"the rollout feed ended after {len(out)} of {n} groups")
        return out

    def close(self) -> None:
        """Stop queueing; groups still running finish on their replicas and are dropped."""
        self._closed.set()
