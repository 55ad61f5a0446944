"""The replica in the fleet: heartbeats in Redis, and new adapter versions from the latest
key (on start and every few seconds) and "new version" events."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import redis

from rlfleet.engines.base import EngineDead
from rlfleet.fleet import (
    AdapterDirectory,
    AdapterRecord,
    ReplicaDirectory,
    ReplicaInfo,
    fleet_unavailable_reason,
)
from rlfleet.fleet.adapter_records import PendingVersion
from rlfleet.storage import PathOutsideRunsRoot, RunsRoot
from rlfleet_rollout.loaded_adapters import AdapterManager, AdapterRefused, Prefetch

log = logging.getLogger(__name__)


def _reason(exc: redis.RedisError) -> str:
    return fleet_unavailable_reason(exc) or f"Redis error {type(exc).__name__}"


class Heartbeat:
    """Writes the replica's entry in the fleet store every `period_s` (TTL `ttl_s`).

    A failed heartbeat is logged with its cause (unreachable, full, refused credentials)
    when the failures begin, once a minute while they last, and when they end; the entry
    expires after the TTL meanwhile (the replica keeps serving groups it is sent)."""

    REPEAT_LOG_S = 60.0

    def __init__(self, fleet: ReplicaDirectory, info: Callable[[], ReplicaInfo],
                 period_s: float, ttl_s: float) -> None:
        self.fleet = fleet
        self.info = info
        self.period_s = period_s
        self.ttl_s = ttl_s
        self.failures = 0  # heartbeats that failed in a row
        self._logged_at = 0.0
        self._stop = threading.Event()
        self._beating = threading.Lock()  # a stop's removal is never followed by a beat
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)

    def beat(self) -> None:
        self.fleet.heartbeat(self.info(), self.ttl_s)

    def register(self) -> bool:
        """Writes the first heartbeat, waiting (and retrying every `period_s`) while Redis
        cannot take it; False if stopped first. The replica stays NOT_SERVING meanwhile."""
        while not self._stop.is_set():
            if self.try_beat(starting=True):
                return True
            self._stop.wait(self.period_s)
        return False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stops beating and removes the entry: no beat of any thread comes after."""
        with self._beating:
            self._stop.set()
        try:
            self.fleet.remove(self.info().replica_id)
        except redis.RedisError:
            pass

    def try_beat(self, starting: bool = False) -> bool:
        try:
            with self._beating:
                if self._stop.is_set():
                    return False
                self.beat()
        except redis.RedisError as exc:  # Redis restarting or full: re-register next beat
            self.failures += 1
            now = time.monotonic()
            if self.failures == 1 or now - self._logged_at >= self.REPEAT_LOG_S:
                self._logged_at = now
                what = ("cannot register in the fleet store; serving NOT_SERVING until it "
                        "can" if starting else
                        "heartbeat failed; the fleet store entry expires after its TTL until a "
                        "heartbeat succeeds")
                log.warning(what, extra={"reason": _reason(exc), "error": str(exc)[:300],
                                         "failures": self.failures})
            return False
        if self.failures:
            log.info("heartbeat succeeded again; registered",
                     extra={"failures": self.failures})
            self.failures = 0
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.try_beat()


# How many times a replica tries a version that did not verify (the first load included).
MAX_LOAD_ATTEMPTS = 3


@dataclass(frozen=True)
class Refused:
    attempts: int
    signature: tuple | None  # the version's files when it was last tried


def files_signature(runs_root: RunsRoot, path: str) -> tuple | None:
    """(name, size, mtime) of every file of an adapter directory: changes when its bytes
    are replaced. None when it cannot be read (or lies outside the runs root)."""
    try:
        source = runs_root.resolve(path)
        return tuple(sorted((p.name, st.st_size, st.st_mtime_ns)
                            for p in source.iterdir() if p.is_file()
                            for st in (p.stat(),)))
    except (OSError, PathOutsideRunsRoot):
        return None


class AdapterWatcher:
    """Loads every newer version it hears of. A refused version is remembered, reported in
    Redis (WaitForReplicas names who refused what) and tried again only when it is
    announced again or its files on /shared changed since (the bytes that did not verify
    were being replaced: a later read may verify), at most `max_attempts` times in all.

    Event-driven: it blocks on the run's pub/sub channel and starts loading the moment an
    announcement arrives (the wait wakes on the message; `events_poll_s` only bounds how
    long a stop request can go unnoticed). Reading the latest key every `poll_s` is only
    the fallback for announcements missed while Redis was away; it also runs right after
    the first subscription, so nothing published before the watcher listened is missed.

    On ckpt-sync's hint that a version is being verified (PendingVersion) it starts
    reading and hashing that version in the background, so the announcement finds the
    bytes ready; the announcement alone decides what is loaded (see AdapterManager)."""

    PREFETCH_TTL_S = 120.0  # a read-ahead never announced (refused) is dropped after this

    def __init__(self, fleet: AdapterDirectory, manager: AdapterManager,
                 poll_s: float = 2.0, events_poll_s: float = 0.5,
                 max_attempts: int = MAX_LOAD_ATTEMPTS) -> None:
        self.fleet = fleet
        self.manager = manager
        self.poll_s = poll_s
        self.events_poll_s = events_poll_s
        self.max_attempts = max_attempts
        self.refused: dict[tuple[int, str], Refused] = {}
        self._prefetch: Prefetch | None = None
        self._prefetcher = ThreadPoolExecutor(max_workers=1,
                                              thread_name_prefix="adapter-read-ahead")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="adapters", daemon=True)

    def catch_up(self) -> None:
        """Loads the latest published version if it is newer than the live one."""
        record = self.fleet.latest(self.manager.run)
        if record is not None:
            self._consider(record)

    def _hint(self, record: AdapterRecord) -> None:
        if (record.run != self.manager.run or record.version <= self.manager.current.version
                or (self._prefetch is not None
                    and self._prefetch.record.version >= record.version)):
            return
        if self._prefetch is not None:
            self._prefetch.future.cancel()  # an older read-ahead not started yet: skip it
        self._prefetch = self.manager.start_prefetch(record, self._prefetcher, time.time())

    def _take_prefetch(self, record: AdapterRecord) -> Prefetch | None:
        prefetch = self._prefetch
        if prefetch is None:
            return None
        if prefetch.record.version <= record.version:
            self._prefetch = None  # used now, or overtaken
        if (prefetch.record.version, prefetch.record.path) == (record.version, record.path):
            return prefetch
        return None

    def _consider(self, record, noticed_at: float | None = None,  # noqa: ANN001
                  announced: bool = False) -> None:
        """Loads `record` if newer. A version refused before is tried again only when
        `announced` (an event, not the poll) or when its files changed, within the bound."""
        prefetch = self._take_prefetch(record)
        if record.version <= self.manager.current.version:
            return
        key = (record.version, record.sha256)
        before = self.refused.get(key)
        signature = files_signature(self.manager.runs_root, record.path)
        if before is not None and (before.attempts >= self.max_attempts or (
                not announced and signature == before.signature)):
            return
        try:
            self.manager.load(record, noticed_at=noticed_at or time.time(), prefetch=prefetch)
        except AdapterRefused as exc:
            attempts = (before.attempts if before else 0) + 1
            self.refused[key] = Refused(attempts, signature)
            log.error("adapter refused", extra={
                "version": record.version, "error": str(exc), "attempts": attempts,
                "retries_left": max(0, self.max_attempts - attempts)})
            try:
                self.fleet.refuse(record.run, record.version, self.manager.replica_id,
                                     str(exc), attempts)
            except redis.RedisError as err:
                log.warning("refusal not recorded", extra={"error": repr(err)})
            return
        self.refused.pop(key, None)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._prefetcher.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        last_poll = 0.0
        events = self.fleet.events(self.manager.run, poll_s=self.events_poll_s,
                                      pending=True)
        while not self._stop.is_set():
            try:
                event = next(events)
                if isinstance(event, PendingVersion):
                    self._hint(event.record)
                elif event is not None:
                    self._consider(event, noticed_at=time.time(), announced=True)
                if (self._prefetch is not None
                        and time.time() - self._prefetch.hinted_at > self.PREFETCH_TTL_S):
                    self._prefetch = None
                if time.monotonic() - last_poll > self.poll_s:
                    last_poll = time.monotonic()
                    self.catch_up()  # covers events missed while Redis was away
            except redis.RedisError as exc:
                log.warning("adapter watch failed; retrying", extra={"error": repr(exc)})
                self._stop.wait(self.poll_s)
            except EngineDead as exc:  # nothing loads again; the replica is on its way out
                log.error("adapter watcher stopped: the engine is dead",
                          extra={"error": str(exc)})
                self.stop()
            except Exception as exc:  # noqa: BLE001 - never let the watcher die
                log.exception("adapter watcher error", extra={"error": repr(exc)})
                self._stop.wait(self.poll_s)
