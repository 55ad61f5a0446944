"""The replica's LoRA adapters: verify, load, swap, and unload when no episode uses them.

A version is loaded only from a private copy whose every file matched the manifest's
sha256 (so nothing can change between the check and the load), only if it is newer than
the live one, and only then becomes live. Episodes hold the version they started with
until they finish; an old adapter is unloaded when its last episode releases it.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter, Gauge

from rlfleet.registry import AdapterRecord
from rlfleet.storage import (
    AdapterVerificationError,
    PathOutsideRunsRoot,
    RunsRoot,
    verify_adapter_dir,
)
from rlfleet_rollout.batcher import GenerationBatcher

log = logging.getLogger(__name__)

ADAPTER_VERSION = Gauge("rlfleet_rollout_adapter_version", "adapter version this replica serves",
                        ["replica"])
ADAPTER_LOADS = Counter("rlfleet_rollout_adapter_loads_total", "adapter loads", ["outcome"])


class AdapterRefused(Exception):
    """A version that must not be served (bad path, bad hash, older than live)."""


@dataclass(frozen=True)
class LiveAdapter:
    run: str
    version: int  # 0 = the base model
    sha256: str = ""
    path: str = ""
    engine_name: str | None = None  # name inside the engine; None = base model

    @classmethod
    def base(cls, run: str) -> LiveAdapter:
        return cls(run, 0)


class AdapterManager:
    def __init__(self, batcher: GenerationBatcher, runs_root: RunsRoot, run: str,
                 replica_id: str, on_live: Callable[[LiveAdapter], None] | None = None) -> None:
        self.batcher = batcher
        self.runs_root = runs_root
        self.run = run
        self.replica_id = replica_id
        self.on_live = on_live
        self.current = LiveAdapter.base(run)
        self._users: dict[str | None, int] = {}
        self._retired: set[str] = set()
        self._cond = threading.Condition()
        self._load_lock = threading.Lock()
        self._staging = Path(tempfile.mkdtemp(prefix="rlfleet-adapters-"))
        ADAPTER_VERSION.labels(replica_id).set(0)

    # -- episodes ------------------------------------------------------------------

    def acquire(self) -> LiveAdapter:
        with self._cond:
            adapter = self.current
            self._users[adapter.engine_name] = self._users.get(adapter.engine_name, 0) + 1
            return adapter

    def release(self, adapter: LiveAdapter) -> None:
        with self._cond:
            n = self._users.get(adapter.engine_name, 0) - 1
            self._users[adapter.engine_name] = max(n, 0)
            unload = n <= 0 and adapter.engine_name in self._retired
            if unload:
                self._retired.discard(adapter.engine_name)
        if unload:
            self._unload(adapter.engine_name)

    def wait_for(self, min_version: int, timeout_s: float) -> LiveAdapter | None:
        """The live adapter once it is at least `min_version`, or None after the timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.current.version < min_version:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return self.current

    # -- loading -------------------------------------------------------------------

    def load(self, record: AdapterRecord) -> LiveAdapter:
        """Verifies and loads `record`, then makes it live. Raises AdapterRefused."""
        with self._load_lock:
            if record.run != self.run:
                raise AdapterRefused(f"version is for run {record.run!r}, not {self.run!r}")
            if record.version <= self.current.version:
                raise AdapterRefused(
                    f"version {record.version} is not newer than live {self.current.version}")
            try:
                source = self.runs_root.resolve(record.path)
            except PathOutsideRunsRoot as exc:
                ADAPTER_LOADS.labels("refused").inc()
                raise AdapterRefused(str(exc)) from exc
            name = f"{record.run}@v{record.version:06d}"
            local = self._staging / name
            try:
                self._stage(source, local, record)
            except (AdapterVerificationError, OSError) as exc:
                ADAPTER_LOADS.labels("refused").inc()
                shutil.rmtree(local, ignore_errors=True)
                raise AdapterRefused(f"version {record.version} refused: {exc}") from exc
            self.batcher.call(lambda engine: engine.load_adapter(name, str(local)))
            adapter = LiveAdapter(record.run, record.version, record.sha256, record.path, name)
            with self._cond:
                old = self.current
                self.current = adapter
                self._cond.notify_all()
                unload_now = old.engine_name is not None and not self._users.get(old.engine_name)
                if old.engine_name is not None and not unload_now:
                    self._retired.add(old.engine_name)
            if unload_now:
                self._unload(old.engine_name)
            ADAPTER_LOADS.labels("loaded").inc()
            ADAPTER_VERSION.labels(self.replica_id).set(adapter.version)
            log.info("adapter live", extra={"run": record.run, "version": record.version})
            if self.on_live is not None:
                self.on_live(adapter)
            return adapter

    def _stage(self, source: Path, local: Path, record: AdapterRecord) -> None:
        """Copies the version to a private dir and verifies the copy (what is loaded is
        exactly what was checked)."""
        shutil.rmtree(local, ignore_errors=True)
        shutil.copytree(source, local, symlinks=True)
        manifest = verify_adapter_dir(local, expected_sha256=record.sha256)
        if manifest.run != record.run or manifest.version != record.version:
            raise AdapterVerificationError(
                f"manifest names run {manifest.run!r} version {manifest.version}")

    def _unload(self, engine_name: str | None) -> None:
        if engine_name is None:
            return
        try:
            self.batcher.call(lambda engine: engine.unload_adapter(engine_name))
        except Exception as exc:  # noqa: BLE001 - a failed unload only costs memory
            log.warning("unload failed", extra={"adapter": engine_name, "error": repr(exc)})
        shutil.rmtree(self._staging / engine_name, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self._staging, ignore_errors=True)
