"""Idempotent groups: a repeated idempotency key gets the trajectories of the first run
(streamed live if that run is still going), never a second run."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from rlfleet.rpc.errors import InvalidArgument
from rlfleet.v1 import rollout_pb2


@dataclass
class _Entry:
    fingerprint: str
    trajectories: list[rollout_pb2.Trajectory] = field(default_factory=list)
    done: bool = False
    error: Exception | None = None
    cond: threading.Condition = field(default_factory=threading.Condition)


def fingerprint(request: rollout_pb2.GroupRequest) -> str:
    return hashlib.sha256(request.SerializeToString(deterministic=True)).hexdigest()


class GroupCache:
    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def stream(self, request: rollout_pb2.GroupRequest,
               run: Callable[[], Iterator[rollout_pb2.Trajectory]]) -> Iterator[
                   rollout_pb2.Trajectory]:
        """Runs the group (first caller) or follows the run already under way or done."""
        key = request.idempotency_key
        fp = fingerprint(request)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.fingerprint != fp:
                raise InvalidArgument(
                    f"idempotency key {key!r} was used for a different request")
            owner = entry is None or (entry.done and entry.error is not None)
            if owner:
                entry = _Entry(fp)
                self._entries[key] = entry
                self._entries.move_to_end(key)
                self._evict()
        if owner:
            yield from self._run(entry, run)
        else:
            yield from self._follow(entry)

    def _run(self, entry: _Entry, run: Callable[[], Iterator[rollout_pb2.Trajectory]]
             ) -> Iterator[rollout_pb2.Trajectory]:
        try:
            for trajectory in run():
                with entry.cond:
                    entry.trajectories.append(trajectory)
                    entry.cond.notify_all()
                yield trajectory
        except BaseException as exc:
            with entry.cond:
                entry.error = exc if isinstance(exc, Exception) else RuntimeError("cancelled")
                entry.done = True
                entry.cond.notify_all()
            raise
        with entry.cond:
            entry.done = True
            entry.cond.notify_all()

    @staticmethod
    def _follow(entry: _Entry) -> Iterator[rollout_pb2.Trajectory]:
        i = 0
        while True:
            with entry.cond:
                while i >= len(entry.trajectories) and not entry.done:
                    entry.cond.wait(1.0)
                batch = entry.trajectories[i:]
                done, error = entry.done, entry.error
            yield from batch
            i += len(batch)
            if done and i >= len(entry.trajectories):
                if error is not None:
                    raise error
                return

    def _evict(self) -> None:
        while len(self._entries) > self.capacity:
            key, entry = next(iter(self._entries.items()))
            if not entry.done:
                break  # never forget a group that is still running
            del self._entries[key]
