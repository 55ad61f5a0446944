"""The replica's LoRA adapters: verify, load, swap, and unload when no episode uses them.

A version is read from the runs root once, into private memory, hashed while it is read,
and checked against its manifest (every file's sha256 and size, the manifest's own sha256
against the announced identity, run and version) before anything is loaded; the engine
then loads exactly those verified bytes (the hf engine straight from memory; an engine
that needs a directory, vLLM, gets a private copy written from them), so nothing can
change between the check and the load and nothing is read twice. Only a version newer
than the live one is loaded, and only once loaded does it become live; a failed load
leaves the old one serving. Episodes hold the version they started with until they
finish; an old adapter is unloaded when its last episode releases it (after the new one
is acknowledged: unloading is off the publish → live path). With a staleness bound
(``max_staleness``, the learner's), a version older than ``live - max_staleness`` is
unloaded as soon as a newer one is live, even while episodes hold it: the learner drops
whatever it would still produce, and the engine keeps at most ``max_staleness + 1``
versions (vLLM's ``max_loras`` slots). Its groups end with FAILED_PRECONDITION (the pool
retries them on the live version); see `is_evicted`.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from rlfleet.fleet import AdapterRecord
from rlfleet.storage import (
    AdapterVerificationError,
    PathOutsideRunsRoot,
    RunsRoot,
)
from rlfleet.storage.adapter_versions import MANIFEST_FILE, VerifiedAdapter, read_verified_adapter
from rlfleet.storage.atomic import write_file
from rlfleet_rollout.batcher import DirectGeneration, GenerationBatcher

log = logging.getLogger(__name__)

ADAPTER_VERSION = Gauge("rlfleet_rollout_adapter_version", "adapter version this replica serves",
                        ["replica"])
ADAPTER_LOADS = Counter("rlfleet_rollout_adapter_loads_total", "adapter loads", ["outcome"])
ADAPTER_STAGE = Histogram(
    "rlfleet_rollout_adapter_stage_seconds",
    "seconds per stage of loading an adapter version (read_verify: read every file once "
    "and hash it; private_copy: only for engines that load from a dir; engine_load; "
    "ack: heartbeat + Acknowledge; unload_old)",
    ["stage"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
)


class AdapterRefused(Exception):
    """A version that must not be served (bad path, bad hash, older than live)."""


class OtherBaseModel(AdapterRefused):
    """A version trained on another base model than the one this replica serves."""


@dataclass
class Prefetch:
    """A version being read and verified against its own manifest ahead of its
    announcement (on ckpt-sync's PendingVersion hint). It serves nothing by itself: `load`
    takes its bytes only when the announced identity, run, version and path match."""

    record: AdapterRecord
    future: Future
    hinted_at: float
    started_at: float = 0.0
    finished_at: float = 0.0


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
    def __init__(self, batcher: GenerationBatcher | DirectGeneration, runs_root: RunsRoot,
                 run: str, replica_id: str,
                 on_live: Callable[[LiveAdapter], None] | None = None,
                 max_staleness: int | None = None, base_sha256: str | None = None) -> None:
        """`base_sha256`: the fingerprint of the replica's model
        (rlfleet.policy.fingerprint); a version whose manifest names another base is
        refused (None: not checked)."""
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.batcher = batcher
        self.max_staleness = max_staleness
        self.base_sha256 = base_sha256
        self._other_base: dict[int, str] = {}  # version -> why it was refused
        self.runs_root = runs_root
        self.run = run
        self.replica_id = replica_id
        self.on_live = on_live
        self.current = LiveAdapter.base(run)
        self._users: dict[str | None, int] = {}
        self._retired: dict[str, int] = {}  # engine name -> version, unloaded when unused
        self._evicted: set[str] = set()  # unloaded while in use: beyond the staleness bound
        self._waits_over = False  # no version is coming (the engine died): waits end now
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
                self._retired.pop(adapter.engine_name)
            elif n <= 0 and adapter.engine_name in self._evicted:
                # already unloaded from the engine; its private copy can go now
                self._evicted.discard(adapter.engine_name)
                shutil.rmtree(self._staging / str(adapter.engine_name), ignore_errors=True)
        if unload:
            self._unload(adapter.engine_name)

    def is_evicted(self, adapter: LiveAdapter) -> bool:
        """True when ``adapter`` was unloaded while episodes held it, because a newer
        version made it older than the staleness bound: those episodes must stop."""
        with self._cond:
            return adapter.engine_name in self._evicted

    def wait_for(self, min_version: int, timeout_s: float) -> LiveAdapter | None:
        """The live adapter once it is at least `min_version`, or None after the timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.current.version < min_version:
                if min_version in self._other_base:
                    return None  # it never will be served here: refusal_note says why
                left = deadline - time.monotonic()
                if left <= 0 or self._waits_over:
                    return None
                self._cond.wait(left)
            return self.current

    def end_waits(self) -> None:
        """No newer version will load (the engine died): every `wait_for`, now and
        later, that a newer version would end returns None at once."""
        with self._cond:
            self._waits_over = True
            self._cond.notify_all()

    def refusal_note(self, version: int) -> str:
        """"; <why>" when `version` was refused for its base model, else ""."""
        with self._cond:
            why = self._other_base.get(version)
        return f"; {why}" if why else ""

    def _check_base(self, verified: VerifiedAdapter) -> None:
        """OtherBaseModel when the version's manifest names another base model."""
        m = verified.manifest
        if self.base_sha256 is None or m.base_sha256 is None \
                or m.base_sha256 == self.base_sha256:
            return
        why = (f"version {m.version} of run {m.run!r} was trained on another base model "
               f"({m.base_model}, sha256 {m.base_sha256[:12]}) than this replica serves "
               f"(sha256 {self.base_sha256[:12]})")
        with self._cond:
            self._other_base[m.version] = why
            self._cond.notify_all()
        ADAPTER_LOADS.labels("refused").inc()
        raise OtherBaseModel(why)

    # -- loading -------------------------------------------------------------------

    def start_prefetch(self, record: AdapterRecord, executor: Executor,
                       hinted_at: float | None = None) -> Prefetch:
        """Starts reading and verifying `record` (a hint) on `executor`; see Prefetch."""
        prefetch = Prefetch(record, Future(), hinted_at or time.time())

        def run() -> VerifiedAdapter:
            prefetch.started_at = time.time()
            try:
                source = self.runs_root.resolve(record.path)
                return read_verified_adapter(source, expected_sha256=record.sha256 or None,
                                             run=record.run, version=record.version)
            finally:
                prefetch.finished_at = time.time()

        prefetch.future = executor.submit(run)
        return prefetch

    def _prefetched(self, prefetch: Prefetch | None, record: AdapterRecord, source: Path
                    ) -> VerifiedAdapter | None:
        # The read-ahead bytes, only if they are exactly the announced version: its
        # manifest's sha256 is the announced identity, and every byte matched that
        # manifest as it was read. Anything else (a failed or different read) is dropped.
        if prefetch is None or prefetch.record.version != record.version:
            return None
        try:
            got = prefetch.future.result()
        except Exception as exc:  # noqa: BLE001 - the load reads it again and decides
            log.info("read-ahead not used", extra={"version": record.version,
                                                   "error": str(exc)})
            return None
        m = got.manifest
        if (got.path != source or m.manifest_sha256 != record.sha256 or m.run != record.run
                or m.version != record.version):
            return None
        return got

    def load(self, record: AdapterRecord, *, noticed_at: float | None = None,
             prefetch: Prefetch | None = None) -> LiveAdapter:
        """Verifies and loads `record`, then makes it live. Raises AdapterRefused (a
        version that must not be served), or the engine's error when loading fails (the
        live version stays). `noticed_at`: when the replica heard of it (for timings);
        `prefetch`: the version read ahead on a hint, used only if it is this one."""
        stages: dict[str, float] = {}
        clock = time.perf_counter()

        def lap(stage: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            stages[stage] = now - clock
            ADAPTER_STAGE.labels(stage.removesuffix("_s")).observe(now - clock)
            clock = now

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
            lap("wait_s")
            verified = self._prefetched(prefetch, record, source)
            if verified is not None:
                assert prefetch is not None
                stages["read_ahead_s"] = prefetch.finished_at - prefetch.started_at
                stages["hint_to_notice_s"] = (noticed_at or time.time()) - prefetch.hinted_at
            else:
                try:
                    verified = read_verified_adapter(source, expected_sha256=record.sha256,
                                                     run=record.run, version=record.version)
                except (AdapterVerificationError, OSError) as exc:
                    ADAPTER_LOADS.labels("refused").inc()
                    raise AdapterRefused(f"version {record.version} refused: {exc}") from exc
            lap("read_verify_s")  # with a read-ahead: only the wait for it to finish
            self._check_base(verified)
            load, local = self._loader(name, verified, stages)
            if local is not None:
                lap("private_copy_s")
            del verified  # from here on only the engine holds the bytes it loaded
            try:
                self.batcher.call(load)
            except Exception:
                ADAPTER_LOADS.labels("failed").inc()
                if local is not None:
                    shutil.rmtree(local, ignore_errors=True)
                raise
            lap("engine_load_s")
            adapter = LiveAdapter(record.run, record.version, record.sha256, record.path, name)
            with self._cond:
                old = self.current
                self.current = adapter
                self._cond.notify_all()
                unload_now = old.engine_name is not None and not self._users.get(old.engine_name)
                if old.engine_name is not None and not unload_now:
                    self._retired[old.engine_name] = old.version
                evict = self._beyond_staleness(adapter.version)
            ADAPTER_LOADS.labels("loaded").inc()
            ADAPTER_VERSION.labels(self.replica_id).set(adapter.version)
            lap("swap_s")
            if self.on_live is not None:
                self.on_live(adapter)
            lap("ack_s")
            acked_at = time.time()
            if unload_now:
                self._unload(old.engine_name)
            for engine_name in evict:
                self._unload(engine_name, keep_copy=True)  # in use: its copy goes on release
            lap("unload_old_s")
            log.info("adapter live", extra={"run": record.run, "version": record.version})
            log.info("adapter stages", extra={
                "run": record.run, "version": record.version,
                "published_at": record.published_at,
                "stages": {"noticed_at": noticed_at or 0.0, "acked_at": acked_at, **stages}})
            return adapter

    def _loader(self, name: str, verified: VerifiedAdapter, timings: dict[str, float]
                ) -> tuple[Callable[[Any], None], Path | None]:
        """What the engine thread runs to load `verified` as `name`: straight from the
        verified bytes where the engine can (hf), else from a private dir written from
        them (vLLM loads LoRA from a path); also that dir, if one was written."""
        files, source = dict(verified.files), str(verified.path)
        if hasattr(self.batcher.engine, "load_adapter_files"):
            return (lambda engine: engine.load_adapter_files(
                name, files, source=source, timings=timings)), None
        local = self._staging / name
        shutil.rmtree(local, ignore_errors=True)
        local.mkdir(mode=0o700)
        for fname, data in files.items():  # private scratch: no fsync needed
            write_file(local, fname, data, fsync=False)
        write_file(local, MANIFEST_FILE, verified.manifest_bytes, fsync=False)
        return (lambda engine: engine.load_adapter(name, str(local))), local

    def _beyond_staleness(self, live_version: int) -> list[str]:
        """Retired versions older than the bound (called under the lock): moved from
        retired to evicted, to be unloaded now."""
        if self.max_staleness is None:
            return []
        oldest = live_version - self.max_staleness
        stale = [name for name, version in self._retired.items() if version < oldest]
        for name in stale:
            self._retired.pop(name)
            self._evicted.add(name)
        if stale:
            log.info("versions beyond the staleness bound unloaded while in use",
                     extra={"adapters": stale, "live": live_version,
                            "max_staleness": self.max_staleness})
        return stale

    def _unload(self, engine_name: str | None, keep_copy: bool = False) -> None:
        if engine_name is None:
            return
        try:
            self.batcher.call(lambda engine: engine.unload_adapter(engine_name))
        except Exception as exc:  # noqa: BLE001 - a failed unload only costs memory
            log.warning("unload failed", extra={"adapter": engine_name, "error": repr(exc)})
        if not keep_copy:
            shutil.rmtree(self._staging / engine_name, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self._staging, ignore_errors=True)
