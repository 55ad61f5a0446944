"""The ckpt-sync service process."""

from __future__ import annotations

import logging
import threading

from rlfleet.fleet import (
    AdapterDirectory,
    ReplicaDirectory,
    connect,
    fleet_signing_key,
    verify_credentials,
)
from rlfleet.rpc.server import GrpcServer
from rlfleet.storage import RunsRoot, clean_temp_dirs
from rlfleet.v1 import sync_pb2, sync_pb2_grpc
from rlfleet_ckptsync.servicer import SyncServicer
from rlfleet_ckptsync.settings import SyncSettings
from rlfleet_ckptsync.state import SyncState

SYNC_SERVICE = sync_pb2.DESCRIPTOR.services_by_name["SyncService"].full_name
log = logging.getLogger(__name__)


class Reconciler:
    """Every `reconcile_s`: re-announce from /shared what Redis lost, export replica
    versions and publish→live latency. Survives Redis outages (logs and tries again)."""

    def __init__(self, state: SyncState, period_s: float) -> None:
        self.state = state
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="reconcile", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def tick(self) -> None:
        self.state.rebuild()
        self.state.observe_replicas()

    def _loop(self) -> None:
        sweeps = 0
        while not self._stop.is_set():
            try:
                self.tick()
                if sweeps % 100 == 0:
                    for run in self.state.runs_root.list_runs():
                        clean_temp_dirs(self.state.runs_root.adapters_root(run))
                sweeps += 1
            except Exception as exc:  # noqa: BLE001 - keep reconciling through outages
                log.warning("reconcile failed; will retry", extra={"error": repr(exc)})
            self._stop.wait(self.period_s)


def make_server(settings: SyncSettings) -> tuple[GrpcServer, Reconciler]:
    client = connect(settings.redis_url)
    verify_credentials(client)  # a wrong password fails here, clearly (ConfigError)
    settings.runs_root.mkdir(parents=True, exist_ok=True)
    config = settings.server_config()
    # With the fleet's token, only signed heartbeats and acknowledgements count (Redis
    # alone proves nothing; the key is derived from the token and never stored there).
    key = fleet_signing_key(config.auth_token)
    state = SyncState(RunsRoot(settings.runs_root), AdapterDirectory(client, key),
                      ReplicaDirectory(client, key), keep_last=settings.keep_last,
                      gc_delay_s=settings.gc_delay_s)
    servicer = SyncServicer(state)
    server = GrpcServer(
        "ckptsync", config,
        [lambda s: sync_pb2_grpc.add_SyncServiceServicer_to_server(servicer, s) or SYNC_SERVICE],
    )
    return server, Reconciler(state, settings.reconcile_s)
