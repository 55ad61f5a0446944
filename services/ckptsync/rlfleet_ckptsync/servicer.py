"""The sync contract."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import grpc
import redis

from rlfleet import limits
from rlfleet.registry import AdapterRecord
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
from rlfleet_ckptsync.state import LATEST_VERSION, SyncState


def _run(name: str) -> str:
    try:
        return validate_run_name(name)
    except InvalidRunName as exc:
        raise InvalidArgument(str(exc)) from exc


def _registry_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    """Redis unreachable (restarting, failing over) is UNAVAILABLE, which callers retry,
    not an INTERNAL error: the request was fine and nothing was recorded."""

    @functools.wraps(method)
    def wrapped(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise Unavailable(f"the fleet registry (Redis) is unreachable "
                              f"({type(exc).__name__}); retry") from exc

    return wrapped


def _ref(record: AdapterRecord) -> common_pb2.AdapterRef:
    return common_pb2.AdapterRef(run=record.run, version=record.version, path=record.path,
                                 sha256=record.sha256)


class SyncServicer(sync_pb2_grpc.SyncServiceServicer):
    def __init__(self, state: SyncState, poll_s: float = 0.05) -> None:
        self.state = state
        self.poll_s = poll_s

    @_registry_errors
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
        try:
            record = self.state.verify_and_record(run, ref.version)
        except AdapterVerificationError as exc:
            raise FailedPrecondition(f"adapter refused: {exc}") from exc
        if ref.sha256 and ref.sha256 != record.sha256:
            raise FailedPrecondition("manifest sha256 differs from the one the publisher sent")
        if not self.state.adapters.publish(record):
            latest = self.state.adapters.latest(run)
            if latest is None or latest.version != record.version or latest.sha256 != record.sha256:
                raise FailedPrecondition(
                    f"version {record.version} is not newer than the latest "
                    f"({latest.version if latest else '?'}); versions never go backwards")
            record = latest  # the same version again: idempotent
        LATEST_VERSION.labels(run).set(record.version)
        self.state.collect_garbage(run)
        return sync_pb2.PublishResponse(adapter=_ref(record), published_at=record.published_at)

    @_registry_errors
    def GetLatest(self, request: sync_pb2.GetLatestRequest, context):  # noqa: N802, ANN001
        run = _run(request.run)
        record = self.state.adapters.latest(run)
        if record is None:
            raise NotFound(f"no adapter published for run {run!r}")
        return _ref(record)

    @_registry_errors
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
        while True:
            serving = sorted(
                r.replica_id for r in self.state.replicas.live()
                if r.run == run and r.adapter_version >= request.version
            )
            if len(serving) >= request.min_replicas:
                break
            if time.monotonic() >= deadline or not context.is_active():
                raise DeadlineExceeded(
                    f"{len(serving)} of {request.min_replicas} replicas serve run {run!r} "
                    f"version >= {request.version} after {request.timeout_s}s")
            time.sleep(self.poll_s)
        latest = self.state.adapters.latest(run)
        lag = 0.0
        if latest is not None and latest.version == request.version:
            acks = self.state.adapters.acks(run, request.version)
            times = [acks[r] for r in serving if r in acks]
            if times:
                lag = max(0.0, max(times) - latest.published_at)
        return sync_pb2.WaitForReplicasResponse(
            replicas=len(serving), replica_ids=serving, publish_to_live_s=lag)

    @_registry_errors
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
        return sync_pb2.AcknowledgeResponse()
