"""Finding processes by a mark they inherited: a variable in their environment.

A process started with a variable in its environment passes it on to everything it starts
(children, grandchildren re-parented to init when their parent died, Ray's daemons and
workers), so the mark finds all of them wherever they ended up in the process tree. Read
from /proc/<pid>/environ: the environment a process was exec'd with (a process forked
without an exec, as the fork server's children are, shows its parent's).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Process:
    pid: int
    cmd: str  # its command line, at most 200 characters
    env: dict[str, str]
    started: int  # clock ticks after boot (/proc/<pid>/stat), as boot_ticks() counts


def boot_ticks() -> int:
    """Now, in the clock ticks after boot that /proc/<pid>/stat gives a process's start in."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def ancestors(pid: int | None = None) -> set[int]:
    """`pid` (default: this process) and every process above it."""
    pids, pid = set(), pid or os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return pids


def live_processes(mark: tuple[str, str] | None = None, *, since: int = 0,
                   exclude: set[int] | frozenset[int] = frozenset()) -> list[Process]:
    """The live (not zombie) processes carrying `mark` (a variable and its value; None:
    any) that started no earlier than `since` (boot ticks), `exclude`'s pids aside."""
    needle = f"{mark[0]}={mark[1]}".encode() if mark else b""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in exclude:
            continue
        try:
            fields = _read(f"/proc/{name}/stat").rsplit(b")", 1)[1].split()
            started = int(fields[19])
            if fields[0] == b"Z" or started < since:
                continue
            items = _read(f"/proc/{name}/environ").split(b"\0")
            if needle and needle not in items:
                continue
            env = dict(item.decode(errors="replace").partition("=")[::2]
                       for item in items if item)
            cmd = _read(f"/proc/{name}/cmdline").replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):  # gone meanwhile, or not ours to read
            continue
        found.append(Process(int(name), cmd.strip()[:200], env, started))
    return found


def _read(path: str) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return f.read()


def marked(name: str, value: str) -> list[Process]:
    """The live processes carrying `name=value`, this process and its ancestors aside."""
    return live_processes((name, value), exclude=ancestors())


def kill_marked(name: str, value: str, timeout_s: float = 10.0) -> list[Process]:
    """SIGKILLs every process carrying `name=value` (this one and its ancestors aside) and
    waits up to `timeout_s` for them to be gone; returns what it killed."""
    killed = marked(name, value)
    for proc in killed:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout_s
    while marked(name, value) and time.monotonic() < deadline:
        time.sleep(0.1)
    return killed
