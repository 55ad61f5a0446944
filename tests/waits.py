"""How long the suite waits, in one place.

Every deadline a test sets (a service coming up, a condition polled for, a subprocess, the
per-test time-out) is a base figure for a quiet 2-core machine multiplied by one factor,
`RLFLEET_TEST_WAIT_SCALE` (default 1). A busy machine (another build, `yes > /dev/null`
twice) makes the suite slower, not red; raise the factor on a machine slower still. A
deadline only bounds a wait for something that should happen: scaling it up costs nothing
when the suite passes, and only delays the report of a test that hangs.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

ENV = "RLFLEET_TEST_WAIT_SCALE"


def _scale() -> float:
    raw = os.environ.get(ENV, "1")
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"{ENV}={raw!r}: a positive number, e.g. 2") from None
    if not value > 0:
        raise SystemExit(f"{ENV}={raw!r}: a positive number, e.g. 2")
    return value


SCALE = _scale()


def scaled(seconds: float) -> float:
    """A base deadline (seconds on a quiet machine) as this run allows it."""
    return seconds * SCALE


def wait_until(what: str, predicate: Callable[[], T], timeout_s: float = 60.0,
               period_s: float = 0.1, diagnose: Callable[[], str] = lambda: "") -> T:
    """Polls `predicate` until truthy and returns its value; fails the test, naming `what`,
    after `timeout_s` (scaled)."""
    limit = scaled(timeout_s)
    deadline = time.monotonic() + limit
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - the condition may not be checkable yet
            last_exc = exc
        time.sleep(period_s)
    detail = diagnose()
    raise AssertionError(f"timed out after {limit:.0f} s waiting for {what}"
                         f" (last error: {last_exc!r})" + (f"\n{detail}" if detail else ""))


def _thread_states(pgid: int) -> list[str]:
    """The state letter of every thread of every process in process group `pgid`."""
    states = []
    for stat in Path("/proc").glob("[0-9]*/task/[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        if int(fields[2]) == pgid:
            states.append(fields[0])
    return states


def hang_process_group(pgid: int) -> None:
    """SIGSTOPs process group `pgid` and returns once every thread in it is stopped (or
    dead): kill() returns before the stop takes effect, and on a busy machine the peer
    answered the next call in that gap (test_service_clients, under `yes` x2)."""
    os.killpg(pgid, signal.SIGSTOP)
    wait_until(f"process group {pgid} stopped",
               lambda: all(s in "TtZX" for s in _thread_states(pgid)), timeout_s=30,
               period_s=0.01)


# Ray's own waits while a node starts (seconds), raised for the suite: a Ray start beside
# the suite's heaviest tests (pods, an engine) outlasted Ray's defaults although nothing
# was wrong. Ray reads them from the environment in each process it starts (its Python
# side and its C++ daemons alike), so the suite's in-process starts (`ray.init`,
# `ray.cluster_utils.Cluster`), `ray start` and the learners it runs all get them. The
# raylet's 30 s registration wait is fixed in Ray: that one is retried
# (rlfleet_learner.ray_start.start_with_retry).
RAY_STARTUP_WAITS_S = {
    "RAY_gcs_server_port_wait_time_s": 90,          # the GCS writes its port (Ray: 30)
    "RAY_gcs_server_request_timeout_seconds": 180,  # a request to the GCS (Ray: 60)
    "RAY_gcs_rpc_server_reconnect_timeout_s": 180,  # a daemon reaching the GCS (Ray: 60)
    "RAY_worker_register_timeout_seconds": 180,     # a worker registering (Ray: 60)
    "RAY_DASHBOARD_STARTUP_TIMEOUT_S": 180,         # the dashboard coming up (Ray: 60)
}


def ray_startup_env() -> dict[str, str]:
    """RAY_STARTUP_WAITS_S scaled, as environment variables (whole seconds)."""
    return {name: str(round(scaled(seconds))) for name, seconds in RAY_STARTUP_WAITS_S.items()}
