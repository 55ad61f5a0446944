"""The replica's AdapterManager with stand-in engines: it loads exactly the bytes it
verified (from memory, or from a private copy for engines that need a directory), never
an unverified version, and a refusal or a failed load leaves the old version serving."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rlfleet.engines import EngineError
from rlfleet.fleet import AdapterRecord
from rlfleet.storage import RunsRoot
from rlfleet_rollout.batcher import GenerationBatcher
from rlfleet_rollout.loaded_adapters import AdapterManager, AdapterRefused
from tests.factories import adapter_files, publish_version

RUN = "exp"


class MemEngine:
    """Loads from bytes in memory (like the hf engine)."""

    def __init__(self, fail: bool = False) -> None:
        self.loaded: dict[str, dict[str, bytes]] = {}
        self.events: list[str] = []
        self.fail = fail

    def load_adapter_files(self, name, files, *, source="", timings=None) -> None:  # noqa: ANN001
        if self.fail:
            raise EngineError("cannot load adapter: boom")
        self.loaded[name] = {n: bytes(v) for n, v in files.items()}
        self.events.append(f"load {name}")

    def unload_adapter(self, name: str) -> None:
        self.loaded.pop(name)
        self.events.append(f"unload {name}")


class DirEngine:
    """Loads from a directory path only (like the vLLM engine)."""

    def __init__(self, fail: bool = False) -> None:
        self.paths: dict[str, Path] = {}
        self.loaded: dict[str, dict[str, bytes]] = {}
        self.events: list[str] = []
        self.fail = fail

    def load_adapter(self, name: str, path: str) -> None:
        self.paths[name] = Path(path)
        if self.fail:
            raise EngineError("cannot load adapter: boom")
        self.loaded[name] = {p.name: p.read_bytes() for p in Path(path).iterdir()}
        self.events.append(f"load {name}")

    def unload_adapter(self, name: str) -> None:
        self.loaded.pop(name)
        self.events.append(f"unload {name}")


@pytest.fixture
def root(tmp_path: Path) -> RunsRoot:
    r = RunsRoot(tmp_path / "runs")
    r.root.mkdir(parents=True)
    return r


def _manager(root: RunsRoot, engine) -> tuple[AdapterManager, list[str]]:  # noqa: ANN001
    acks: list[str] = []

    def on_live(adapter) -> None:  # noqa: ANN001
        acks.append(adapter.engine_name)
        engine.events.append(f"ack {adapter.engine_name}")

    mgr = AdapterManager(GenerationBatcher(engine), root, RUN, "r1", on_live=on_live)
    return mgr, acks


def _record(root: RunsRoot, version: int, **override) -> AdapterRecord:  # noqa: ANN003
    m = publish_version(root, RUN, version)
    fields = {"run": RUN, "version": version, "path": f"{RUN}/adapters/v{version:06d}",
              "sha256": m.manifest_sha256, **override}
    return AdapterRecord(**fields)


@pytest.mark.parametrize("engine_cls", [MemEngine, DirEngine])
def test_loads_exactly_the_published_bytes_then_acks_then_unloads(root: RunsRoot,
                                                                   engine_cls) -> None:  # noqa: ANN001
    engine = engine_cls()
    mgr, acks = _manager(root, engine)
    try:
        live = mgr.load(_record(root, 1))
        assert (live.version, mgr.current.version) == (1, 1)
        want = adapter_files(1)
        got = engine.loaded[live.engine_name]
        assert {n: got[n] for n in want} == want
        if isinstance(engine, DirEngine):  # a private copy, not the shared dir
            private = engine.paths[live.engine_name]
            assert root.root not in private.parents
            assert got["MANIFEST.json"] == (root.adapter_dir(RUN, 1) / "MANIFEST.json"
                                            ).read_bytes()
        mgr.load(_record(root, 2))
        # the new version is acknowledged before the old one is unloaded
        assert engine.events == [f"load {RUN}@v000001", f"ack {RUN}@v000001",
                                 f"load {RUN}@v000002", f"ack {RUN}@v000002",
                                 f"unload {RUN}@v000001"]
        if isinstance(engine, DirEngine):
            assert not private.exists()  # the unloaded version's private copy is removed
        assert acks == [f"{RUN}@v000001", f"{RUN}@v000002"]
    finally:
        mgr.batcher.close()
        mgr.close()


def _flip(root: RunsRoot, version: int) -> None:
    w = root.adapter_dir(RUN, version) / "adapter_model.safetensors"
    data = bytearray(w.read_bytes())
    data[len(data) // 2] ^= 0x01
    w.write_bytes(bytes(data))


@pytest.mark.parametrize("engine_cls", [MemEngine, DirEngine])
def test_unverified_versions_never_reach_the_engine(root: RunsRoot, tmp_path: Path,
                                                    engine_cls) -> None:  # noqa: ANN001
    engine = engine_cls()
    mgr, acks = _manager(root, engine)
    try:
        mgr.load(_record(root, 1))
        bad = _record(root, 2)
        _flip(root, 2)  # bit rot after it was announced
        outside = RunsRoot(tmp_path / "outside")
        m3 = publish_version(outside, RUN, 3)
        lies = [
            bad,
            _record(root, 4, sha256="0" * 64),  # not the announced identity
            AdapterRecord(RUN, 5, "../../etc", m3.manifest_sha256),
            AdapterRecord(RUN, 6, str(outside.adapter_dir(RUN, 3)), m3.manifest_sha256),
            _record(root, 7, run="other"),
            AdapterRecord(RUN, 1, f"{RUN}/adapters/v000001", mgr.current.sha256),  # not newer
        ]
        for record in lies:
            with pytest.raises(AdapterRefused):
                mgr.load(record)
            assert mgr.current.version == 1
        assert list(engine.loaded) == [f"{RUN}@v000001"]
        assert acks == [f"{RUN}@v000001"]
    finally:
        mgr.batcher.close()
        mgr.close()


@pytest.mark.parametrize("engine_cls", [MemEngine, DirEngine])
def test_failed_engine_load_leaves_the_old_version_serving(root: RunsRoot,
                                                           engine_cls) -> None:  # noqa: ANN001
    engine = engine_cls()
    mgr, acks = _manager(root, engine)
    try:
        mgr.load(_record(root, 1))
        engine.fail = True
        with pytest.raises(EngineError):
            mgr.load(_record(root, 2))
        assert mgr.current.version == 1 and acks == [f"{RUN}@v000001"]
        assert list(engine.loaded) == [f"{RUN}@v000001"]  # nothing unloaded
        if isinstance(engine, DirEngine):
            assert not engine.paths[f"{RUN}@v000002"].exists()  # no leftover copy
        engine.fail = False
        assert mgr.load(_record(root, 3)).version == 3  # and the next one loads
    finally:
        mgr.batcher.close()
        mgr.close()


def test_episodes_finish_on_the_version_they_started_on(root: RunsRoot) -> None:
    engine = MemEngine()
    mgr, _ = _manager(root, engine)
    try:
        mgr.load(_record(root, 1))
        held = mgr.acquire()
        mgr.load(_record(root, 2))
        assert held.version == 1 and mgr.current.version == 2
        assert f"{RUN}@v000001" in engine.loaded  # still in use: not unloaded
        assert mgr.acquire().version == 2
        mgr.release(held)
        assert f"{RUN}@v000001" not in engine.loaded
    finally:
        mgr.batcher.close()
        mgr.close()


def test_versions_beyond_the_staleness_bound_are_unloaded_while_in_use(root: RunsRoot
                                                                       ) -> None:
    engine = DirEngine()
    mgr = AdapterManager(GenerationBatcher(engine), root, RUN, "r1", max_staleness=1)
    try:
        mgr.load(_record(root, 1))
        on_v1 = mgr.acquire()
        mgr.load(_record(root, 2))
        on_v2 = mgr.acquire()
        # v1 is inside the bound of live v2: kept for the episode that holds it
        assert not mgr.is_evicted(on_v1) and f"{RUN}@v000001" in engine.loaded
        mgr.load(_record(root, 3))
        # v1 < 3 - 1: unloaded although held; v2 stays, held and inside the bound
        assert mgr.is_evicted(on_v1) and not mgr.is_evicted(on_v2)
        assert sorted(engine.loaded) == [f"{RUN}@v000002", f"{RUN}@v000003"]
        private = engine.paths[f"{RUN}@v000001"]
        assert private.exists()  # an in-flight request may still read it
        mgr.release(on_v1)
        assert not private.exists() and not mgr.is_evicted(on_v1)
        mgr.release(on_v2)
        assert sorted(engine.loaded) == [f"{RUN}@v000003"]
        assert engine.events.count(f"unload {RUN}@v000001") == 1
    finally:
        mgr.batcher.close()
        mgr.close()


def test_a_negative_staleness_bound_is_refused(root: RunsRoot) -> None:
    with pytest.raises(ValueError, match="max_staleness"):
        AdapterManager(GenerationBatcher(DirEngine()), root, RUN, "r1", max_staleness=-1)


def test_read_ahead_is_used_only_for_the_announced_identity(
        root: RunsRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    import rlfleet_rollout.loaded_adapters as adapters_mod

    engine = MemEngine()
    mgr, _ = _manager(root, engine)
    reads: list[str | None] = []
    real = adapters_mod.read_verified_adapter

    def counting(path, *, expected_sha256, **kw):  # noqa: ANN001, ANN003, ANN202
        reads.append(expected_sha256)
        return real(path, expected_sha256=expected_sha256, **kw)

    monkeypatch.setattr(adapters_mod, "read_verified_adapter", counting)
    pool = ThreadPoolExecutor(1)
    try:
        # a hint (no identity yet), then the announcement: the bytes read ahead are used
        rec1 = _record(root, 1)
        hint = AdapterRecord(RUN, 1, rec1.path, "")
        mgr.load(rec1, prefetch=mgr.start_prefetch(hint, pool))
        assert reads == [None]  # read once, ahead; not again for the load
        assert engine.loaded[f"{RUN}@v000001"]["adapter_model.safetensors"] == \
            adapter_files(1)["adapter_model.safetensors"]

        # read ahead, then the version is replaced before the announcement: the announced
        # identity is not what was read ahead, so it is read again (and that is loaded)
        rec2 = _record(root, 2)
        early = mgr.start_prefetch(AdapterRecord(RUN, 2, rec2.path, ""), pool)
        early.future.result()
        shutil.rmtree(root.adapter_dir(RUN, 2))
        replaced = publish_version(root, RUN, 2, seed=99)
        announced = AdapterRecord(RUN, 2, rec2.path, replaced.manifest_sha256)
        mgr.load(announced, prefetch=early)
        assert reads == [None, None, replaced.manifest_sha256]
        assert engine.loaded[f"{RUN}@v000002"]["adapter_model.safetensors"] == \
            adapter_files(99)["adapter_model.safetensors"]

        # a read-ahead that failed (corrupted then) never stands in for verification
        rec3 = _record(root, 3)
        _flip(root, 3)
        bad = mgr.start_prefetch(AdapterRecord(RUN, 3, rec3.path, ""), pool)
        with pytest.raises(AdapterRefused):
            mgr.load(rec3, prefetch=bad)
        assert mgr.current.version == 2
    finally:
        pool.shutdown()
        mgr.batcher.close()
        mgr.close()
