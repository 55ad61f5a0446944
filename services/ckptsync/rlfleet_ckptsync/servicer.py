"""The sync contract."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
import redis

from rlfleet import limits
from rlfleet.fleet import AdapterRecord, fleet_unavailable_reason
from rlfleet.fleet.adapter_records import Refusal
from rlfleet.rpc.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from rlfleet.storage import (
    AdapterVerificationError,
    InvalidRunName,
    PathOutsideRunsRoot,
    validate_run_name,
)
from rlfleet.v1 import common_pb2, sync_pb2, sync_pb2_grpc
from rlfleet_ckptsync.state import LATEST_VERSION, PUBLISH_STAGE, NotNewer, SyncState

log = logging.getLogger(__name__)


def _run(name: str) -> str:
    try:
        return validate_run_name(name)
    except InvalidRunName as exc:
        raise InvalidArgument(str(exc)) from exc


def _fleet_store_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    """Redis unreachable (restarting, failing over), full (maxmemory with noeviction: OOM
    on every write), read-only or loading is UNAVAILABLE with a message naming the cause,
    which callers retry, not an INTERNAL error: the request was fine, the fleet store
    cannot record it now."""

    @functools.wraps(method)
    def wrapped(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except redis.RedisError as exc:
            reason = fleet_unavailable_reason(exc)
            if reason is None:
                raise
            log.warning("fleet store refused a call", extra={
                "method": method.__name__, "reason": reason, "error": str(exc)[:300]})
            raise Unavailable(f"{reason}; retry") from exc

    return wrapped


def _ref(record: AdapterRecord) -> common_pb2.AdapterRef:
    return common_pb2.AdapterRef(run=record.run, version=record.version, path=record.path,
                                 sha256=record.sha256)


class SyncServicer(sync_pb2_grpc.SyncServiceServicer):
    def __init__(self, state: SyncState, recheck_s: float = 0.5) -> None:
        """`recheck_s`: how often WaitForReplicas looks again without an ack event (it
        wakes on every acknowledgement; the re-check covers replicas that only heartbeat,
        e.g. when their Acknowledge call failed, and notices a cancelled caller)."""
        self.state = state
        self.recheck_s = recheck_s

    @_fleet_store_errors
    def Publish(self, request: sync_pb2.PublishRequest, context: grpc.ServicerContext):  # noqa: N802
        ref = request.adapter
        run = _run(ref.run)
        if ref.version < 1:
            raise InvalidArgument(f"version must be >= 1, got {ref.version}")
        try:  # a version dir planted as a symlink to outside resolves outside the root
            expected = self.state.runs_root.adapter_dir(run, ref.version)
        except PathOutsideRunsRoot as exc:
            raise InvalidArgument(str(exc)) from exc
        if ref.path:
            try:
                given = self.state.runs_root.resolve(ref.path)
            except PathOutsideRunsRoot as exc:
                raise InvalidArgument(str(exc)) from exc
            if given != expected:
                raise InvalidArgument(f"path {ref.path!r} is not where version {ref.version} "
                                      f"of run {run!r} lives ({expected})")
        if not expected.is_dir():
            raise NotFound(f"no adapter directory for run {run!r} version {ref.version}")
        received_at = time.time()
        t0 = time.perf_counter()
        self._hint_pending(run, ref.version, expected, ref.sha256)
        try:
            record = self.state.verify_and_record(run, ref.version)
        except AdapterVerificationError as exc:
            raise FailedPrecondition(f"adapter refused: {exc}") from exc
        if ref.sha256 and ref.sha256 != record.sha256:
            raise FailedPrecondition("manifest sha256 differs from the one the publisher sent")
        t1 = time.perf_counter()
        try:  # /shared decides: a latest that /shared does not hold cannot refuse this
            record = self.state.announce(record)
        except NotNewer as exc:
            raise FailedPrecondition(
                f"version {record.version} is not newer than the latest "
                f"({exc.latest.version}); versions never go backwards") from exc
        LATEST_VERSION.labels(run).set(record.version)
        t2 = time.perf_counter()
        self.state.schedule_gc(run)  # later, once the replicas have moved to it
        stages = {"verify_s": t1 - t0, "announce_s": t2 - t1}
        for stage, seconds in stages.items():
            PUBLISH_STAGE.labels(stage.removesuffix("_s")).observe(seconds)
        log.info("publish stages", extra={"run": run, "version": record.version,
                                          "received_at": received_at,
                                          "published_at": record.published_at,
                                          "stages": stages})
        return sync_pb2.PublishResponse(adapter=_ref(record), published_at=record.published_at)

    def _hint_pending(self, run: str, version: int, path: Any, sha256: str) -> None:
        """Before verifying: tells replicas which version is coming (a PendingVersion
        hint), so they read and hash it while ckpt-sync does; they serve nothing until the
        announcement. Best effort: a lost hint only costs that head start."""
        try:
            self.state.adapters.hint_pending(AdapterRecord(
                run=run, version=version, sha256=sha256,
                path=str(path.relative_to(self.state.runs_root.root))))
        except (redis.RedisError, ValueError) as exc:
            log.warning("pending hint not sent", extra={"run": run, "error": repr(exc)})

    @_fleet_store_errors
    def GetLatest(self, request: sync_pb2.GetLatestRequest, context):  # noqa: N802, ANN001
        run = _run(request.run)
        record = self.state.adapters.latest(run)
        if record is None:
            raise NotFound(f"no adapter published for run {run!r}")
        return _ref(record)

    @_fleet_store_errors
    def WaitForReplicas(self, request: sync_pb2.WaitForReplicasRequest, context):  # noqa: N802, ANN001
        run = _run(request.run)
        if not 1 <= request.min_replicas <= limits.MAX_REPLICAS:
            raise InvalidArgument(f"min_replicas must be in 1..{limits.MAX_REPLICAS}")
        if not 0 <= request.timeout_s <= limits.MAX_WAIT_S:
            raise InvalidArgument(f"timeout_s must be in 0..{limits.MAX_WAIT_S}")
        deadline = time.monotonic() + request.timeout_s
        remaining = context.time_remaining()
        if remaining is not None:
            deadline = min(deadline, time.monotonic() + remaining)
        # Event-driven: subscribed before the first look, woken by every acknowledgement
        # (a replica heartbeats its new version before it acknowledges), re-checking every
        # `recheck_s` at the latest. Only verified heartbeats count (with the fleet's
        # token, `replicas.live()` drops any whose signature does not verify).
        with self.state.adapters.ack_waiter(run) as acks:
            while True:
                serving = sorted(
                    r.replica_id for r in self.state.replicas.live()
                    if r.run == run and r.adapter_version >= request.version
                )
                if len(serving) >= request.min_replicas:
                    break
                left = deadline - time.monotonic()
                if left <= 0 or not context.is_active():
                    refused = "".join(
                        f"; replica {r.replica_id} refused version {r.version} "
                        f"({r.attempts} attempts): {r.reason}"
                        for r in self._refusals(run, request.version, serving))
                    raise DeadlineExceeded(
                        f"{len(serving)} of {request.min_replicas} replicas serve run "
                        f"{run!r} version >= {request.version} after {request.timeout_s}s"
                        + refused)
                acks.wait(min(left, self.recheck_s))
        latest = self.state.adapters.latest(run)
        lag = 0.0
        if latest is not None and latest.version == request.version:
            acks = self.state.adapters.acks(run, request.version)
            times = [acks[r] for r in serving if r in acks]
            if times:
                lag = max(0.0, max(times) - latest.published_at)
        return sync_pb2.WaitForReplicasResponse(
            replicas=len(serving), replica_ids=serving, publish_to_live_s=lag,
            refusals=[sync_pb2.Refusal(replica_id=r.replica_id, version=r.version,
                                       reason=r.reason, attempts=r.attempts)
                      for r in self._refusals(run, request.version, serving)])

    def _refusals(self, run: str, version: int, serving: list[str]) -> list[Refusal]:
        """Who refused `version` and does not serve it (a replica that loaded it on a
        later attempt is not reported)."""
        return [r for r in self.state.adapters.refusals(run, version)
                if r.replica_id not in serving]

    @_fleet_store_errors
    def Acknowledge(self, request: sync_pb2.AcknowledgeRequest, context):  # noqa: N802, ANN001
        ref = request.adapter
        run = _run(ref.run)
        if not request.replica_id or len(request.replica_id) > 128:
            raise InvalidArgument("replica_id must be 1..128 characters")
        known = {r.version: r for r in self.state.adapters.history(run)}
        record = known.get(ref.version)
        if record is None:
            raise NotFound(f"run {run!r} has no published version {ref.version}")
        if ref.sha256 and ref.sha256 != record.sha256:
            raise FailedPrecondition("acknowledged sha256 differs from the published one")
        self.state.adapters.acknowledge(run, ref.version, request.replica_id)
        self.state.acknowledged(run, ref.version)  # the last one may start a collection
        return sync_pb2.AcknowledgeResponse()
