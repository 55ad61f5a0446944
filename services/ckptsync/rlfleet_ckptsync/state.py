"""What ckpt-sync knows, and how it rebuilds it: the runs root on /shared is the truth,
Redis a cache of it plus the replicas' heartbeats and acks.

Redis' `latest` is checked against /shared before it may refuse a publish: a latest whose
version directory is not on /shared with the same manifest sha256 (forged, or left by a
wiped runs root) is replaced by the verified version, so a key written behind ckpt-sync's
back (a `latest` of 2**40) cannot block later publishes; the reconciler heals it too."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import redis
from prometheus_client import Counter, Gauge, Histogram

from rlfleet.fleet import AdapterDirectory, AdapterRecord, ReplicaDirectory, fleet_store_full
from rlfleet.fleet.adapter_records import parse_record
from rlfleet.storage import (
    AdapterVerificationError,
    PathOutsideRunsRoot,
    RunsRoot,
    VersionProtected,
    checkpoint_adapter_versions,
    latest_version,
    list_versions,
    manifest_sha256,
    remove_version,
    verify_adapter_dir,
)
from rlfleet.storage.lease import current_generation

log = logging.getLogger(__name__)

PUBLISH_TO_LIVE = Histogram(
    "rlfleet_sync_publish_to_live_seconds",
    "time from publishing an adapter version until every live replica serves it",
    ["run"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
)
PUBLISH_STAGE = Histogram(
    "rlfleet_sync_publish_stage_seconds",
    "seconds per stage of a Publish call (verify: read and hash every file once; "
    "announce: the one Redis script; gc: collecting old versions after the announcement)",
    ["stage"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
)
LATEST_VERSION = Gauge("rlfleet_sync_latest_version", "latest published adapter version", ["run"])
REPLICA_VERSION = Gauge(
    "rlfleet_sync_replica_adapter_version", "adapter version each live replica serves",
    ["replica"],
)
LIVE_REPLICAS = Gauge("rlfleet_sync_live_replicas", "rollout replicas with a live heartbeat")
REMOVED_VERSIONS = Counter("rlfleet_sync_removed_versions_total", "adapter versions removed")
REPUBLISHED = Counter(
    "rlfleet_sync_republished_total", "versions re-announced from /shared after Redis lost them"
)
UNBACKED_LATEST = Counter(
    "rlfleet_sync_unbacked_latest_replaced_total",
    "Redis `latest` keys replaced because /shared does not hold that version (forged or stale)",
)


class NotNewer(Exception):
    """An equal or newer version that /shared backs is latest already."""

    def __init__(self, latest: AdapterRecord) -> None:
        super().__init__(f"version {latest.version} is latest")
        self.latest = latest


@dataclass
class SyncState:
    runs_root: RunsRoot
    adapters: AdapterDirectory
    replicas: ReplicaDirectory
    keep_last: int = 3
    # Old versions are collected once every live replica of the run serves the version
    # just published (the last acknowledgement triggers it), or `gc_delay_s` after the
    # publish at the latest; never during the load itself, where deleting a 170 MB
    # version would only compete with the replicas reading and hashing the new one.
    gc_delay_s: float = 10.0
    _measured: set[tuple[str, int]] = field(default_factory=set)
    _gc_lock: threading.Lock = field(default_factory=threading.Lock)
    _gc_timers: dict[str, threading.Timer] = field(default_factory=dict)
    _gc_worker: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="gc"))

    def schedule_gc(self, run: str) -> None:
        """After a publish: collect `run`'s old versions once its replicas have moved to
        it (see `acknowledged`), or in `gc_delay_s` (at once when 0)."""
        if self.gc_delay_s <= 0:
            self._gc_worker.submit(self._collect, run)
            return
        timer = threading.Timer(self.gc_delay_s, self._collect_due, args=(run,))
        timer.daemon = True
        with self._gc_lock:
            old = self._gc_timers.pop(run, None)
            self._gc_timers[run] = timer
        if old is not None:
            old.cancel()
        timer.start()

    def acknowledged(self, run: str, version: int) -> None:
        """After an acknowledgement: if a collection is pending, runs it now (in the
        background) when every live replica of `run` serves the latest version."""
        with self._gc_lock:
            if run not in self._gc_timers:
                return
        self._gc_worker.submit(self._collect_if_all_moved, run, version)

    def _collect_if_all_moved(self, run: str, version: int) -> None:
        try:
            latest = self.adapters.latest(run)
            if latest is None or version < latest.version:
                return
            live = [r for r in self.replicas.live() if r.run == run]
            if not live or any(r.adapter_version < latest.version for r in live):
                return
        except Exception as exc:  # noqa: BLE001 - Redis away: the timer still collects
            log.warning("gc check failed", extra={"run": run, "error": repr(exc)})
            return
        with self._gc_lock:
            timer = self._gc_timers.pop(run, None)
        if timer is not None:
            timer.cancel()
            self._collect(run)

    def _collect_due(self, run: str) -> None:
        with self._gc_lock:
            self._gc_timers.pop(run, None)
        self._gc_worker.submit(self._collect, run)

    def _collect(self, run: str) -> None:
        try:
            self.collect_garbage(run)
        except Exception as exc:  # noqa: BLE001 - Redis away: the next publish retries
            log.warning("garbage collection failed", extra={"run": run, "error": repr(exc)})

    def verify_and_record(self, run: str, version: int) -> AdapterRecord:
        path = self.runs_root.adapter_dir(run, version)
        manifest = verify_adapter_dir(path)
        if manifest.run != run or manifest.version != version:
            raise AdapterVerificationError(
                f"{path}: manifest names run {manifest.run!r} version {manifest.version}")
        # The run's lease on /shared fences learners: a version written under an older
        # generation comes from a learner whose lease was taken over, never announced.
        current = current_generation(self.runs_root, run)
        if manifest.generation is not None and manifest.generation < current:
            raise AdapterVerificationError(
                f"version {version} of run {run!r} was written by a learner whose lease was "
                f"taken over (its generation {manifest.generation}, the run's "
                f"{current}): a fenced-off learner's versions are never announced")
        return AdapterRecord(
            run=run,
            version=version,
            path=str(path.relative_to(self.runs_root.root)),
            sha256=manifest.manifest_sha256,
            step=manifest.step,
            published_at=time.time(),
        )

    def backed_by_shared(self, record: AdapterRecord, run: str) -> bool:
        """Whether /shared holds `record`: its run, its version's directory (where that
        version lives, nowhere else) and a MANIFEST.json with its sha256."""
        try:
            if record.run != run or int(record.version) < 1:
                return False
            path = self.runs_root.adapter_dir(run, int(record.version))
            if record.path and self.runs_root.resolve(record.path) != path:
                return False
            return manifest_sha256(path) == record.sha256
        except (AdapterVerificationError, PathOutsideRunsRoot, OSError, ValueError,
                TypeError, OverflowError):
            return False

    def announce(self, record: AdapterRecord) -> AdapterRecord:
        """Makes the verified `record` latest and announces it; returns what is latest
        for it (the same version already latest: that one, idempotent). Raises NotNewer
        when /shared backs a newer (or the same, differing) latest. A latest that /shared
        does not back is replaced (compare-and-set), with a warning."""
        run = record.run
        for _ in range(5):  # compare-and-set against concurrent publishers
            try:
                if self.adapters.publish(record):
                    return record
            except redis.ResponseError as exc:
                if fleet_store_full(exc):
                    raise
                # latest holds something the script cannot read: not a record at all
            raw = self.adapters.latest_raw(run)
            current = parse_record(raw) if raw else None
            if current is not None and (current.version, current.sha256) == (
                    record.version, record.sha256):
                # announced again: replicas that refused it try once more (bounded)
                self.adapters.announce_again(current)
                return current
            if current is not None and current.version >= record.version and \
                    self.backed_by_shared(current, run):
                raise NotNewer(current)
            if self.adapters.replace(record, raw):
                UNBACKED_LATEST.inc()
                log.warning("Redis' latest is not on /shared (forged or stale); replaced it "
                            "with the version /shared holds",
                            extra={"run": run, "version": record.version,
                                   "replaced": (raw or "")[:200]})
                return record
        raise RuntimeError(f"latest of run {run!r} keeps changing; try again")

    def rebuild(self) -> None:
        """Re-announces the newest verified version of every run that Redis lacks (after a
        flush or restart). Versions never go backwards: Redis keeps whichever is newer."""
        for run in self.runs_root.list_runs():
            try:
                self._rebuild_run(run)
            except (PathOutsideRunsRoot, OSError) as exc:
                # one run's broken layout (e.g. its adapters dir a symlink to outside the
                # root) must not stop the others from being rebuilt
                log.warning("cannot rebuild run", extra={"run": run, "error": str(exc)})

    def _rebuild_run(self, run: str) -> None:
        newest = latest_version(self.runs_root, run)
        if newest is None:
            return
        raw = self.adapters.latest_raw(run)
        current = parse_record(raw) if raw else None
        if current is not None and current.version >= newest and \
                self.backed_by_shared(current, run):
            LATEST_VERSION.labels(run).set(current.version)
            return
        for version in sorted(list_versions(self.runs_root, run), reverse=True):
            try:
                record = self.verify_and_record(run, version)
            except (AdapterVerificationError, OSError) as exc:
                log.warning("skipping unverifiable version",
                            extra={"run": run, "version": version, "error": str(exc)})
                continue
            try:
                announced = self.announce(record)
            except NotNewer as exc:
                announced = exc.latest
            if announced is record:
                REPUBLISHED.inc()
                log.info("re-announced version from /shared",
                         extra={"run": run, "version": version})
            LATEST_VERSION.labels(run).set(announced.version)
            break

    def observe_replicas(self) -> None:
        """Exports which replica serves what, and the publish→all-live latency of each
        version once every live replica of its run serves it."""
        live = self.replicas.live()
        LIVE_REPLICAS.set(len(live))
        REPLICA_VERSION.clear()
        for r in live:
            REPLICA_VERSION.labels(r.replica_id).set(r.adapter_version)
        for run in {r.run for r in live if r.run}:
            latest = self.adapters.latest(run)
            if latest is None or (run, latest.version) in self._measured:
                continue
            serving = [r for r in live if r.run == run]
            if serving and all(r.adapter_version >= latest.version for r in serving):
                acks = self.adapters.acks(run, latest.version)
                done = max(acks.values(), default=time.time())
                PUBLISH_TO_LIVE.labels(run).observe(max(0.0, done - latest.published_at))
                self._measured.add((run, latest.version))

    def collect_garbage(self, run: str) -> list[int]:
        """Removes versions that no live replica serves, that are not among the newest
        `keep_last`, and that no complete training checkpoint of the run was serving when
        it was saved (a resume continues from that policy; /shared decides, not Redis)."""
        versions = list_versions(self.runs_root, run)
        if len(versions) <= self.keep_last:
            return []
        serving = {r.adapter_version for r in self.replicas.live() if r.run == run}
        keep = set(versions[-self.keep_last:]) | serving | \
            checkpoint_adapter_versions(self.runs_root, run)
        removed = []
        for version in versions:
            if version in keep:
                continue
            try:
                remove_version(self.runs_root, run, version, keep=keep)
            except (VersionProtected, OSError) as exc:
                log.warning("cannot remove version", extra={"version": version, "error": str(exc)})
                continue
            self.adapters.forget(run, version)
            REMOVED_VERSIONS.inc()
            removed.append(version)
        return removed
