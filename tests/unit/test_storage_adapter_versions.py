"""rlfleet.storage.adapter_versions: publish, verify (every kind of tampering), read verified into
memory, list, collect."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

from rlfleet.storage.adapter_versions import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    MANIFEST_FILE,
    AdapterVerificationError,
    VersionProtected,
    latest_version,
    list_versions,
    manifest_sha256,
    prune_versions,
    publish_adapter_dir,
    read_verified_adapter,
    remove_version,
    verify_adapter_dir,
)
from rlfleet.storage.atomic import DestinationExists, StorageError
from rlfleet.storage.paths import PathOutsideRunsRoot, RunsRoot

BASE = "tiny-qwen3-vl"


def _files(seed: int = 0) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    weights = safetensors.numpy.save({
        "base_model.model.layers.0.q_proj.lora_A.weight":
            rng.standard_normal((4, 16)).astype(np.float32),
        "base_model.model.layers.0.q_proj.lora_B.weight": np.zeros((16, 4), np.float32),
    })
    config = json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                         "target_modules": ["q_proj"]}).encode()
    return {ADAPTER_WEIGHTS_FILE: weights, ADAPTER_CONFIG_FILE: config}


@pytest.fixture
def rr(tmp_path: Path) -> RunsRoot:
    return RunsRoot(tmp_path / "runs")


@pytest.fixture
def published(rr: RunsRoot) -> Path:
    publish_adapter_dir(rr, "exp", 1, _files(), BASE, step=10)
    return rr.adapter_dir("exp", 1)


def test_publish_and_verify(rr: RunsRoot) -> None:
    files = _files()
    m = publish_adapter_dir(rr, "exp", 3, files, BASE, step=30, created_unix=1700000000.0)
    path = rr.adapter_dir("exp", 3)
    assert sorted(os.listdir(path)) == sorted([*files, MANIFEST_FILE])
    assert (m.run, m.version, m.step, m.base_model) == ("exp", 3, 30, BASE)
    assert m.created_unix == 1700000000.0
    assert m.files[ADAPTER_WEIGHTS_FILE].size == len(files[ADAPTER_WEIGHTS_FILE])
    assert m.manifest_sha256 == manifest_sha256(path)
    v = verify_adapter_dir(path, expected_sha256=m.manifest_sha256)
    assert v == m and v.manifest_sha256 == m.manifest_sha256
    doc = json.loads((path / MANIFEST_FILE).read_text())
    assert doc["format_version"] == 1
    assert set(doc["files"]) == set(files)


def test_publish_from_source_dir(rr: RunsRoot, tmp_path: Path) -> None:
    src = tmp_path / "peft_out"
    src.mkdir()
    for name, data in _files().items():
        (src / name).write_bytes(data)
    (src / "README.md").write_text("model card")  # not part of a version
    publish_adapter_dir(rr, "exp", 1, src, BASE, step=1)
    path = rr.adapter_dir("exp", 1)
    assert "README.md" not in os.listdir(path)
    verify_adapter_dir(path)


def test_publish_refuses_bad_input(rr: RunsRoot, tmp_path: Path) -> None:
    good = _files()
    with pytest.raises(ValueError, match="unexpected"):
        publish_adapter_dir(rr, "exp", 1, {**good, "evil.py": b""}, BASE, step=1)
    with pytest.raises(ValueError, match="missing"):
        publish_adapter_dir(rr, "exp", 1, {ADAPTER_WEIGHTS_FILE: good[ADAPTER_WEIGHTS_FILE]},
                            BASE, step=1)
    with pytest.raises(ValueError, match="safetensors"):
        publish_adapter_dir(rr, "exp", 1, {**good, ADAPTER_WEIGHTS_FILE: b"junk"}, BASE, 1)
    with pytest.raises(ValueError, match="JSON"):
        publish_adapter_dir(rr, "exp", 1, {**good, ADAPTER_CONFIG_FILE: b"{"}, BASE, 1)
    with pytest.raises(ValueError, match="no adapter_model"):
        publish_adapter_dir(rr, "exp", 1, tmp_path / "nowhere", BASE, step=1)
    with pytest.raises(ValueError):
        publish_adapter_dir(rr, "../etc", 1, good, BASE, step=1)
    assert list_versions(rr, "exp") == []


def test_publish_never_overwrites(rr: RunsRoot, published: Path) -> None:
    before = manifest_sha256(published)
    with pytest.raises(DestinationExists):
        publish_adapter_dir(rr, "exp", 1, _files(seed=1), BASE, step=11)
    assert manifest_sha256(published) == before


def test_publish_into_symlink_escape_refused(rr: RunsRoot, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    rr.root.mkdir(parents=True)
    (rr.root / "exp").symlink_to(outside)
    with pytest.raises(PathOutsideRunsRoot):
        publish_adapter_dir(rr, "exp", 1, _files(), BASE, step=1)
    assert list(outside.iterdir()) == []


def test_publish_enospc_reported_and_cleaned(
    rr: RunsRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write
    calls = {"n": 0}

    def write_then_fail(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] >= 2:  # the first file lands, the second hits a full disk
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write_then_fail)
    with pytest.raises(StorageError) as info:
        publish_adapter_dir(rr, "exp", 1, _files(), BASE, step=1)
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC
    assert list_versions(rr, "exp") == []
    assert os.listdir(rr.adapters_root("exp")) == []


def test_verify_flipped_byte(published: Path) -> None:
    p = published / ADAPTER_WEIGHTS_FILE
    data = bytearray(p.read_bytes())
    data[-1] ^= 0x01
    p.write_bytes(bytes(data))
    with pytest.raises(AdapterVerificationError, match="sha256"):
        verify_adapter_dir(published)


def test_verify_truncated_file(published: Path) -> None:
    p = published / ADAPTER_CONFIG_FILE
    p.write_bytes(p.read_bytes()[:-1])
    with pytest.raises(AdapterVerificationError, match="size"):
        verify_adapter_dir(published)


def test_verify_extra_file(published: Path) -> None:
    (published / "extra.bin").write_bytes(b"x")
    with pytest.raises(AdapterVerificationError, match="not in the manifest"):
        verify_adapter_dir(published)


def test_verify_missing_file(published: Path) -> None:
    (published / ADAPTER_CONFIG_FILE).unlink()
    with pytest.raises(AdapterVerificationError, match="missing"):
        verify_adapter_dir(published)


def test_verify_missing_manifest(published: Path) -> None:
    (published / MANIFEST_FILE).unlink()
    with pytest.raises(AdapterVerificationError, match="no MANIFEST"):
        verify_adapter_dir(published)
    with pytest.raises(AdapterVerificationError):
        manifest_sha256(published)


def test_verify_manifest_not_json(published: Path) -> None:
    (published / MANIFEST_FILE).write_bytes(b'{"format_version": 1, ')
    with pytest.raises(AdapterVerificationError, match="not valid JSON"):
        verify_adapter_dir(published)


def _edit_manifest(path: Path, **changes: object) -> None:
    doc = json.loads((path / MANIFEST_FILE).read_text())
    doc.update(changes)
    (path / MANIFEST_FILE).write_text(json.dumps(doc))


def test_verify_manifest_lies_about_sha(published: Path) -> None:
    doc = json.loads((published / MANIFEST_FILE).read_text())
    doc["files"][ADAPTER_WEIGHTS_FILE]["sha256"] = "0" * 64
    (published / MANIFEST_FILE).write_text(json.dumps(doc))
    with pytest.raises(AdapterVerificationError, match="sha256"):
        verify_adapter_dir(published)


def test_verify_manifest_lies_about_version(published: Path) -> None:
    _edit_manifest(published, version=2)
    with pytest.raises(AdapterVerificationError, match="version"):
        verify_adapter_dir(published)


def test_verify_manifest_lies_about_run(published: Path) -> None:
    _edit_manifest(published, run="other")
    with pytest.raises(AdapterVerificationError, match="run"):
        verify_adapter_dir(published)


def test_verify_manifest_edit_changes_identity(published: Path) -> None:
    before = manifest_sha256(published)
    _edit_manifest(published, step=999)  # consistent but not what was announced
    verify_adapter_dir(published)
    with pytest.raises(AdapterVerificationError, match="expected"):
        verify_adapter_dir(published, expected_sha256=before)


@pytest.mark.parametrize(("change", "message"), [
    ({"format_version": 99}, "format_version 99 is not supported"),
    ({"files": []}, "files: Input should be a valid dictionary"),
    ({"version": "1"}, "version: Input should be a valid integer"),  # strict: no coercion
    ({"version": True}, "version: Input should be a valid integer"),
    ({"step": -1}, "step: Input should be greater than or equal to 0"),
    ({"created_unix": "now"}, "created_unix: Input should be a valid number"),
    ({"extra": 1}, "extra: Extra inputs are not permitted"),
    ({"manifest_sha256": "0" * 64}, "names its own sha256"),
    ({"files": {"../../etc/passwd": {"sha256": "0" * 64, "size": 1}}}, "files:"),
    ({"files": {"adapter_model.safetensors": {"sha256": "0" * 64, "size": 1}}},
     "does not list"),
    ({"files": {"adapter_model.safetensors": {"sha256": "A" * 64, "size": 1},
                "adapter_config.json": {"sha256": "0" * 64, "size": 1}}}, "sha256"),
    ({"files": {"adapter_model.safetensors": {"sha256": "0" * 64, "size": True},
                "adapter_config.json": {"sha256": "0" * 64, "size": 1}}}, "size"),
])
def test_verify_manifest_schema(published: Path, change: dict[str, object],
                                message: str) -> None:
    # a strict model: each kind of garbage is refused, naming the field
    _edit_manifest(published, **change)
    with pytest.raises(AdapterVerificationError, match=message):
        verify_adapter_dir(published)


def test_verify_symlinked_file_refused(published: Path, tmp_path: Path) -> None:
    p = published / ADAPTER_CONFIG_FILE
    target = tmp_path / "cfg.json"
    target.write_bytes(p.read_bytes())
    p.unlink()
    p.symlink_to(target)
    with pytest.raises(AdapterVerificationError, match="regular file"):
        verify_adapter_dir(published)


def test_list_ignores_temp_and_incomplete(rr: RunsRoot) -> None:
    for v in (1, 2, 10):
        publish_adapter_dir(rr, "exp", v, _files(v), BASE, step=v * 10)
    root = rr.adapters_root("exp")
    (root / ".v000011.tmp-1-abc").mkdir()  # crashed writer
    (root / "v000012").mkdir()  # no manifest: not a version
    (root / "notes").mkdir()
    assert list_versions(rr, "exp") == [1, 2, 10]
    assert latest_version(rr, "exp") == 10
    assert list_versions(rr, "nothing-yet") == []
    assert latest_version(rr, "nothing-yet") is None


def test_remove_and_prune(rr: RunsRoot) -> None:
    for v in range(1, 6):
        publish_adapter_dir(rr, "exp", v, _files(v), BASE, step=v)
    with pytest.raises(VersionProtected, match="latest"):
        remove_version(rr, "exp", 5)
    with pytest.raises(VersionProtected, match="keep"):
        remove_version(rr, "exp", 2, keep={2})
    remove_version(rr, "exp", 1)
    assert list_versions(rr, "exp") == [2, 3, 4, 5]
    with pytest.raises(StorageError):
        remove_version(rr, "exp", 1)
    assert prune_versions(rr, "exp", keep_last=1, keep={3}) == [2, 4]
    assert list_versions(rr, "exp") == [3, 5]
    assert sorted(os.listdir(rr.adapters_root("exp"))) == ["v000003", "v000005"]
    verify_adapter_dir(rr.adapter_dir("exp", 5))


# -- reading a version into memory, verified (what a replica loads) ----------------------


def test_read_verified_adapter_returns_exactly_the_published_bytes(rr: RunsRoot) -> None:
    files = _files(seed=3)
    m = publish_adapter_dir(rr, "exp", 4, files, BASE, step=40)
    path = rr.adapter_dir("exp", 4)
    got = read_verified_adapter(path, expected_sha256=m.manifest_sha256, run="exp", version=4)
    assert {n: bytes(v) for n, v in got.files.items()} == files
    assert got.manifest == m and got.manifest.manifest_sha256 == m.manifest_sha256
    assert got.manifest_bytes == (path / MANIFEST_FILE).read_bytes()
    assert got.nbytes == sum(len(b) for b in files.values())
    # the bytes are the reader's own: rewriting the shared file changes nothing in memory
    (path / ADAPTER_WEIGHTS_FILE).write_bytes(b"x" * len(files[ADAPTER_WEIGHTS_FILE]))
    assert bytes(got.files[ADAPTER_WEIGHTS_FILE]) == files[ADAPTER_WEIGHTS_FILE]
    assert not got.files[ADAPTER_WEIGHTS_FILE].readonly  # loadable without a copy


def test_read_verified_adapter_large_file_uses_private_memory(rr: RunsRoot) -> None:
    big = np.arange(3 << 20, dtype=np.float32)  # 12 MB: the huge-page buffer path
    files = {ADAPTER_WEIGHTS_FILE: safetensors.numpy.save({"w": big}),
             ADAPTER_CONFIG_FILE: _files()[ADAPTER_CONFIG_FILE]}
    m = publish_adapter_dir(rr, "exp", 1, files, BASE, step=1)
    got = read_verified_adapter(rr.adapter_dir("exp", 1), expected_sha256=m.manifest_sha256)
    assert bytes(got.files[ADAPTER_WEIGHTS_FILE]) == files[ADAPTER_WEIGHTS_FILE]


@pytest.mark.parametrize("tamper", ["flip", "truncate", "extra", "missing", "symlink",
                                    "fifo", "manifest_edit"])
def test_read_verified_adapter_refuses_tampering(published: Path, tmp_path: Path,
                                                  tamper: str) -> None:
    sha = manifest_sha256(published)
    w = published / ADAPTER_WEIGHTS_FILE
    if tamper == "flip":
        data = bytearray(w.read_bytes())
        data[len(data) // 2] ^= 0x01
        w.write_bytes(bytes(data))
    elif tamper == "truncate":
        w.write_bytes(w.read_bytes()[:-1])
    elif tamper == "extra":
        (published / "evil.py").write_bytes(b"import os")
    elif tamper == "missing":
        w.unlink()
    elif tamper == "symlink":
        target = tmp_path / "w.safetensors"
        target.write_bytes(w.read_bytes())
        w.unlink()
        w.symlink_to(target)
    elif tamper == "fifo":  # must be refused, not block the reader forever
        w.unlink()
        os.mkfifo(w)
    elif tamper == "manifest_edit":
        _edit_manifest(published, step=12345)
    with pytest.raises(AdapterVerificationError):
        read_verified_adapter(published, expected_sha256=sha)
    with pytest.raises(AdapterVerificationError):
        verify_adapter_dir(published, expected_sha256=sha)


def test_read_verified_adapter_checks_identity_run_and_version(published: Path) -> None:
    sha = manifest_sha256(published)
    with pytest.raises(AdapterVerificationError, match="expected"):
        read_verified_adapter(published, expected_sha256="0" * 64)
    with pytest.raises(AdapterVerificationError, match="required"):
        read_verified_adapter(published, expected_sha256="")
    with pytest.raises(AdapterVerificationError, match="run"):
        read_verified_adapter(published, expected_sha256=sha, run="other")
    with pytest.raises(AdapterVerificationError, match="version"):
        read_verified_adapter(published, expected_sha256=sha, version=2)
    read_verified_adapter(published, expected_sha256=sha, run="exp", version=1)


def test_version_dir_that_is_a_symlink_is_refused(rr: RunsRoot, tmp_path: Path) -> None:
    m = publish_adapter_dir(RunsRoot(tmp_path / "elsewhere"), "exp", 1, _files(), BASE, 1)
    rr.adapters_root("exp").mkdir(parents=True)
    link = rr.root / "exp" / "adapters" / "v000001"
    link.symlink_to(tmp_path / "elsewhere" / "exp" / "adapters" / "v000001")
    with pytest.raises(AdapterVerificationError, match="not a directory"):
        verify_adapter_dir(link)
    with pytest.raises(AdapterVerificationError):
        read_verified_adapter(link, expected_sha256=m.manifest_sha256)


def test_file_that_changes_while_read_is_refused(published: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    sha = manifest_sha256(published)
    w = published / ADAPTER_WEIGHTS_FILE
    real_readv = os.readv

    def readv_then_truncate(fd: int, buffers):  # noqa: ANN001, ANN202
        n = real_readv(fd, buffers)
        if os.readlink(f"/proc/self/fd/{fd}") == str(w):
            os.truncate(w, 8)  # a writer shortens the file between the stat and the read
        return n

    monkeypatch.setattr(os, "readv", readv_then_truncate)
    monkeypatch.setattr("rlfleet.storage.adapter_versions._CHUNK", 64)  # several reads per file
    with pytest.raises(AdapterVerificationError, match="changed while being read"):
        read_verified_adapter(published, expected_sha256=sha)


# -- publishing: hash from memory, each file fsynced once ---------------------------------


def _fsync_counter(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    counts: dict[str, int] = {}
    real = os.fsync

    def fsync(fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        counts[target] = counts.get(target, 0) + 1
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return counts


def test_publish_fsyncs_each_file_once_and_never_reads_back(
        rr: RunsRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    files = _files(seed=5)
    rr.adapters_root("exp").mkdir(parents=True)
    counts = _fsync_counter(monkeypatch)
    real_open = os.open
    reads: list[str] = []

    def no_read_back(path, flags, *args, **kwargs):  # noqa: ANN001, ANN202
        if str(path).endswith(ADAPTER_WEIGHTS_FILE) and not flags & (os.O_WRONLY | os.O_RDWR):
            reads.append(str(path))  # a read-only open of the weights the publisher wrote
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_read_back)
    timings: dict[str, float] = {}
    m = publish_adapter_dir(rr, "exp", 1, files, BASE, step=1, timings=timings)
    monkeypatch.undo()
    final = rr.adapter_dir("exp", 1)
    # every file of the version, its dir and the parent: synced exactly once each
    synced = {Path(p).name: n for p, n in counts.items()}
    for name in (*files, MANIFEST_FILE):
        assert synced.get(name) == 1, (name, counts)
    assert all(n == 1 for n in counts.values()), counts
    assert len(reads) == 1  # only fsync_file's open to sync it: never re-read to hash
    assert verify_adapter_dir(final, expected_sha256=m.manifest_sha256) == m
    assert {n: e.sha256 for n, e in m.files.items()} == {
        n: hashlib.sha256(b).hexdigest() for n, b in files.items()}
    assert {"write_s", "hash_wait_s", "fsync_wait_s", "manifest_s", "rename_s"} <= set(timings)


def test_publish_fsync_failure_publishes_nothing(rr: RunsRoot,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(ADAPTER_WEIGHTS_FILE):
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(StorageError) as info:
        publish_adapter_dir(rr, "exp", 1, _files(), BASE, step=1)
    monkeypatch.undo()
    assert info.value.errno == errno.EIO
    assert list_versions(rr, "exp") == []
    assert os.listdir(rr.adapters_root("exp")) == []  # the temp dir is gone too
