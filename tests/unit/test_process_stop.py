"""A process that will not drain is killed after its grace, and its log shows where it
was stuck: every thread's stack, written on DUMP_STACKS_SIGNAL before the SIGKILL."""

from __future__ import annotations

import sys
from pathlib import Path

from rlfleet.local.procs import ProcessGroup
from tests.waits import wait_until

# A process set up like a service (setup_logging) that ignores SIGTERM and sleeps
STUCK = """
import signal, time
from rlfleet.logs import setup_logging
setup_logging("stuck")
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("up", flush=True)
def stuck_in_drain():
    time.sleep(600)
stuck_in_drain()
"""


def test_a_process_that_ignores_sigterm_is_killed_with_its_stacks_in_the_log(
        tmp_path: Path) -> None:
    group = ProcessGroup(tmp_path / "logs")
    proc = group.start("stuck", [sys.executable, "-c", STUCK])
    wait_until("the process to be up", lambda: "up" in proc.log_tail())
    assert group.stop(proc, grace_s=0.5) == -9
    log = proc.log_path.read_text()
    assert "most recent call first" in log and "stuck_in_drain" in log


def test_a_process_that_drains_exits_with_its_own_code(tmp_path: Path) -> None:
    group = ProcessGroup(tmp_path / "logs")
    proc = group.start("sleeper", [sys.executable, "-c",
                                   "import time; print('up', flush=True); time.sleep(600)"])
    wait_until("the process to be up", lambda: "up" in proc.log_tail())
    assert group.stop(proc) == -15  # SIGTERM's default action: no dump, no kill
    assert "most recent call first" not in proc.log_path.read_text()
