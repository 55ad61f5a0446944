"""Publishing adapter versions: write to /shared atomically, tell ckpt-sync, and (in sync
mode) wait until enough replicas serve the version."""

from __future__ import annotations

import errno
import logging
import time
from dataclasses import dataclass, field

import grpc

from rlfleet.rpc.client import RpcClient
from rlfleet.storage import (
    DestinationExists,
    RunsRoot,
    StorageError,
    is_transient,
    list_versions,
    publish_adapter_dir,
    retry,
)
from rlfleet.v1 import common_pb2, sync_pb2, sync_pb2_grpc

log = logging.getLogger(__name__)


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
    def __init__(self, runs_root: RunsRoot, run: str, base_model: str, sync: RpcClient
                 ) -> None:
        self.root = runs_root
        self.run = run
        self.base_model = base_model
        self.sync = sync

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
        self.sync.call(sync_pb2_grpc.SyncServiceStub, "Publish", sync_pb2.PublishRequest(
            adapter=common_pb2.AdapterRef(run=self.run, version=version,
                                          sha256=manifest.manifest_sha256)))
        return Published(version, manifest.manifest_sha256, written,
                         announce_s=time.perf_counter() - announce_start, stages=stages)

    def wait_live(self, version: int, min_replicas: int, timeout_s: float) -> float:
        """Blocks until `min_replicas` serve `version`; the publish→live seconds."""
        try:
            reply = self.sync.call(
                sync_pb2_grpc.SyncServiceStub, "WaitForReplicas",
                sync_pb2.WaitForReplicasRequest(run=self.run, version=version,
                                                min_replicas=min_replicas,
                                                timeout_s=timeout_s),
                timeout_s=timeout_s + 10)
        except grpc.RpcError as err:
            raise RuntimeError(f"replicas did not load version {version}: {err.details()}"
                               ) from err
        return reply.publish_to_live_s
