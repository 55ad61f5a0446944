"""Finding the processes a test session left running.

Each pytest process (the xdist controller and every worker) puts a mark of its own in its
environment; every process started from it inherits the mark, including grandchildren that
were re-parented to init when their parent died (an orphaned `rlfleet env serve`, a Ray
raylet, a vLLM engine core). At the end of the session, any live process carrying the mark
is a leak: it is named, killed, and the session fails.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

MARK_ENV = "RLFLEET_TEST_SESSION"
# The interpreter's own helpers: multiprocessing starts them in the pytest process (vLLM's
# engine does) and they end with it, after the session; not something a test left running.
INTERPRETER_HELPERS = ("from multiprocessing.resource_tracker import",
                       "from multiprocessing.forkserver import")


def mark_this_session() -> str:
    mark = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.environ[MARK_ENV] = mark
    return mark


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return pids


def marked_processes(mark: str) -> dict[int, str]:
    """{pid: command line} of the live (not zombie) processes carrying `mark`, this
    process and its ancestors aside."""
    needle = f"{MARK_ENV}={mark}".encode()
    mine = _ancestors()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                continue
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if any(helper in cmd for helper in INTERPRETER_HELPERS):
            continue
        found[int(entry.name)] = cmd.strip()[:200]
    return found


def assert_none_left(grace_s: float = 10.0, mark: str | None = None) -> None:
    """Waits up to `grace_s` for stragglers that are already stopping (a killed parent's
    children), then kills what is left and fails, naming each process. `mark`: this
    session's (the default) or another (the suite's own test of this check)."""
    mark = mark or os.environ.get(MARK_ENV)
    if not mark:
        return
    deadline = time.monotonic() + grace_s
    left = marked_processes(mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = marked_processes(mark)
    if not left:
        return
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    listing = "\n".join(f"  {pid}: {cmd}" for pid, cmd in sorted(left.items()))
    raise AssertionError(f"{len(left)} process(es) started by this test session were still "
                         f"running at its end (now killed):\n{listing}")
