"""rlfleet.storage.atomic: a dir appears whole under its final name or not at all."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from rlfleet.storage import atomic
from rlfleet.storage.atomic import (
    DestinationExists,
    StorageError,
    atomic_dir,
    clean_temp_dirs,
    remove_dir_atomic,
    retry,
    write_dir_atomic,
)


def _entries(parent: Path) -> list[str]:
    return sorted(os.listdir(parent)) if parent.exists() else []


def test_write_dir_atomic(tmp_path: Path) -> None:
    final = tmp_path / "a" / "b" / "v000001"
    write_dir_atomic(final, {"x.bin": b"\x00\x01", "y.json": b"{}"})
    assert (final / "x.bin").read_bytes() == b"\x00\x01"
    assert (final / "y.json").read_bytes() == b"{}"
    assert _entries(final.parent) == ["v000001"]  # no temp dir left
    assert oct(final.stat().st_mode & 0o777) == oct(atomic.DIR_MODE)


def test_existing_final_never_overwritten(tmp_path: Path) -> None:
    final = tmp_path / "v000001"
    write_dir_atomic(final, {"a": b"1"})
    with pytest.raises(DestinationExists):
        write_dir_atomic(final, {"a": b"2"})
    assert (final / "a").read_bytes() == b"1"
    # Even an empty dir (which plain rename(2) would replace) is not overwritten.
    empty = tmp_path / "v000002"
    empty.mkdir()
    with pytest.raises(DestinationExists):
        write_dir_atomic(empty, {"a": b"2"})
    assert list(empty.iterdir()) == []
    assert _entries(tmp_path) == ["v000001", "v000002"]


def test_race_at_rename_leaves_winner(tmp_path: Path) -> None:
    final = tmp_path / "v000001"
    with pytest.raises(DestinationExists):
        with atomic_dir(final) as tmp:
            (tmp / "mine").write_bytes(b"loser")
            write_dir_atomic(final, {"theirs": b"winner"})  # another writer wins meanwhile
    assert _entries(final) == ["theirs"]
    assert _entries(tmp_path) == ["v000001"]


def test_crash_inside_writer_leaves_nothing(tmp_path: Path) -> None:
    final = tmp_path / "v000001"
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_dir(final) as tmp:
            (tmp / "half").write_bytes(b"half-written")
            raise RuntimeError("boom")
    assert not final.exists()
    assert _entries(tmp_path) == []


def test_preexisting_temp_dir_from_crash(tmp_path: Path) -> None:
    # A writer that died mid-write left its temp dir behind.
    stale = tmp_path / ".v000001.tmp-999-deadbeef"
    stale.mkdir()
    (stale / "half").write_bytes(b"x")
    assert not (tmp_path / "v000001").exists()
    write_dir_atomic(tmp_path / "v000001", {"a": b"ok"})
    assert (tmp_path / "v000001" / "a").read_bytes() == b"ok"
    assert clean_temp_dirs(tmp_path, min_age_s=1e9) == []  # young ones are kept
    assert clean_temp_dirs(tmp_path, min_age_s=0) == [stale]
    assert _entries(tmp_path) == ["v000001"]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES, errno.EIO])
def test_write_error_reported_and_cleaned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    def failing_write(fd: int, data: bytes) -> int:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "write", failing_write)
    final = tmp_path / "v000001"
    with pytest.raises(StorageError) as info:
        write_dir_atomic(final, {"a": b"data"})
    assert info.value.errno == code
    assert str(final) in str(info.value)
    assert info.value.transient == (code != errno.EACCES)
    monkeypatch.undo()
    assert _entries(tmp_path) == []


def test_fsync_error_reported_and_cleaned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(StorageError) as info:
        write_dir_atomic(tmp_path / "v000001", {"a": b"data"})
    assert info.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert _entries(tmp_path) == []


def test_rename_error_cleaned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_rename(src: Path, dst: Path) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(atomic, "rename_noreplace", failing_rename)
    with pytest.raises(StorageError) as info:
        write_dir_atomic(tmp_path / "v000001", {"a": b"data"})
    assert info.value.errno == errno.EXDEV
    assert _entries(tmp_path) == []


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "", "a\x00"])
def test_bad_file_names_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError):
        write_dir_atomic(tmp_path / "v000001", {name: b"x"})
    assert _entries(tmp_path) == []


def test_remove_dir_atomic(tmp_path: Path) -> None:
    final = write_dir_atomic(tmp_path / "v000001", {"a": b"1"})
    remove_dir_atomic(final)
    assert _entries(tmp_path) == []
    with pytest.raises(StorageError):
        remove_dir_atomic(final)


def test_retry_backs_off_on_transient_then_succeeds() -> None:
    calls: list[int] = []
    sleeps: list[float] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise StorageError(errno.ENOSPC, "full")
        return "done"

    assert retry(flaky, attempts=5, base_delay_s=1.0, sleep=sleeps.append) == "done"
    assert len(calls) == 3
    assert len(sleeps) == 2
    assert 0.5 <= sleeps[0] <= 1.0 and 1.0 <= sleeps[1] <= 2.0  # exponential, jittered


def test_retry_does_not_retry_permanent_errors() -> None:
    calls: list[int] = []

    def denied() -> None:
        calls.append(1)
        raise StorageError(errno.EACCES, "denied")

    with pytest.raises(StorageError):
        retry(denied, attempts=5, sleep=lambda s: None)
    assert len(calls) == 1

    def exists() -> None:
        calls.append(1)
        raise DestinationExists(errno.EEXIST, "exists")

    with pytest.raises(DestinationExists):
        retry(exists, attempts=5, sleep=lambda s: None)
    assert len(calls) == 2


def test_retry_gives_up_after_attempts() -> None:
    calls: list[int] = []

    def always() -> None:
        calls.append(1)
        raise StorageError(errno.EIO, "io")

    with pytest.raises(StorageError):
        retry(always, attempts=3, sleep=lambda s: None)
    assert len(calls) == 3
