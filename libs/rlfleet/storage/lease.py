"""One learner per run: a lease on the run, kept on the runs root (/shared: the truth).

The lease is a directory of generation files, `<run>/lease/g000007.json`: the highest
generation is the current lease. A learner takes the lease by creating the next
generation's file with `link()` from a private temp file, which fails with EEXIST when
another learner created it first (atomic on local filesystems and NFS alike), so two
learners starting at the same instant cannot both win: the loser reads the winner's file
and is refused. The holder renews its own file (write a temp file, rename over) every
quarter of the lease's length; a file that is not renewed by its `expires` time, or
whose holder released it, may be taken over by the next generation. A holder that
finds a higher generation than its own was fenced off: it must stop writing.

The generation is the fencing token: every adapter version records the generation of
the learner that wrote it, and ckpt-sync refuses to announce a version whose generation
is older than the run's current one (a learner that was paused past its lease, then woke
up, cannot reach the replicas).

Expiry compares wall clocks of different machines (the holder's `expires`, the reader's
now): the lease's length should dwarf their skew. A holder on this machine and in this
PID namespace whose process is gone (killed) is taken over at once, without waiting.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rlfleet.storage.atomic import fsync_dir
from rlfleet.storage.paths import RunsRoot, validate_run_name

log = logging.getLogger(__name__)

LEASE_DIRNAME = "lease"
GENERATION_RE = re.compile(r"g(\d{6,})\.json")
KEEP_GENERATIONS = 3  # older generation files are removed by the next holder
MAX_LEASE_BYTES = 64 * 1024
POD_ENV = ("RLFLEET_POD_NAME", "POD_NAME")  # the chart's downward-API name, where set


class LeaseHeld(RuntimeError):
    """Another live learner holds the run's lease."""

    def __init__(self, run: str, holder: LeaseRecord) -> None:
        self.run = run
        self.holder = holder
        super().__init__(
            f"run {run!r} is held by another learner: {holder.describe()} (generation "
            f"{holder.generation}, renewing its lease); stop that learner, or start a run "
            "of another name")


class LeaseLost(RuntimeError):
    """This learner's lease was taken over (it was paused or cut off past its expiry):
    it must write nothing more to the run."""


@dataclass(frozen=True)
class LeaseRecord:
    """One generation file: who holds (or held) the run, since when, until when."""

    generation: int
    token: str  # unique per acquisition: tells this holder's file from any other
    host: str
    pid: int
    pod: str
    since: float
    renewed: float
    expires: float
    released: bool = False
    pid_namespace: str = ""
    process_start: str = ""  # /proc/<pid>/stat's start time: a reused pid is not it

    def describe(self) -> str:
        pod = f", pod {self.pod}" if self.pod and self.pod != self.host else ""
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since))
        return f"pid {self.pid} on host {self.host}{pod}, since {since}"

    def expired(self, now: float | None = None) -> bool:
        return self.released or (time.time() if now is None else now) >= self.expires

    def gone_here(self) -> bool:
        """Whether the holder ran on this machine, in this PID namespace, and its process
        is gone (killed, crashed): a lease nobody can renew any more."""
        if self.host != socket.gethostname() or self.pid_namespace != _pid_namespace() \
                or not self.pid_namespace:
            return False
        return bool(self.process_start) and _process_start(self.pid) != self.process_start

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), sort_keys=True) + "\n").encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes) -> LeaseRecord:
        doc = json.loads(data.decode("utf-8"))
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        return cls(generation=int(doc["generation"]), token=str(doc["token"]),
                   host=str(doc["host"]), pid=int(doc["pid"]), pod=str(doc.get("pod", "")),
                   since=float(doc["since"]), renewed=float(doc["renewed"]),
                   expires=float(doc["expires"]), released=bool(doc.get("released", False)),
                   pid_namespace=str(doc.get("pid_namespace", "")),
                   process_start=str(doc.get("process_start", "")))


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _process_start(pid: int) -> str:
    """The start time of process `pid` (clock ticks since boot), "" when there is no such
    live process (a zombie, whose parent has not reaped it, is gone too)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat[stat.rfind(")") + 2:].split()  # after the command name, which may hold spaces
    if not fields or fields[0] in ("Z", "X"):
        return ""
    return fields[19] if len(fields) > 19 else ""


def lease_dir(root: RunsRoot, run: str) -> Path:
    """`<root>/<run>/lease`."""
    return root.resolve(f"{validate_run_name(run)}/{LEASE_DIRNAME}")


def _generations(directory: Path) -> list[int]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := GENERATION_RE.fullmatch(n)))


def _gen_path(directory: Path, generation: int) -> Path:
    return directory / f"g{generation:06d}.json"


def _read(path: Path, generation: int) -> LeaseRecord:
    """A generation file. One that cannot be read as a lease (damaged by hand) counts as
    expired at once: it names nobody who could renew it."""
    try:
        with open(path, "rb") as f:
            return LeaseRecord.from_bytes(f.read(MAX_LEASE_BYTES))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("unreadable lease file counts as expired",
                    extra={"path": str(path), "error": str(exc)})
        return LeaseRecord(generation, "", "?", 0, "", 0.0, 0.0, 0.0, released=True)


def current_lease(root: RunsRoot, run: str) -> LeaseRecord | None:
    """The run's current lease (its highest generation), or None when none was ever
    taken."""
    directory = lease_dir(root, run)
    for generation in reversed(_generations(directory)):
        try:
            return _read_existing(_gen_path(directory, generation), generation)
        except FileNotFoundError:  # pruned between the listing and the read
            continue
    return None


def _read_existing(path: Path, generation: int) -> LeaseRecord:
    if not path.exists():
        raise FileNotFoundError(path)
    return _read(path, generation)


def current_generation(root: RunsRoot, run: str) -> int:
    """The run's current lease generation (0: no lease was ever taken)."""
    generations = _generations(lease_dir(root, run))
    return generations[-1] if generations else 0


def _write_private(directory: Path, data: bytes) -> Path:
    """A temp file in `directory` with `data`, fsynced (then linked or renamed)."""
    tmp = directory / f".tmp-lease-{os.getpid()}-{uuid.uuid4().hex}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


class RunLease:
    """This process's claim on a run: `acquire` it before writing anything to the run,
    `ensure_held` before each write, `release` at the end (a released lease is taken by
    the next learner at once)."""

    def __init__(self, root: RunsRoot, run: str, ttl_s: float) -> None:
        if not ttl_s > 0:
            raise ValueError(f"a lease lasts a positive time, got {ttl_s!r}")
        self.root = root
        self.run = validate_run_name(run)
        self.ttl_s = float(ttl_s)
        self.dir = lease_dir(root, run)
        self.record: LeaseRecord | None = None
        self.taken_over: LeaseRecord | None = None  # the expired lease this one replaced
        self._lost: str = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def generation(self) -> int:
        return self.record.generation if self.record else 0

    @property
    def renew_every_s(self) -> float:
        return self.ttl_s / 4

    # -- taking it ---------------------------------------------------------------------

    def acquire(self) -> LeaseRecord:
        """Takes the run's lease and starts renewing it. A lease held by another learner
        is watched: renewed while watched, it is refused (LeaseHeld); expired, released,
        or held by a process of this machine that is gone, it is taken over (the next
        generation)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        watched: LeaseRecord | None = None
        while True:
            current = current_lease(self.root, self.run)
            now = time.time()
            if current is None or current.expired(now) or current.gone_here():
                mine = self._try_create((current.generation if current else 0) + 1, now)
                if mine is not None:
                    if current is not None and not current.released:
                        self.taken_over = current
                    break
                continue  # another learner created that generation first: look at it
            if watched is not None and watched.generation == current.generation \
                    and current.renewed != watched.renewed:
                raise LeaseHeld(self.run, current)
            if watched is None or watched.generation != current.generation:
                watched = current
            # until its next renewal shows the holder alive, or its expiry
            time.sleep(max(0.01, min(0.25, self.renew_every_s / 4,
                                     current.expires - now)))
        self._prune()
        self._thread = threading.Thread(target=self._renew_loop, daemon=True,
                                        name=f"lease-{self.run}")
        self._thread.start()
        return mine

    def _try_create(self, generation: int, now: float) -> LeaseRecord | None:
        pod = next((os.environ[k] for k in POD_ENV if os.environ.get(k)), "")
        record = LeaseRecord(
            generation=generation, token=uuid.uuid4().hex, host=socket.gethostname(),
            pid=os.getpid(), pod=pod, since=now, renewed=now, expires=now + self.ttl_s,
            pid_namespace=_pid_namespace(), process_start=_process_start(os.getpid()))
        target = _gen_path(self.dir, generation)
        tmp = _write_private(self.dir, record.to_bytes())
        try:
            os.link(tmp, target)  # fails if that generation exists: one winner
        except FileExistsError:
            # NFS may report EEXIST for a link() whose first attempt succeeded: re-read
            if _read(target, generation).token != record.token:
                return None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        fsync_dir(self.dir)
        # Re-read: the winner is whoever the highest generation names.
        if current_generation(self.root, self.run) != generation or \
                _read(target, generation).token != record.token:
            return None
        self.record = record
        return record

    def _prune(self) -> None:
        for generation in _generations(self.dir)[:-KEEP_GENERATIONS]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_gen_path(self.dir, generation))

    # -- keeping it --------------------------------------------------------------------

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_every_s):
            try:
                self.renew()
            except LeaseLost:  # said once, by whoever writes next (ensure_held)
                log.warning("lease renewal stopped: another learner holds the run now",
                            extra={"run": self.run})
                return
            except OSError as exc:  # /shared away for a moment: the next tick retries
                log.warning("lease not renewed", extra={"run": self.run, "error": str(exc)})

    def renew(self) -> None:
        """Pushes the lease's expiry on (LeaseLost when a newer generation exists)."""
        with self._lock:
            self._check_generation()
            assert self.record is not None
            now = time.time()
            record = replace(self.record, renewed=now, expires=now + self.ttl_s)
            tmp = _write_private(self.dir, record.to_bytes())
            try:
                os.replace(tmp, _gen_path(self.dir, record.generation))
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
            self.record = record

    def _check_generation(self) -> None:
        if self._lost:
            raise LeaseLost(self._lost)
        if self.record is None:
            raise LeaseLost(f"no lease on run {self.run!r} was taken")
        current = current_generation(self.root, self.run)
        if current != self.record.generation:
            newer = current_lease(self.root, self.run)
            who = f" by {newer.describe()}" if newer is not None else ""
            self._lost = (f"the lease on run {self.run!r} (generation "
                          f"{self.record.generation}) was taken over{who} (generation "
                          f"{current}): this learner was cut off past its lease")
            raise LeaseLost(self._lost)

    def ensure_held(self) -> None:
        """Before a write to the run: LeaseLost when this learner no longer holds it (a
        newer generation exists, or its own lease ran out unrenewed)."""
        self._check_generation()
        assert self.record is not None
        if time.time() >= self.record.expires:
            self._lost = (f"the lease on run {self.run!r} expired unrenewed (the runs root "
                          "could not be written for its whole length)")
            raise LeaseLost(self._lost)

    def release(self) -> None:
        """Stops renewing; marks the lease released when this learner still holds it, so
        the next learner takes the run at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl_s)
        with self._lock:
            if self.record is None or self._lost:
                return
            try:
                if current_generation(self.root, self.run) != self.record.generation:
                    return
                record = replace(self.record, released=True, renewed=time.time())
                tmp = _write_private(self.dir, record.to_bytes())
                os.replace(tmp, _gen_path(self.dir, record.generation))
                self.record = record
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EIO):
                    raise
                log.warning("lease not released; it expires on its own",
                            extra={"run": self.run, "error": str(exc)})
