"""Fault 6: /shared misbehaves.

- The learner's AdapterPublisher hits ENOSPC / EACCES while writing a version: the error is
  reported (logged), the write retried, and nothing half-written is ever announced; when
  the disk stays full the publish fails loudly and leaves nothing behind.
- A corrupted adapter (bytes changed after its manifest was written) and adapter paths
  that escape the runs root (`..`, absolute, a symlink to outside) are refused by EVERY
  replica, which keep serving the last good version and load the next good one.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlfleet.fleet import AdapterDirectory, AdapterRecord, connect
from rlfleet.local.procs import ProcessGroup
from rlfleet.storage import (
    RunsRoot,
    latest_version,
    list_versions,
    publish_adapter_dir,
    verify_adapter_dir,
)
from rlfleet.storage.atomic import is_temp_name
from rlfleet.v1 import common_pb2, sync_pb2
from rlfleet_learner.publisher import AdapterPublisher
from tests.reliability.conftest import (
    Fleet,
    Sync,
    assert_exactly_once,
    group,
    lora_files,
    metric_value,
    stream_code,
    wait_until,
)
from tests.waits import SCALE


@pytest.fixture(scope="module")
def sfleet(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("shared-faults")
    procs = ProcessGroup(tmp / "logs", wait_scale=SCALE)
    root = RunsRoot(tmp / "runs")
    root.root.mkdir(parents=True)
    fleet = Fleet(procs, root, "rel", tiny_model_dir)
    try:
        fleet.start_redis()
        fleet.start_env()
        fleet.start_sync()
        fleet.start_replicas(["ra", "rb"], "--adapter-wait-s", "1")
        yield fleet
    finally:
        fleet.close()


class WriteFaults:
    """Makes os.write fail with `code` for files under `under`, `times` times (-1: always)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, under: Path, code: int, times: int):
        self.under, self.code, self.left, self.injected = str(under), code, times, 0
        real = os.write

        def write(fd: int, data: bytes) -> int:
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                target = ""
            if self.left != 0 and target.startswith(self.under):
                self.left -= 1
                self.injected += 1
                raise OSError(self.code, os.strerror(self.code))
            return real(fd, data)

        monkeypatch.setattr(os, "write", write)


class Announcements:
    """Checks every "new version" event the moment it arrives: the announced directory must
    exist and verify against its manifest (never half-written)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.checked: list[int] = []
        self.bad: list[str] = []
        self._stop = threading.Event()
        self._events = AdapterDirectory(connect(fleet.redis_url)).events(fleet.run, poll_s=0.1)
        next(self._events)  # subscribed before anything is published
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        for record in self._events:
            if self._stop.is_set():
                return
            if record is None:
                continue
            try:
                path = self.fleet.root.resolve(record.path)
                manifest = verify_adapter_dir(path, expected_sha256=record.sha256)
                assert manifest.version == record.version
                self.checked.append(record.version)
            except Exception as exc:  # noqa: BLE001 - collected, asserted by the test
                self.bad.append(f"v{record.version}: {exc}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _leftovers(root: RunsRoot, run: str) -> list[str]:
    return [e for e in os.listdir(root.adapters_root(run)) if is_temp_name(e)]


def _publisher(fleet: Fleet) -> AdapterPublisher:
    return AdapterPublisher(fleet.root, fleet.run, "tiny", fleet.sync_service())


@pytest.mark.slow
def test_full_disk_and_permission_errors_are_retried_never_half_published(
        sfleet: Fleet, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = sfleet
    publisher = _publisher(fleet)
    adapters_dir = fleet.root.run_dir(fleet.run) / "adapters"
    adapters_dir.mkdir(parents=True, exist_ok=True)
    files = lora_files(fleet.model_dir, seed=11)
    watch = Announcements(fleet)
    caplog.set_level(logging.WARNING, logger="rlfleet.storage.atomic")
    injected: dict[str, int] = {}
    try:
        for name, code, times in (("ENOSPC", errno.ENOSPC, 2), ("EACCES", errno.EACCES, 1)):
            before = latest_version(fleet.root, fleet.run) or 0
            faults = WriteFaults(monkeypatch, adapters_dir, code, times)
            published = publisher.publish(files, step=before + 1,
                                          version=publisher.next_version(before + 1))
            monkeypatch.undo()
            injected[name] = faults.injected
            assert faults.injected == times
            assert published.version == before + 1
            assert sorted(fleet.wait_replicas(published.version, 2)) == ["ra", "rb"]
            assert not _leftovers(fleet.root, fleet.run)
        assert sum("storage operation failed, retrying" in r.getMessage()
                   for r in caplog.records) == 3  # every failure was reported

        # The disk stays full: the publish fails loudly after its bounded retries, and
        # neither a directory nor an announcement appears.
        before = latest_version(fleet.root, fleet.run)
        faults = WriteFaults(monkeypatch, adapters_dir, errno.ENOSPC, -1)
        with pytest.raises(RuntimeError, match="No space left on device"):
            publisher.publish(files, step=99, version=before + 1)
        monkeypatch.undo()
        injected["ENOSPC (persistent)"] = faults.injected
        assert faults.injected == 5
        assert latest_version(fleet.root, fleet.run) == before
        assert not _leftovers(fleet.root, fleet.run)
        latest = fleet.sync_client().call(Sync, "GetLatest",
                                          sync_pb2.GetLatestRequest(run=fleet.run))
        assert latest.version == before
        assert {fleet.status(p).adapter.version for p in fleet.replicas.values()} == {before}
    finally:
        monkeypatch.undo()
        watch.close()
    assert not watch.bad, watch.bad
    assert watch.checked == [1, 2]  # each announced once, each whole when announced
    print(f"/shared write faults injected: {injected}")


@pytest.mark.slow
def test_corrupted_and_escaping_adapters_refused_by_every_replica(sfleet: Fleet,
                                                                  tmp_path: Path) -> None:
    fleet = sfleet
    good = latest_version(fleet.root, fleet.run) or 0
    if good == 0:
        fleet.publish(1)
        good = 1
    fleet.wait_replicas(good, 2)
    store = AdapterDirectory(connect(fleet.redis_url))
    refused_before = {n: metric_value(p.extra["metrics_port"],
                                      "rlfleet_rollout_adapter_loads_total", 'outcome="refused"')
                      for n, p in fleet.replicas.items()}

    # 1. bit rot after ckpt-sync verified: the manifest is intact (its sha256 is the one
    #    announced) but a weights byte changed
    bad = good + 1
    manifest = fleet.write_version(bad)
    weights = fleet.root.adapter_dir(fleet.run, bad) / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    # ckpt-sync itself refuses to publish it...
    with pytest.raises(Exception) as err:
        fleet.sync_client().call(Sync, "Publish", sync_pb2.PublishRequest(
            adapter=common_pb2.AdapterRef(run=fleet.run, version=bad)))
    assert err.value.code().name == "FAILED_PRECONDITION"
    # ...so announce it behind its back, as if the bytes rotted after it checked
    records = [AdapterRecord(run=fleet.run, version=bad,
                             path=f"{fleet.run}/adapters/v{bad:06d}",
                             sha256=manifest.manifest_sha256)]

    # 2. paths that leave the runs root
    outside = RunsRoot(tmp_path / "outside")
    outside.root.mkdir()
    escape = bad + 3
    out_manifest = publish_adapter_dir(outside, fleet.run, escape,
                                       lora_files(fleet.model_dir, seed=escape),
                                       base_model="tiny", step=escape)
    link = fleet.root.adapters_root(fleet.run) / f"v{escape:06d}"
    os.symlink(outside.adapter_dir(fleet.run, escape), link)
    records += [
        AdapterRecord(run=fleet.run, version=bad + 1, path="../../etc",
                      sha256=manifest.manifest_sha256),
        AdapterRecord(run=fleet.run, version=bad + 2,
                      path=str(outside.adapter_dir(fleet.run, escape)),
                      sha256=out_manifest.manifest_sha256),
        AdapterRecord(run=fleet.run, version=escape, path=f"{fleet.run}/adapters/v{escape:06d}",
                      sha256=out_manifest.manifest_sha256),
    ]
    try:
        for record in records:
            assert store.publish(record)
            wait_until(f"both replicas refused v{record.version}", lambda r=record: all(
                f'"version": {r.version}' in p.log_path.read_text() and
                "adapter refused" in p.log_path.read_text() for p in fleet.replicas.values()),
                timeout_s=30)
        for name, proc in fleet.replicas.items():
            refused = metric_value(proc.extra["metrics_port"],
                                   "rlfleet_rollout_adapter_loads_total", 'outcome="refused"')
            assert refused - refused_before[name] == len(records), name
            assert fleet.status(proc).adapter.version == good  # still the last good one
            # groups still complete on the good version; asking for the refused one is
            # a clear FAILED_PRECONDITION
            requests = [group(min_version=good)]
            code, got, _ = stream_code(proc.address, requests[0])
            assert code.name == "OK" and {t.adapter.version for t in got} == {good}
            assert_exactly_once(requests, [(requests[0], got)])
            code, _, details = stream_code(proc.address, group(min_version=bad))
            assert code.name == "FAILED_PRECONDITION", details
    finally:
        link.unlink()
        shutil.rmtree(fleet.root.adapter_dir(fleet.run, bad))

    # the next good version loads everywhere: a refusal wedges nothing
    nxt = escape + 1
    fleet.publish(nxt)
    assert sorted(fleet.wait_replicas(nxt, 2)) == ["ra", "rb"]
    assert nxt in list_versions(fleet.root, fleet.run)
    print(f"refused by each of 2 replicas: {len(records)} bad announcements "
          "(1 corrupted, 3 escaping paths)")
