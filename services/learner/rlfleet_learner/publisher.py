"""Publishing adapter versions: write to /shared atomically, tell ckpt-sync, and (in sync
mode) wait until enough replicas serve the version.

Every call to ckpt-sync is idempotent (`SyncClient.IDEMPOTENT`), so every transient answer
is retried: UNAVAILABLE or RESOURCE_EXHAUSTED (Redis unreachable or full), and
DEADLINE_EXCEEDED (ckpt-sync hung: SIGSTOPped, a stalled node). The version is on /shared
already, so the calls are retried with a growing back-off for up to `announce_retry_s` in
all (each attempt logged with the reason), not given up after the client's few quick
retries (its channel's retry policy: UNAVAILABLE only, within one call's deadline); past
that bound `PublishFailed` (a `FleetFailure`: the learner checkpoints and stops).

Waiting for replicas (`wait_live`) never waits for a replica whose heartbeat expired, and
does not stop the run when fewer than `min_replicas` serve the version: it trains on with
those that do (`Live.short`), and only when none does waits for a replacement, then raises
`ReplicasLost`."""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from rlfleet.clients.sync import SyncClient
from rlfleet.rpc.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    ResourceExhausted,
    Unavailable,
)
from rlfleet.storage import (
    DestinationExists,
    RunsRoot,
    StorageError,
    is_transient,
    list_versions,
    publish_adapter_dir,
    retry,
)
from rlfleet.storage.lease import RunLease
from rlfleet.v1 import sync_pb2
from rlfleet_learner.faults import PublishFailed, ReplicasLost, disk_failure

log = logging.getLogger(__name__)
T = TypeVar("T")

# ckpt-sync could not answer now (the fleet store down or full, ckpt-sync itself hung): retry.
RETRY_ANNOUNCE = (Unavailable, ResourceExhausted, DeadlineExceeded)
# How long one WaitForReplicas call waits: between calls the learner looks at which
# replicas still heartbeat, so a replica that died or hangs is not waited for.
WAIT_SLICE_S = 2.0


def is_wait_answer(err: Exception) -> bool:
    """ckpt-sync's own answer to WaitForReplicas that too few replicas serve the version
    yet (its message counts them), as opposed to the call's deadline passing with no
    answer at all (ckpt-sync hung)."""
    return isinstance(err, DeadlineExceeded) and "replicas serve run" in err.message


# A permission error on /shared (a volume mounted read-only or with the wrong owner for a
# moment, an operator fixing an fsGroup) is retried like a full disk, a bounded number of
# times: the learner would otherwise lose the step's weights.
PERMISSION_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


def retry_write(exc: BaseException) -> bool:
    if isinstance(exc, DestinationExists):
        return False
    return is_transient(exc) or (isinstance(exc, OSError) and exc.errno in PERMISSION_ERRNOS)


@dataclass
class Live:
    """The replicas that serve a version when the learner goes on. `short`: fewer than
    the `wanted` ones (the others died, hang, or did not load it in time)."""

    replica_ids: list[str]
    wanted: int
    publish_to_live_s: float
    short: bool = False
    refusals: list[str] = field(default_factory=list)  # "replica: reason" (ckpt-sync's)


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
                 *, announce_retry_s: float = 600.0, max_backoff_s: float = 10.0,
                 call_timeout_s: float = 60.0) -> None:
        self.root = runs_root
        self.run = run
        self.base_model = base_model
        self.sync = sync
        self.announce_retry_s = announce_retry_s
        self.max_backoff_s = max_backoff_s
        self.call_timeout_s = call_timeout_s  # one call's deadline (cut to the bound)
        self.announce_retries = 0  # calls re-sent after a transient answer
        # The run's lease: checked before each version is written, its generation
        # recorded in the manifest (ckpt-sync announces no older generation than the
        # run's); the base model's fingerprint too (replicas of another model refuse it).
        self.lease: RunLease | None = None
        self.base_sha256: str | None = None

    def next_version(self, at_least: int) -> int:
        existing = list_versions(self.root, self.run)
        return max([at_least, *(v + 1 for v in existing)])

    def publish(self, files: dict[str, bytes], step: int, version: int) -> Published:
        """Writes version `version` (or the next free one) and announces it. A full disk
        or permission error is retried; nothing half-written is ever announced."""
        start = time.perf_counter()
        stages: dict[str, float] = {}
        if self.lease is not None:
            self.lease.ensure_held()  # LeaseLost: a fenced-off learner writes no version
        generation = self.lease.generation if self.lease is not None else None
        while True:
            try:
                manifest = retry(lambda v=version: publish_adapter_dir(
                    self.root, self.run, v, files, base_model=self.base_model, step=step,
                    timings=stages, generation=generation, base_sha256=self.base_sha256),
                    retry_on=retry_write)
                break
            except DestinationExists:  # someone (a crashed earlier run) took the number
                version = self.next_version(version + 1)
            except StorageError as exc:
                raise (disk_failure(exc, f"adapter version {version}") or RuntimeError(
                    f"cannot write adapter version {version}: {exc}")) from exc
        written = time.perf_counter() - start
        announce_start = time.perf_counter()
        try:
            self._announce(version, manifest.manifest_sha256)
        except FailedPrecondition:
            if self.lease is not None:  # refused as a fenced-off learner's: LeaseLost
                self.lease.ensure_held()
            raise
        return Published(version, manifest.manifest_sha256, written,
                         announce_s=time.perf_counter() - announce_start, stages=stages)

    def _announce(self, version: int, sha256: str) -> None:
        """Publish through ckpt-sync, retrying transient answers (`_retrying`); other
        answers (a refused verification) are final."""
        self._retrying(f"announcing adapter version {version}", "record the adapter version",
                       lambda timeout_s: self.sync.publish(self.run, version, sha256=sha256,
                                                           timeout_s=timeout_s))

    def _retrying(self, what: str, doing: str, call: Callable[[float], T]) -> T:
        """`call(timeout_s)`, re-sent on RETRY_ANNOUNCE answers with a growing back-off
        for up to announce_retry_s in all (each call's deadline cut to what is left);
        PublishFailed after that. ckpt-sync's own "too few replicas" answer is returned to
        the caller (it is an answer, not a failure)."""
        deadline = time.monotonic() + self.announce_retry_s
        attempt = 0
        while True:
            left = deadline - time.monotonic()
            try:
                result = call(max(1.0, min(self.call_timeout_s, left)))
                if attempt:
                    log.warning("ckpt-sync answered after retries",
                                extra={"what": what, "retries": attempt})
                return result
            except RETRY_ANNOUNCE as err:
                if is_wait_answer(err):
                    raise
                attempt += 1
                left = deadline - time.monotonic()
                if left <= 0:
                    log.error("ckpt-sync did not answer; giving up",
                              extra={"what": what, "code": err.code.name,
                                     "details": err.message, "attempts": attempt})
                    raise PublishFailed(
                        f"ckpt-sync at {self.sync.address} did not answer {what} within "
                        f"{self.announce_retry_s:g}s ({attempt} attempts; last: "
                        f"{err.code.name}: {err.message})") from err
                self.announce_retries += 1
                delay = min(self.max_backoff_s, 0.5 * 2 ** (attempt - 1), left)
                log.warning("ckpt-sync cannot %s now; retrying", doing,
                            extra={"what": what, "code": err.code.name,
                                   "details": err.message, "attempt": attempt,
                                   "retry_in_s": round(delay, 2)})
                time.sleep(delay)

    def _serving(self, version: int, n: int, timeout_s: float
                 ) -> sync_pb2.WaitForReplicasResponse | None:
        """ckpt-sync's WaitForReplicas for `n` replicas; None when fewer serve `version`
        after `timeout_s`."""
        try:
            return self._retrying(
                f"waiting for replicas to serve adapter version {version}",
                "answer the wait for replicas",
                lambda call_s: self.sync.wait_for_replicas(self.run, version, n, timeout_s))
        except DeadlineExceeded as err:
            if is_wait_answer(err):
                return None
            raise

    def wait_live(self, version: int, min_replicas: int, timeout_s: float, *,
                  live_ids: Callable[[], set[str]] | None = None,
                  replacement_wait_s: float = 0.0) -> Live:
        """Blocks until `min_replicas` serve `version` (or newer), and returns them.

        Goes on with fewer (`Live.short`) when every replica that still heartbeats serves
        it (`live_ids`: the others died or hang; not waited for), or when `timeout_s` has
        passed and at least one serves it. When none does by then, waits up to
        `replacement_wait_s` more for one; then ReplicasLost."""
        start = time.monotonic()
        deadline = start + timeout_s
        while True:
            slice_s = max(0.0, min(WAIT_SLICE_S, deadline - time.monotonic()))
            reply = self._serving(version, min_replicas, slice_s)
            if reply is not None:
                return Live(list(reply.replica_ids), min_replicas, reply.publish_to_live_s)
            now = self._serving(version, 1, 0.0)
            serving = list(now.replica_ids) if now is not None else []
            alive = live_ids() if live_ids is not None else None
            refusals = [f"{r.replica_id} refused version {r.version}: {r.reason}"
                        for r in (now.refusals if now is not None else ())]
            if serving and alive is not None and alive <= set(serving):
                return Live(serving, min_replicas, time.monotonic() - start, short=True,
                            refusals=refusals)
            if time.monotonic() >= deadline:
                if serving:
                    return Live(serving, min_replicas, time.monotonic() - start, short=True,
                                refusals=refusals)
                break
        log.warning("no replica serves the new adapter version; waiting for a replacement",
                    extra={"version": version, "wanted": min_replicas,
                           "replacement_wait_s": replacement_wait_s})
        end = time.monotonic() + replacement_wait_s
        while True:
            reply = self._serving(version, 1, max(0.0, min(WAIT_SLICE_S,
                                                              end - time.monotonic())))
            if reply is not None:
                return Live(list(reply.replica_ids), min_replicas,
                            time.monotonic() - start, short=min_replicas > reply.replicas)
            if time.monotonic() >= end:
                raise ReplicasLost(
                    f"no replica serves adapter version {version} of run {self.run!r} "
                    f"after {timeout_s:g}s, nor after {replacement_wait_s:g}s more waiting "
                    f"for a replacement (wanted {min_replicas}){self._refusals(version)}")

    def _refusals(self, version: int) -> str:
        """"; <ckpt-sync's answer>" naming the replicas that refused `version` and why (a
        version trained on another base model...), "" when none did or it cannot say."""
        try:
            self.sync.wait_for_replicas(self.run, version, 1, 0.0)
        except DeadlineExceeded as err:
            return f"; {err.message}" if "refused version" in err.message else ""
        except Exception:  # noqa: BLE001 - only words for the error being raised
            log.debug("refusals unreadable", exc_info=True)
        return ""
