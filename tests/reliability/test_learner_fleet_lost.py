"""Issue 23 item 6: a learner whose fleet is lost (its only replica SIGKILLed, none comes
back) stops with one clear line and exit code 3 after `fleet.replacement_wait_s`, its
trained steps checkpointed; with a replica back, the deployed command resumes the run.

The learner is a real process under local Ray (sync mode, checkpoint every step) on the
real local stack.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlfleet.local.metrics_jsonl import lineage_steps, read_events
from rlfleet.local.stack import LocalStack, start_stack
from rlfleet.storage import RunsRoot, list_checkpoints
from tests import factories
from tests.factories import NO_EVAL, SFT
from tests.waits import scaled, wait_until

RUN = "fleet-lost"
STEPS = 3


@pytest.fixture
def stack(tmp_path: Path, procs):  # noqa: ANN201
    s = start_stack(tmp_path, runs_root=tmp_path / "runs", run=RUN, model_dir=SFT,
                    replicas=0, reward="format+task", group=procs)
    s.add_replica("rollout-0", "--heartbeat-ttl-s", "3")
    yield s
    s.close()


def start(config: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlfleet.cli", "learner", "run",
                             "--config", str(config), "--resume", "auto",
                             "--log-level", "WARNING"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


@pytest.mark.slow
def test_a_learner_that_lost_its_fleet_stops_cleanly_and_resumes(
        stack: LocalStack, tmp_path: Path) -> None:
    config = factories.learner_config(
        stack, tmp_path, RUN, steps=STEPS, mode="sync",
        data={"groups_per_step": 2, "group_size": 4, "max_turns": 4, "temperature": 3.0},
        eval=NO_EVAL, checkpoint={"every": 1, "keep_last": 3}, ray={"num_workers": 1},
        fleet={"max_groups_in_flight": 2, "replacement_wait_s": 10})
    root = RunsRoot(stack.runs_root)
    proc = start(config)
    try:
        wait_until("step 1 checkpointed", lambda: proc.poll() is None
                   and 1 in list_checkpoints(root, RUN), timeout_s=600)
        stack.group.kill(stack.replicas[0])  # SIGKILL: the whole fleet is gone
        out, _ = proc.communicate(timeout=scaled(600))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 3, out
    assert "Traceback" not in out, out
    stops = [line for line in out.splitlines() if "rlfleet learner: stopped:" in line]
    assert len(stops) == 1 and "no live rollout replica" in stops[0], out
    events = read_events(root.metrics_path(RUN))
    (failed,) = [e for e in events if e["event"] == "failed"]
    assert failed["error"] == "RolloutsFailed"
    assert list_checkpoints(root, RUN)[-1] == failed["saved_step"] >= 1

    stack.add_replica("rollout-1", "--heartbeat-ttl-s", "3")  # a replacement
    proc = start(config)
    out, _ = proc.communicate(timeout=scaled(900))
    assert proc.returncode == 0 and "Traceback" not in out, out
    events = read_events(root.metrics_path(RUN))
    assert [s["step"] for s in lineage_steps(events)] == list(range(1, STEPS + 1))
