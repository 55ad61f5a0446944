"""Adapter versions under `<run>/adapters/v000042/`: publish, verify, list, collect.

A version dir holds exactly adapter_model.safetensors, adapter_config.json and
MANIFEST.json. The manifest records sha256 and size of each file plus run, version, step,
base model, creation time and format version; the sha256 of the manifest bytes is the
identity of the version (what trajectories carry and replicas check). Versions are
written with `atomic_dir`, so a dir under a `v######` name is always whole; verification
still recomputes every hash, since /shared is a network filesystem that other writers
share.

Every byte crosses the shared filesystem as few times as possible: the publisher hashes
the bytes it has (while the kernel writes them out) instead of reading them back, and a
reader verifies while it reads, each file once, hashing every chunk as it lands.
`read_verified_adapter` keeps those bytes, in memory no other process can change, so a
rollout replica loads exactly what it checked without a private copy or a second read.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import mmap
import os
import stat
import struct
import time
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)

from rlfleet.config import ClosedModel, validation_summary
from rlfleet.storage.atomic import (
    StorageError,
    atomic_dir,
    fsync_file,
    remove_dir_atomic,
    validate_file_name,
    write_file,
)
from rlfleet.storage.paths import (
    ADAPTERS_DIRNAME,
    CHECKPOINT_COMPLETE_FILE,
    CHECKPOINT_CURSOR_FILE,
    RunsRoot,
    parse_step_dirname,
    parse_version_dirname,
    validate_run_name,
)

ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"
MANIFEST_FILE = "MANIFEST.json"
ADAPTER_FILES = (ADAPTER_WEIGHTS_FILE, ADAPTER_CONFIG_FILE)
MANIFEST_FORMAT_VERSION = 1
MAX_MANIFEST_BYTES = 1 << 20
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024  # the limit safetensors itself applies
_CHUNK = 1 << 20  # read and hash in 1 MiB steps: each chunk is hashed while in cache
_HUGE_BUFFER = 2 << 20


class AdapterVerificationError(ValueError):
    """An adapter dir does not match its manifest (or has no valid manifest)."""


class VersionProtected(ValueError):
    """Refused to remove a version that is the latest or in the caller's keep set."""


class _Strict(ClosedModel):
    # strict: no coercion ("3" is not a version, true is not a size); unknown keys refused
    model_config = ConfigDict(strict=True, frozen=True)


class FileEntry(_Strict):
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    size: Annotated[int, Field(ge=0)]


class AdapterManifest(_Strict):
    """MANIFEST.json of an adapter version: what a reader checks every file against. Its
    sha256 (of the bytes as written) is the version's identity."""

    format_version: Literal[1] = MANIFEST_FORMAT_VERSION
    run: str
    version: Annotated[int, Field(ge=0)]
    step: Annotated[int, Field(ge=0)]
    base_model: str
    created_unix: float
    files: Mapping[str, FileEntry]
    # The lease generation of the learner that wrote it (rlfleet.storage.lease): ckpt-sync
    # announces no version older than the run's current generation. None: written
    # without a lease (a tool, a test), not fenced.
    generation: Annotated[int, Field(ge=1)] | None = None
    # rlfleet.policy.fingerprint of the base model the adapter was trained on: a replica
    # serving another model refuses it. None: not recorded (not checked).
    base_sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = None
    # sha256 of the manifest bytes as read/written; set by publish/verify/read; not part
    # of the document, nor of equality
    manifest_sha256: str = Field("", exclude=True)

    @field_validator("run")
    @classmethod
    def _run_name(cls, run: str) -> str:
        return validate_run_name(run)

    @field_validator("files")
    @classmethod
    def _file_names(cls, files: Mapping[str, FileEntry]) -> Mapping[str, FileEntry]:
        for name in files:
            validate_file_name(name)  # e.g. "../x": never hash a file outside the dir
            if name == MANIFEST_FILE:
                raise ValueError(f"{MANIFEST_FILE} lists itself")
        missing = [n for n in ADAPTER_FILES if n not in files]
        if missing:
            raise ValueError(f"does not list {missing}")
        return files

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AdapterManifest):
            return NotImplemented
        return self.model_dump() == other.model_dump()

    __hash__ = None  # type: ignore[assignment]  # a mapping inside: not hashable

    def to_json_bytes(self) -> bytes:
        doc = self.model_dump(mode="json")
        doc["files"] = dict(sorted(doc["files"].items()))
        for optional in ("generation", "base_sha256"):  # absent, not null, when unset
            if doc[optional] is None:
                del doc[optional]
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8")

    @classmethod
    def from_json_bytes(cls, data: bytes) -> AdapterManifest:
        """Parses and validates a manifest; AdapterVerificationError for anything off."""
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise AdapterVerificationError(f"{MANIFEST_FILE} is not valid JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise AdapterVerificationError(f"{MANIFEST_FILE} is not a JSON object")
        if doc.get("format_version") != MANIFEST_FORMAT_VERSION:
            raise AdapterVerificationError(
                f"{MANIFEST_FILE} format_version {doc.get('format_version')!r} is not "
                f"supported (expected {MANIFEST_FORMAT_VERSION})")
        if "manifest_sha256" in doc:
            raise AdapterVerificationError(f"{MANIFEST_FILE}: names its own sha256")
        try:
            manifest = cls.model_validate(doc)
        except ValidationError as exc:
            raise AdapterVerificationError(
                f"{MANIFEST_FILE}: {validation_summary(exc)}") from None
        return manifest.model_copy(update={"manifest_sha256": hashlib.sha256(data).hexdigest()})


# -- content checks ---------------------------------------------------------------------


def _check_safetensors_header(data: bytes) -> None:
    # Refuse garbage at publish time, cheaply: parse only the header.
    if len(data) < 8:
        raise ValueError(f"{ADAPTER_WEIGHTS_FILE} is too short to be safetensors")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_SAFETENSORS_HEADER or 8 + n > len(data):
        raise ValueError(f"{ADAPTER_WEIGHTS_FILE} has an invalid safetensors header length")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{ADAPTER_WEIGHTS_FILE} header is not valid JSON") from exc
    if not isinstance(header, dict):
        raise ValueError(f"{ADAPTER_WEIGHTS_FILE} header is not a JSON object")


def _check_config(data: bytes) -> None:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{ADAPTER_CONFIG_FILE} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValueError(f"{ADAPTER_CONFIG_FILE} is not a JSON object")


# -- publish ----------------------------------------------------------------------------


def publish_adapter_dir(
    runs_root: RunsRoot,
    run: str,
    version: int,
    files: Mapping[str, bytes] | os.PathLike[str] | str,
    base_model: str,
    step: int,
    *,
    created_unix: float | None = None,
    timings: dict[str, float] | None = None,
    generation: int | None = None,
    base_sha256: str | None = None,
) -> AdapterManifest:
    """Writes `<run>/adapters/v<version>` atomically and returns its manifest.

    `files` is either {"adapter_model.safetensors": ..., "adapter_config.json": ...}
    (exactly those names) or a directory holding them (e.g. PEFT `save_pretrained`
    output; other files there, like README.md, are not published). Raises ValueError for
    bad input, DestinationExists when the version is already published, StorageError for
    OS failures (the partial write is removed).

    The sha256 of each file is computed from the bytes in memory (never by reading the
    file back), in the background while the files are written and fsynced; then the
    manifest is written and synced, and only when every file is durable does the dir get
    its final name. Each file is fsynced once. `timings`, when given, receives the
    seconds spent per stage (wall clock; hashing and fsync overlap the writes).
    `generation` (the writer's lease generation) and `base_sha256` (the base model's
    fingerprint) go into the manifest when given.
    """
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        if timings is not None:
            timings[stage] = timings.get(stage, 0.0) + now - clock
        clock = now

    validate_run_name(run)
    if not isinstance(base_model, str) or not base_model:
        raise ValueError("base_model must be a non-empty string")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    final = runs_root.adapter_dir(run, version)

    if isinstance(files, Mapping):
        extra = sorted(set(files) - set(ADAPTER_FILES))
        missing = [n for n in ADAPTER_FILES if n not in files]
        if extra or missing:
            raise ValueError(f"adapter files must be exactly {list(ADAPTER_FILES)}; "
                             f"missing {missing}, unexpected {extra}")
        blobs = {n: bytes(files[n]) for n in ADAPTER_FILES}  # no copy for bytes
    else:
        src = Path(files)
        blobs = {}
        for n in ADAPTER_FILES:
            p = src / n
            if not p.is_file():
                raise ValueError(f"source dir {src} has no {n}")
            blobs[n] = p.read_bytes()
    _check_safetensors_header(blobs[ADAPTER_WEIGHTS_FILE])
    _check_config(blobs[ADAPTER_CONFIG_FILE])
    created = float(time.time() if created_unix is None else created_unix)
    lap("check_s")

    with atomic_dir(final, files_synced=True) as tmp, \
            ThreadPoolExecutor(max_workers=2 * len(blobs),
                               thread_name_prefix="adapter-publish") as pool:
        # The learner has the bytes: hash them (hashlib releases the GIL) while they are
        # written and while the disk takes them; never read a file back to hash it.
        hashes = {n: pool.submit(sha256_of, b) for n, b in blobs.items()}
        syncs = []
        for n, b in blobs.items():
            path = write_file(tmp, n, b, fsync=False, start_writeback=True)
            syncs.append(pool.submit(fsync_file, path))
        lap("write_s")
        entries = {n: FileEntry(sha256=f.result()[0], size=len(blobs[n]))
                   for n, f in hashes.items()}
        lap("hash_wait_s")
        for f in syncs:
            f.result()  # an OSError here removes the temp dir (atomic_dir)
        lap("fsync_wait_s")
        manifest = AdapterManifest(
            run=run, version=version, step=step, base_model=base_model,
            created_unix=created, files=entries, generation=generation,
            base_sha256=base_sha256,
        )
        manifest_bytes = manifest.to_json_bytes()
        # The manifest last: a manifest present means the files it names were written.
        write_file(tmp, MANIFEST_FILE, manifest_bytes)
        lap("manifest_s")
    # (leaving the pool waited for every task, also when one failed)
    lap("rename_s")  # dir fsync, rename without replace, parent fsync
    return manifest.model_copy(
        update={"manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest()})


def sha256_of(source: bytes | memoryview | Path) -> tuple[str, int]:
    """(sha256 hex, size in bytes) of bytes in memory, or of a file read in 1 MiB chunks
    (each chunk hashed while in cache; a file is never held whole). The one way the runs
    root hashes what it writes and verifies: adapter versions and checkpoints."""
    if not isinstance(source, Path):
        return hashlib.sha256(source).hexdigest(), len(source)
    h = hashlib.sha256()
    size = 0
    with open(source, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


# -- verify -----------------------------------------------------------------------------


def read_manifest(path: Path) -> AdapterManifest:
    """Parses `path/MANIFEST.json` without hashing the files (cheap; not a verification)."""
    mpath = Path(path) / MANIFEST_FILE
    try:
        st = os.lstat(mpath)
    except FileNotFoundError as exc:
        raise AdapterVerificationError(f"{path} has no {MANIFEST_FILE}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise AdapterVerificationError(f"{mpath} is not a regular file")
    if st.st_size > MAX_MANIFEST_BYTES:
        raise AdapterVerificationError(f"{mpath} is {st.st_size} bytes, too large")
    return AdapterManifest.from_json_bytes(mpath.read_bytes())


@dataclass(frozen=True)
class VerifiedAdapter:
    """A version read into private memory: `files` holds, per file the manifest lists,
    exactly the bytes whose sha256 and size matched it (nobody else can change them
    after the check), and `manifest_bytes` the manifest whose sha256 is the identity."""

    path: Path
    manifest: AdapterManifest
    manifest_bytes: bytes
    files: Mapping[str, memoryview]

    @property
    def nbytes(self) -> int:
        return sum(len(v) for v in self.files.values())


def private_buffer(size: int) -> memoryview:
    """`size` bytes of writable anonymous memory that only this process maps. Large
    buffers ask for transparent huge pages: filling 170 MB then costs ~300 page faults
    instead of ~40k. The memory is freed when the last view (or tensor over it) goes."""
    if size < _HUGE_BUFFER:
        return memoryview(bytearray(size))
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(AttributeError, OSError, ValueError):
        m.madvise(mmap.MADV_HUGEPAGE)
    return memoryview(m)


def read_fd_into(fd: int, size: int, into: memoryview | None, hasher: Any = None,
                 what: str = "file") -> int:
    """Reads exactly `size` bytes from `fd` (into `into`, or through a small scratch
    buffer when None), feeding each chunk to `hasher` right after it lands (one pass over
    the bytes, while they are in cache). Raises AdapterVerificationError if the file
    turns out shorter or longer than `size` (it changed while being read)."""
    got = 0
    scratch = memoryview(bytearray(min(size, _CHUNK) or 1)) if into is None else None
    while got < size:
        want = min(_CHUNK, size - got)
        dest = into[got:got + want] if into is not None else scratch[:want]
        n = os.readv(fd, [dest])
        if n == 0:
            break
        if hasher is not None:
            hasher.update(dest[:n])
        got += n
    if got != size or os.read(fd, 1):
        raise AdapterVerificationError(
            f"{what} changed while being read: size is not the {size} bytes it had")
    return got


def _open_in(dir_fd: int, dirpath: Path, name: str, missing: str = "") -> int:
    # O_NOFOLLOW: a symlink is never followed out of the version dir; O_NONBLOCK: a FIFO
    # planted under a listed name cannot hang the reader (fstat refuses it next).
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except FileNotFoundError as exc:
        raise AdapterVerificationError(
            missing or f"{dirpath}: files missing: [{name!r}]") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise AdapterVerificationError(f"{dirpath}: {name} is not a regular file "
                                           "(a symlink)") from exc
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise AdapterVerificationError(f"{dirpath}: {name} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_version(path: Path | str, expected_sha256: str | None, *, keep: bool
                  ) -> VerifiedAdapter:
    """The one verification: every file read once, hashed as it is read, checked against
    the manifest; with `keep`, the bytes are kept (in private memory) and returned."""
    path = Path(path)
    try:
        dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            raise AdapterVerificationError(f"{path} is not a directory") from exc
        raise
    try:
        mfd = _open_in(dir_fd, path, MANIFEST_FILE, f"{path} has no {MANIFEST_FILE}")
        try:
            msize = os.fstat(mfd).st_size
            if msize > MAX_MANIFEST_BYTES:
                raise AdapterVerificationError(
                    f"{path / MANIFEST_FILE} is {msize} bytes, too large")
            mbuf = memoryview(bytearray(msize))
            read_fd_into(mfd, msize, mbuf, what=f"{path / MANIFEST_FILE}")
            manifest_bytes = bytes(mbuf)
        finally:
            os.close(mfd)
        manifest = AdapterManifest.from_json_bytes(manifest_bytes)
        if expected_sha256 is not None and manifest.manifest_sha256 != expected_sha256:
            raise AdapterVerificationError(
                f"{path}: manifest sha256 {manifest.manifest_sha256} != expected "
                f"{expected_sha256}")

        dir_version = parse_version_dirname(path.name)
        if dir_version is not None and dir_version != manifest.version:
            raise AdapterVerificationError(
                f"{path}: manifest says version {manifest.version}, dir is {path.name}")
        if dir_version is not None and path.parent.name == ADAPTERS_DIRNAME \
                and path.parent.parent.name != manifest.run:
            raise AdapterVerificationError(
                f"{path}: manifest says run {manifest.run!r}, dir is under "
                f"{path.parent.parent.name!r}")

        present = set(os.listdir(dir_fd)) - {MANIFEST_FILE}
        extra = sorted(present - set(manifest.files))
        if extra:
            raise AdapterVerificationError(f"{path}: files not in the manifest: {extra}")
        missing = sorted(set(manifest.files) - present)
        if missing:
            raise AdapterVerificationError(f"{path}: files missing: {missing}")

        kept: dict[str, memoryview] = {}
        for name, want in sorted(manifest.files.items()):
            fd = _open_in(dir_fd, path, name)
            try:
                size = os.fstat(fd).st_size
                if size != want.size:
                    raise AdapterVerificationError(
                        f"{path}: {name} size {size} != manifest {want.size}")
                into = private_buffer(want.size) if keep else None
                h = hashlib.sha256()
                read_fd_into(fd, want.size, into, h, what=f"{path}: {name}")
            finally:
                os.close(fd)
            got = h.hexdigest()
            if got != want.sha256:
                raise AdapterVerificationError(
                    f"{path}: {name} sha256 {got} != manifest {want.sha256}")
            if into is not None:
                kept[name] = into
    finally:
        os.close(dir_fd)
    return VerifiedAdapter(path, manifest, manifest_bytes, kept)


def verify_adapter_dir(
    path: Path | str,
    *,
    expected_sha256: str | None = None,
) -> AdapterManifest:
    """Recomputes every file's sha256 and size against MANIFEST.json; returns the manifest.

    Refuses (AdapterVerificationError): no dir (or a symlink in its place), no/invalid
    manifest, a listed file missing, an unlisted file present, a symlink or non-regular
    entry, a size or sha256 mismatch (also a file that changes size while it is read), a
    manifest whose version/run disagree with the dir's place in the layout, and, when
    `expected_sha256` is given, a manifest whose own sha256 differs (the version identity
    a trajectory or ckpt-sync announced). Each file is read once, through a small buffer.
    """
    return _read_version(path, expected_sha256, keep=False).manifest


def read_verified_adapter(
    path: Path | str,
    *,
    expected_sha256: str | None,
    run: str | None = None,
    version: int | None = None,
) -> VerifiedAdapter:
    """Reads a version into private memory, verifying it exactly as `verify_adapter_dir`
    does while it reads (each file read once and hashed chunk by chunk as it lands), and
    returns the verified bytes, so a caller can load exactly what was checked without
    reading the shared filesystem again. `run`/`version`, when given, must be what the
    manifest names. Raises AdapterVerificationError (and keeps nothing) otherwise.

    `expected_sha256` is the version's identity (the announced manifest sha256). It must
    be given explicitly; None only for reading ahead of the announcement, and then the
    caller must compare `manifest.manifest_sha256` with the identity before using any of
    the bytes."""
    if expected_sha256 is not None and (not isinstance(expected_sha256, str)
                                        or not expected_sha256):
        raise AdapterVerificationError("the expected manifest sha256 is required")
    verified = _read_version(path, expected_sha256, keep=True)
    m = verified.manifest
    if (run is not None and m.run != run) or (version is not None and m.version != version):
        raise AdapterVerificationError(
            f"{verified.path}: manifest names run {m.run!r} version {m.version}, "
            f"expected run {run!r} version {version}")
    return verified


def manifest_sha256(path: Path | str) -> str:
    """sha256 (hex) of `path/MANIFEST.json` bytes: the identity of an adapter version."""
    mpath = Path(path) / MANIFEST_FILE
    try:
        return hashlib.sha256(mpath.read_bytes()).hexdigest()
    except FileNotFoundError as exc:
        raise AdapterVerificationError(f"{path} has no {MANIFEST_FILE}") from exc


# -- listing and collection --------------------------------------------------------------


def list_versions(runs_root: RunsRoot, run: str) -> list[int]:
    """Published versions of `run`, ascending: `v######` dirs holding a MANIFEST.json.
    Temp dirs (in-progress or crashed writes) are never listed. Hashes are not checked."""
    root = runs_root.adapters_root(run)
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    versions = []
    for e in entries:
        v = parse_version_dirname(e.name)
        if v is None or not e.is_dir(follow_symlinks=False):
            continue
        if os.path.isfile(os.path.join(e.path, MANIFEST_FILE)):
            versions.append(v)
    return sorted(versions)


def latest_version(runs_root: RunsRoot, run: str) -> int | None:
    """The highest published version of `run`, or None."""
    versions = list_versions(runs_root, run)
    return versions[-1] if versions else None


def checkpoint_adapter_versions(runs_root: RunsRoot, run: str) -> set[int]:
    """The adapter versions that `run`'s complete checkpoints were serving when saved
    (the `version` of their data cursor): garbage collection spares them, so every
    checkpoint keeps the published, servable form of its policy. Unreadable cursors are
    skipped (the checkpoint itself is then unusable for a resume too)."""
    try:
        entries = list(os.scandir(runs_root.checkpoints_root(run)))
    except FileNotFoundError:
        return set()
    versions: set[int] = set()
    for e in entries:
        if parse_step_dirname(e.name) is None or \
                not os.path.isfile(os.path.join(e.path, CHECKPOINT_COMPLETE_FILE)):
            continue
        try:
            with open(os.path.join(e.path, CHECKPOINT_CURSOR_FILE), "rb") as f:
                versions.add(int(json.loads(f.read(MAX_MANIFEST_BYTES))["version"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return versions


def remove_version(
    runs_root: RunsRoot,
    run: str,
    version: int,
    *,
    keep: Collection[int] = (),
) -> None:
    """Deletes one version (garbage collection). Never the latest, never one in `keep`
    (e.g. versions replicas still serve): those raise VersionProtected. The dir is renamed
    away first, so readers see it whole or not at all."""
    if version in keep:
        raise VersionProtected(f"version {version} of run {run!r} is in the keep set")
    latest = latest_version(runs_root, run)
    if latest is not None and version >= latest:
        raise VersionProtected(f"version {version} of run {run!r} is the latest ({latest})")
    path = runs_root.adapter_dir(run, version)
    if not path.is_dir():
        raise StorageError(2, f"no adapter version {version} for run {run!r}: {path}")
    remove_dir_atomic(path)


def prune_versions(
    runs_root: RunsRoot,
    run: str,
    keep_last: int,
    *,
    keep: Collection[int] = (),
) -> list[int]:
    """Removes all but the newest `keep_last` (>= 1) versions, sparing `keep`.
    Returns the versions removed."""
    if keep_last < 1:
        raise ValueError("keep_last must be >= 1 (the latest version is always kept)")
    versions = list_versions(runs_root, run)
    doomed = [v for v in versions[:-keep_last] if v not in keep]
    for v in doomed:
        remove_version(runs_root, run, v, keep=keep)
    return doomed
