"""Publishing adapter versions: write to /shared atomically, tell ckpt-sync, and (in sync
mode) wait until enough replicas serve the version.

ckpt-sync answers UNAVAILABLE (or RESOURCE_EXHAUSTED) when it cannot record a version now:
Redis unreachable, or full (maxmemory with noeviction). The version is on /shared
already, so the announcement is retried with a growing back-off for up to
`announce_retry_s` (each attempt logged with ckpt-sync's reason), not given up after the
client's few quick retries (its channel's retry policy: at most 5 attempts within one
call's deadline, on UNAVAILABLE only; an outage of Redis lasts minutes)."""

from __future__ import annotations

import errno
import logging
import time
from dataclasses import dataclass, field

from rlfleet.clients.sync import SyncClient
from rlfleet.rpc.errors import ResourceExhausted, RpcError, Unavailable
from rlfleet.storage import (
    DestinationExists,
    RunsRoot,
    StorageError,
    is_transient,
    list_versions,
    publish_adapter_dir,
    retry,
)

log = logging.getLogger(__name__)

# ckpt-sync could not record the version now (the registry is down or full): retry.
RETRY_ANNOUNCE = (Unavailable, ResourceExhausted)


# A permission error on /shared (a volume mounted read-only or with the wrong owner for a
# moment, an operator fixing an fsGroup) is retried like a full disk, a bounded number of
# times: the learner would otherwise lose the step's weights.
PERMISSION_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


def retry_write(exc: BaseException) -> bool:
    if isinstance(exc, DestinationExists):
        return False
    return is_transient(exc) or (isinstance(exc, OSError) and exc.errno in PERMISSION_ERRNOS)


@dataclass
class Published:
    version: int
    sha256: str
    write_s: float
    publish_to_live_s: float = 0.0
    announce_s: float = 0.0  # the ckpt-sync Publish call (it verifies, then announces)
    stages: dict[str, float] = field(default_factory=dict)  # of the write, in seconds


class AdapterPublisher:
    def __init__(self, runs_root: RunsRoot, run: str, base_model: str, sync: SyncClient,
                 *, announce_retry_s: float = 600.0, max_backoff_s: float = 10.0) -> None:
        self.root = runs_root
        self.run = run
        self.base_model = base_model
        self.sync = sync
        self.announce_retry_s = announce_retry_s
        self.max_backoff_s = max_backoff_s
        self.announce_retries = 0  # Publish calls re-sent after a retryable answer

    def next_version(self, at_least: int) -> int:
        existing = list_versions(self.root, self.run)
        return max([at_least, *(v + 1 for v in existing)])

    def publish(self, files: dict[str, bytes], step: int, version: int) -> Published:
        """Writes version `version` (or the next free one) and announces it. A full disk
        or permission error is retried; nothing half-written is ever announced."""
        start = time.perf_counter()
        stages: dict[str, float] = {}
        while True:
            try:
                manifest = retry(lambda v=version: publish_adapter_dir(
                    self.root, self.run, v, files, base_model=self.base_model, step=step,
                    timings=stages),
                    retry_on=retry_write)
                break
            except DestinationExists:  # someone (a crashed earlier run) took the number
                version = self.next_version(version + 1)
            except StorageError as exc:
                raise RuntimeError(f"cannot write adapter version {version}: {exc}") from exc
        written = time.perf_counter() - start
        announce_start = time.perf_counter()
        self._announce(version, manifest.manifest_sha256)
        return Published(version, manifest.manifest_sha256, written,
                         announce_s=time.perf_counter() - announce_start, stages=stages)

    def _announce(self, version: int, sha256: str) -> None:
        """Publish through ckpt-sync, retrying UNAVAILABLE / RESOURCE_EXHAUSTED (the
        registry down or full) for up to announce_retry_s; other answers are final."""
        deadline = time.monotonic() + self.announce_retry_s
        attempt = 0
        while True:
            try:
                self.sync.publish(self.run, version, sha256=sha256)
                if attempt:
                    log.warning("adapter version announced after retries",
                                extra={"version": version, "retries": attempt})
                return
            except RETRY_ANNOUNCE as err:
                code, details = err.code, err.message
                attempt += 1
                left = deadline - time.monotonic()
                if left <= 0:
                    log.error("ckpt-sync could not record the adapter version; giving up",
                              extra={"version": version, "code": code.name,
                                     "details": details, "attempts": attempt})
                    raise
                self.announce_retries += 1
                delay = min(self.max_backoff_s, 0.5 * 2 ** (attempt - 1), left)
                log.warning("ckpt-sync cannot record the adapter version now; retrying",
                            extra={"version": version, "code": code.name, "details": details,
                                   "attempt": attempt, "retry_in_s": round(delay, 2)})
                time.sleep(delay)

    def wait_live(self, version: int, min_replicas: int, timeout_s: float) -> float:
        """Blocks until `min_replicas` serve `version`; the publish→live seconds."""
        try:
            reply = self.sync.wait_for_replicas(self.run, version, min_replicas, timeout_s)
        except RpcError as err:  # DeadlineExceeded: too few replicas in time
            raise RuntimeError(f"replicas did not load version {version}: {err.message}"
                               ) from err
        return reply.publish_to_live_s
