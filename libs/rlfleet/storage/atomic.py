"""Atomic directory writes: a directory appears under its final name whole, or not at all.

Protocol (`atomic_dir`): make a temp dir beside the target (same filesystem, name starting
with "." so listings skip it), let the caller write into it, fsync every file (once: not
again where the writer already did) and the temp dir, rename it to the final name without
replacing anything (renameat2 RENAME_NOREPLACE where the kernel and filesystem support
it), fsync the parent. A failure at any point removes the temp dir and leaves the final
name untouched; OS errors come out as `StorageError` (with `errno`) so callers can tell a
full disk from a bug.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import random
import re
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

TEMP_MARK = ".tmp-"
DELETE_MARK = ".del-"
FILE_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
DIR_MODE = 0o755  # mkdtemp makes 0700; readers in other pods (other uids) must list it
FILE_MODE = 0o644
_CHUNK = 8 << 20

# Errors worth retrying after a pause: space freed by GC, a busy or flaky network
# filesystem. EACCES / EROFS / EEXIST are not: retrying cannot fix them.
TRANSIENT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EAGAIN, errno.EBUSY, errno.EINTR,
     errno.ESTALE, errno.ETIMEDOUT, errno.ENOLCK}
)


class StorageError(OSError):
    """An OS-level failure reading or writing the runs root. `errno` is kept."""

    @property
    def transient(self) -> bool:
        return self.errno in TRANSIENT_ERRNOS


class DestinationExists(StorageError):
    """The final directory already exists; atomic writes never overwrite."""


def _storage_error(exc: OSError, what: str, path: Path | str) -> StorageError:
    cls = DestinationExists if exc.errno == errno.EEXIST else StorageError
    reason = exc.strerror or str(exc)
    err = cls(exc.errno, f"{what} {path}: {reason}")
    err.filename = str(path)
    return err


def validate_file_name(name: str) -> str:
    """A flat file name inside a managed dir: `[A-Za-z0-9._-]{1,128}`, not "."/"..", no
    leading "." (those names are reserved for temp files)."""
    if (not isinstance(name, str) or not FILE_NAME_RE.fullmatch(name)
            or name.startswith(".")):
        raise ValueError(f"invalid file name {name!r}: expected 1-128 characters of "
                         "[A-Za-z0-9._-] not starting with '.'")
    return name


def is_temp_name(name: str) -> bool:
    """Whether a directory entry is an in-progress write or delete (never a result)."""
    return name.startswith(".") and (TEMP_MARK in name or DELETE_MARK in name)


# -- fsync helpers --------------------------------------------------------------------


def fsync_dir(path: Path | str) -> None:
    """fsync a directory so entries created/renamed in it survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        # A few filesystems refuse fsync on a directory; there is nothing more to do there.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def fsync_file(path: Path | str) -> None:
    """fsync a regular file by path (covers files written by other libraries)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(directory: Path, name: str, data: bytes | memoryview, *, fsync: bool = True,
               start_writeback: bool = False) -> Path:
    """Creates `directory/name` (must not exist), writes all of `data`, fsyncs it (unless
    `fsync=False`: the caller syncs it later, e.g. with `fsync_file` while it does other
    work, or the file is a private scratch copy that needs no durability).
    `start_writeback=True` asks the kernel to start writing each chunk out as soon as it
    is written (sync_file_range), so the disk works while the rest is still being
    written and a later fsync has less left to wait for; it is only a hint."""
    path = directory / validate_file_name(name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        view = memoryview(data).cast("B")
        offset = 0
        while view:
            n = os.write(fd, view[:_CHUNK])
            if start_writeback:
                _start_writeback(fd, offset, n)
            offset += n
            view = view[n:]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return path


def replace_file(directory: Path, name: str, data: bytes) -> Path:
    """`directory/name` holds `data`, whole: written and fsynced under a temp name beside
    it, renamed over the old file (a reader sees the old content or the new, never part
    of either), the directory fsynced. For small records that change (unlike
    `write_file`, which never replaces)."""
    directory = Path(directory)
    final = directory / validate_file_name(name)
    tmp = directory / f".{name}{TEMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        try:
            view = memoryview(data).cast("B")
            while view:
                view = view[os.write(fd, view[:_CHUNK]):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        fsync_dir(directory)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _storage_error(exc, "cannot write", final) from exc
    return final


def ensure_dir(path: Path) -> None:
    """mkdir -p that fsyncs the parent of each directory it creates."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            pass  # a concurrent writer made it
        fsync_dir(d.parent)
    if not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"not a directory: {path}")


# -- rename without replace ------------------------------------------------------------

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_SYNC_FILE_RANGE_WRITE = 2
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _renameat2 = getattr(_libc, "renameat2", None)
    _sync_file_range = getattr(_libc, "sync_file_range", None)
except OSError:  # pragma: no cover - non-glibc platforms
    _renameat2 = _sync_file_range = None
if _sync_file_range is not None:
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong,
                                 ctypes.c_uint]


def _start_writeback(fd: int, offset: int, nbytes: int) -> None:
    # Initiates (does not wait for) write-out of the range; failures are irrelevant: the
    # fsync that follows is what guarantees durability.
    if _sync_file_range is not None:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


def rename_noreplace(src: Path, dst: Path) -> None:
    """Renames src to dst, failing with FileExistsError when dst exists.

    Plain rename(2) would silently replace an *empty* destination directory; renameat2
    with RENAME_NOREPLACE closes that race. Where the filesystem does not support the flag
    we fall back to check-then-rename (a race only with a concurrent empty mkdir).
    """
    if _renameat2 is not None:
        rc = _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst),
                        _RENAME_NOREPLACE)
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), str(dst))
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    os.rename(src, dst)


# -- atomic directory --------------------------------------------------------------------


def _fsync_tree(root: Path, *, files: bool = True) -> None:
    # Files first, then their directories, then the root: a directory entry is only
    # durable once the directory itself is synced. `files=False`: the writer already
    # fsynced every file (write_file does), so only the directories are left.
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        if files:
            for name in filenames:
                p = os.path.join(dirpath, name)
                if stat.S_ISREG(os.lstat(p).st_mode):
                    fsync_file(p)
        fsync_dir(dirpath)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(final_dir: Path, *, files_synced: bool = False) -> Iterator[Path]:
    """Yields a temp dir beside `final_dir`; on clean exit it becomes `final_dir`.

    Raises DestinationExists (before the body runs, and again at the rename if someone
    else won the race). An exception in the body, or any OS error while syncing/renaming,
    removes the temp dir; OSErrors are re-raised as StorageError, anything else as is.

    `files_synced=True` is the writer's promise that every file it created is already
    fsynced (e.g. all through `write_file`, which syncs each one): then only the
    directories are synced before the rename, not every file a second time.
    """
    final_dir = Path(final_dir)
    parent = final_dir.parent
    if os.path.lexists(final_dir):
        raise DestinationExists(errno.EEXIST, f"refusing to overwrite existing {final_dir}")
    try:
        ensure_dir(parent)
    except OSError as exc:
        raise _storage_error(exc, "cannot create", parent) from exc
    tmp = parent / f".{final_dir.name}{TEMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        os.mkdir(tmp, 0o700)
    except OSError as exc:
        raise _storage_error(exc, "cannot create temp dir in", parent) from exc
    try:
        yield tmp
        _fsync_tree(tmp, files=not files_synced)
        os.chmod(tmp, DIR_MODE)
        rename_noreplace(tmp, final_dir)
    except BaseException as exc:
        _remove_tree(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, StorageError):
            raise _storage_error(exc, "atomic write of", final_dir) from exc
        raise
    try:
        fsync_dir(parent)
    except OSError as exc:
        # The rename happened and the dir is complete; only its durability across a power
        # loss is in doubt. Report it rather than pretend, but do not delete good data.
        raise _storage_error(exc, "fsync of parent after publishing", final_dir) from exc


def write_dir_atomic(final_dir: Path, files: Mapping[str, bytes]) -> Path:
    """Writes `files` (flat names -> bytes) as `final_dir`, atomically. Returns final_dir."""
    for name in files:
        validate_file_name(name)
    with atomic_dir(final_dir, files_synced=True) as tmp:  # write_file syncs each file
        for name, data in files.items():
            write_file(tmp, name, data)
    return Path(final_dir)


def remove_dir_atomic(path: Path) -> None:
    """Removes a published dir so readers never see it half-deleted: rename it to a temp
    name first (atomic), then delete the renamed tree."""
    path = Path(path)
    doomed = path.parent / f".{path.name}{DELETE_MARK}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        os.rename(path, doomed)
        fsync_dir(path.parent)
    except OSError as exc:
        raise _storage_error(exc, "cannot remove", path) from exc
    try:
        shutil.rmtree(doomed)
    except OSError as exc:
        # The name is gone already (what readers care about); the leftover temp tree is
        # collected by clean_temp_dirs.
        log.warning("leftover after removing %s: %s", path, exc, extra={"path": str(doomed)})


def clean_temp_dirs(parent: Path, min_age_s: float = 3600.0) -> list[Path]:
    """Removes temp dirs (crashed writes/deletes) in `parent` whose mtime is at least
    `min_age_s` old; younger ones may belong to a writer still running. Returns those
    removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except FileNotFoundError:
        return removed
    now = time.time()
    for e in entries:
        if not is_temp_name(e.name):
            continue
        try:
            age = now - e.stat(follow_symlinks=False).st_mtime
        except FileNotFoundError:
            continue
        if age >= min_age_s:
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(e.path)
            removed.append(Path(e.path))
    return removed


# -- retry -----------------------------------------------------------------------------

_jitter = random.Random()  # private: never consume the global RNG (checkpoints restore it)


def is_transient(exc: BaseException) -> bool:
    """Default retry predicate: StorageError/OSError with a transient errno."""
    if isinstance(exc, DestinationExists):
        return False
    return isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS


def retry(
    fn: Callable[[], T],
    *,
    attempts: int = 5,
    base_delay_s: float = 0.2,
    max_delay_s: float = 10.0,
    retry_on: Callable[[BaseException], bool] = is_transient,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Calls `fn` until it succeeds, retrying errors `retry_on` accepts with exponential
    backoff (full jitter) up to `attempts` calls in all; the last error propagates."""
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if attempt == attempts or not retry_on(exc):
                raise
            delay = min(max_delay_s, base_delay_s * (2 ** (attempt - 1)))
            delay = _jitter.uniform(delay / 2, delay)
            log.warning("storage operation failed, retrying", extra={
                "attempt": attempt, "delay_s": round(delay, 3), "error": str(exc)})
            sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover
