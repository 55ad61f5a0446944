"""Finding the processes a test left running, and the test that started them.

Each pytest process (the xdist controller and every worker) puts a mark of its own in its
environment (MARK_ENV); every process started from it inherits the mark, including
grandchildren that were re-parented to init when their parent died (an orphaned `rlfleet
env serve`, a Ray raylet, a vLLM engine core). Beside it, ORIGIN_ENV names what is running
in this pytest process at the moment: a test (its node id, through its set-up, call and
tear-down) or a module- or session-scoped fixture being set up for one. A process carries
the origin in force when it started; the fork server's children, forked without an exec,
show the server's environment instead, so theirs is the origin in force when they started
(the `Ledger` keeps each origin's start).

A test's processes must be gone when it ends, unless it shares a module's fixtures (a
fleet, a Ray cluster: what it starts may be theirs to stop); then they, and what those
fixtures started, must be gone when the module's fixtures are torn down. What is left at
that moment is named with its origin, killed, and the test that ended fails.
"""

from __future__ import annotations

import bisect
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rlfleet.local.marks import Process, ancestors, boot_ticks, live_processes

MARK_ENV = "RLFLEET_TEST_SESSION"
ORIGIN_ENV = "RLFLEET_TEST_ORIGIN"
# the scope of what may live until the session's end
SESSION = "<session>"
# a fork server's children keep its command line (they are forked, not exec'd)
FORK_SERVER = "-m rlfleet.local.forkserver"
# The interpreter's own helpers: multiprocessing starts them in the pytest process (vLLM's
# engine does) and they end with it, after the session; not something a test left running.
INTERPRETER_HELPERS = ("from multiprocessing.resource_tracker import",
                       "from multiprocessing.forkserver import")


@dataclass(frozen=True)
class Origin:
    label: str  # what started it: a test's node id, or a fixture and the test it was set up for
    test: str   # the test's node id ("" outside any test)
    scope: str  # the node id of the module it must end with, or SESSION


OUTSIDE = Origin("outside any test (the session's start)", "", SESSION)


def mark_this_session() -> str:
    mark = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.environ[MARK_ENV] = mark
    return mark


class Ledger:
    """The origins of this pytest process, each with the moment it came into force."""

    def __init__(self) -> None:
        self._since: list[int] = [0]
        self._origins: list[Origin] = [OUTSIDE]
        self._by_label: dict[str, Origin] = {OUTSIDE.label: OUTSIDE}

    @property
    def current(self) -> Origin:
        return self._origins[-1]

    def enter(self, origin: Origin) -> Origin:
        """Puts `origin` in force (ORIGIN_ENV, inherited by every process started from
        now on); returns the one it replaces."""
        before = self.current
        os.environ[ORIGIN_ENV] = origin.label
        self._by_label[origin.label] = origin
        self._since.append(boot_ticks())
        self._origins.append(origin)
        return before

    @contextmanager
    def under(self, origin: Origin) -> Iterator[None]:
        before = self.enter(origin)
        try:
            yield
        finally:
            self.enter(before)

    def origin_of(self, proc: Process) -> Origin:
        if FORK_SERVER in proc.cmd:
            # In the same clock tick as a change, the newer origin: a fixture or test
            # forks right after it comes into force, and waits for its child before it ends.
            return self._origins[bisect.bisect_right(self._since, proc.started) - 1]
        label = proc.env.get(ORIGIN_ENV)
        if not label:
            return OUTSIDE
        return self._by_label.get(label, Origin(label, "", SESSION))


LEDGER = Ledger()


def marked_processes(mark: str, since: int = 0) -> dict[int, Process]:
    """The live (not zombie) processes carrying `mark` that started no earlier than `since`
    (boot ticks), this process, its ancestors and the interpreter's helpers aside."""
    return {proc.pid: proc
            for proc in live_processes((MARK_ENV, mark), since=since, exclude=ancestors())
            if not any(helper in proc.cmd for helper in INTERPRETER_HELPERS)}


def end_left(which: Callable[[Origin], bool], *, grace_s: float, mark: str | None = None,
             since: int = 0, ledger: Ledger = LEDGER) -> dict[Origin, list[Process]]:
    """Waits up to `grace_s` for the processes of `which` origins to end (a stopped
    parent's children are still stopping), then kills what is left and returns it by
    origin. `mark`: this session's (the default) or another (the suite's own tests)."""
    mark = mark or os.environ.get(MARK_ENV)
    if not mark:
        return {}

    def left() -> list[tuple[Process, Origin]]:
        found = [(proc, ledger.origin_of(proc)) for proc in marked_processes(mark, since).values()]
        return [(proc, origin) for proc, origin in found if which(origin)]

    deadline = time.monotonic() + grace_s
    still = left()
    while still and time.monotonic() < deadline:
        time.sleep(0.2)
        still = left()
    by_origin: dict[Origin, list[Process]] = {}
    for proc, origin in still:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        by_origin.setdefault(origin, []).append(proc)
    return by_origin


def describe(left: dict[Origin, list[Process]], when: str) -> str:
    count = sum(len(procs) for procs in left.values())
    lines = [f"{count} process(es) still running {when} (now killed):"]
    for origin, procs in left.items():
        lines.append(f"  started by {origin.label}:")
        lines += [f"    {proc.pid}: {proc.cmd}" for proc in sorted(procs, key=lambda p: p.pid)]
    return "\n".join(lines)


def assert_none_left(grace_s: float = 10.0, mark: str | None = None) -> None:
    """The session's end: nothing this session started may still run."""
    left = end_left(lambda _: True, grace_s=grace_s, mark=mark)
    if left:
        raise AssertionError(describe(left, "at the end of the test session"))
