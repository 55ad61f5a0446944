"""The replica in the fleet: heartbeats in Redis, and new adapter versions from the latest
key (on start and every few seconds) and "new version" events."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from rlfleet.registry import AdapterRegistry, ReplicaInfo, ReplicaRegistry
from rlfleet_rollout.adapters import AdapterManager, AdapterRefused

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, registry: ReplicaRegistry, info: Callable[[], ReplicaInfo],
                 period_s: float, ttl_s: float) -> None:
        self.registry = registry
        self.info = info
        self.period_s = period_s
        self.ttl_s = ttl_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)

    def beat(self) -> None:
        self.registry.heartbeat(self.info(), self.ttl_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        try:
            self.registry.remove(self.info().replica_id)
        except redis.RedisError:
            pass

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.beat()
            except redis.RedisError as exc:  # Redis restarting: re-register next beat
                log.warning("heartbeat failed", extra={"error": repr(exc)})


class AdapterWatcher:
    """Loads every newer version it hears of; a refused version is remembered and never
    retried (it would be refused again)."""

    def __init__(self, registry: AdapterRegistry, manager: AdapterManager,
                 poll_s: float = 2.0) -> None:
        self.registry = registry
        self.manager = manager
        self.poll_s = poll_s
        self.refused: set[tuple[int, str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="adapters", daemon=True)

    def catch_up(self) -> None:
        """Loads the latest published version if it is newer than the live one."""
        record = self.registry.latest(self.manager.run)
        if record is not None:
            self._consider(record)

    def _consider(self, record) -> None:  # noqa: ANN001
        if record.version <= self.manager.current.version:
            return
        if (record.version, record.sha256) in self.refused:
            return
        try:
            self.manager.load(record)
        except AdapterRefused as exc:
            self.refused.add((record.version, record.sha256))
            log.error("adapter refused", extra={"version": record.version, "error": str(exc)})

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        last_poll = 0.0
        events = self.registry.events(self.manager.run, poll_s=0.5)
        while not self._stop.is_set():
            try:
                record = next(events)
                if record is not None:
                    self._consider(record)
                if time.monotonic() - last_poll > self.poll_s:
                    last_poll = time.monotonic()
                    self.catch_up()  # covers events missed while Redis was away
            except redis.RedisError as exc:
                log.warning("adapter watch failed; retrying", extra={"error": repr(exc)})
                self._stop.wait(self.poll_s)
            except Exception as exc:  # noqa: BLE001 - never let the watcher die
                log.exception("adapter watcher error", extra={"error": repr(exc)})
                self._stop.wait(self.poll_s)
