"""A tracker off the training thread: a bounded queue and a thread of its own.

The training thread only enqueues (never waits: a full queue drops the item, counted); the
sink's thread opens the tracker and delivers. A tracker that is down, slow or refuses is
warned about once, the first time (a failure or a drop), and counted after that; the
count is said when the sink closes. After a failure the sink stops calling the tracker
for `retry_after_s` (the items of that pause are counted, not tried), then tries again: a
tracker that comes back gets the later events. metrics.jsonl keeps every number anyway.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import Counter

from rlfleet_learner.trackers.base import Outcome, Tracker

log = logging.getLogger(__name__)

MAX_QUEUED = 1000  # items waiting for a slow tracker (a step's event is one item)
RETRY_AFTER_S = 30.0  # a tracker that failed is tried again after this pause
THREAD_PREFIX = "tracker-"  # the sinks' thread names (rlfleet_learner.trackers.hub)

LOST = Counter("rlfleet_learner_tracker_lost_total",
               "items (events, files) a tracker did not get: failed, skipped while it was "
               "down, or dropped with its queue full", ["tracker"])

_CLOSE = object()


class TrackerSink:
    """Delivers to `tracker` on a thread of its own, opening it first (with `resumed`,
    its entry in trackers.json); `opened(entry)` is called with what `open` returned."""

    def __init__(self, tracker: Tracker, resumed: Mapping[str, Any],
                 opened: Callable[[dict[str, Any]], None], *, max_queued: int = MAX_QUEUED,
                 retry_after_s: float = RETRY_AFTER_S) -> None:
        self.tracker = tracker
        self.name = tracker.name
        self._resumed = dict(resumed)
        self._opened_cb = opened
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queued)
        self._retry_after_s = retry_after_s
        self._open = False
        self._down_until = 0.0
        self._warned = False
        self._warn_lock = threading.Lock()
        self.delivered = 0
        self.failed = 0  # failed, or skipped while the tracker was down
        self.dropped = 0  # the queue was full
        self.thread = threading.Thread(target=self._loop, name=f"{THREAD_PREFIX}{self.name}",
                                       daemon=True)
        self.thread.start()

    # -- the training thread -------------------------------------------------------------

    def put(self, method: str, *args: Any) -> bool:
        """Enqueues `tracker.<method>(*args)`; False (counted) when the queue is full."""
        try:
            self._queue.put_nowait((method, args))
            return True
        except queue.Full:
            self.dropped += 1
            LOST.labels(self.name).inc()
            self._warn(f"tracker {self.name} is behind: its queue of {self._queue.maxsize} "
                       "is full and events are dropped")
            return False

    def close(self, outcome: Outcome, deadline: float) -> bool:
        """Asks the thread to deliver what is queued, close the tracker and end; waits
        until `deadline` (time.monotonic()). False when it had not finished by then."""
        try:
            self._queue.put((_CLOSE, (outcome,)), timeout=max(0.0, deadline - time.monotonic()))
        except queue.Full:
            pass
        self.thread.join(max(0.0, deadline - time.monotonic()))
        finished = not self.thread.is_alive()
        lost = self.failed + self.dropped
        if not finished:
            log.warning("tracker %s did not finish in time: what it had not sent is lost "
                        "(metrics.jsonl has it)", self.name,
                        extra={"tracker": self.name, "queued": self._queue.qsize()})
        elif lost:
            log.warning("tracker %s: %d of %d events and files not delivered (%d dropped "
                        "with its queue full); metrics.jsonl has every number", self.name,
                        lost, lost + self.delivered, self.dropped,
                        extra={"tracker": self.name, "lost": lost, "dropped": self.dropped,
                               "delivered": self.delivered})
        return finished

    # -- the sink's thread ---------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            method, args = self._queue.get()
            if method is _CLOSE:
                if self._open:
                    self._call("close", args)
                return
            self._deliver(method, args)

    def _deliver(self, method: str, args: tuple[Any, ...]) -> None:
        if time.monotonic() < self._down_until:
            self._lost()
            return
        if not self._open and not self._call("open", ()):
            self._lost()
            return
        if self._call(method, args):
            self.delivered += 1
        else:
            self._lost()

    def _call(self, method: str, args: tuple[Any, ...]) -> bool:
        try:
            if method == "open":
                entry = self.tracker.open(self._resumed)
                self._open = True
                self._resumed = entry
                self._opened_cb(entry)
            else:
                getattr(self.tracker, method)(*args)
            return True
        except Exception as exc:  # noqa: BLE001 - any failure of the tracker's library
            self._down_until = time.monotonic() + self._retry_after_s
            self._warn(f"tracker {self.name} failed ({method}: {type(exc).__name__}: "
                       f"{_short(exc)})")
            return False

    def _lost(self) -> None:
        self.failed += 1
        LOST.labels(self.name).inc()

    def _warn(self, what: str) -> None:
        with self._warn_lock:
            if self._warned:
                return
            self._warned = True
        log.warning("%s; training goes on and metrics.jsonl keeps every number; further "
                    "failures of this tracker are counted, not logged", what,
                    extra={"tracker": self.name})


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + "..."
