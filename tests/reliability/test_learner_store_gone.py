"""Issue 23 item 6: a learner whose fleet store (Redis) is gone stops with one clear line
and exit code 3 once ckpt-sync has not recorded its publish for `fleet.publish_retry_s`, its
trained steps checkpointed; with Redis back (empty) the deployed command resumes the run.

The learner is a real process under local Ray (sync mode, checkpoint every step) on the
real local stack; Redis is SIGKILLed after the step 1 checkpoint. Meanwhile the pool
plays the next step's groups on the replicas it last knew (the fleet store is a hint), so
the step is trained; its publish cannot be recorded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest

from rlfleet.local.metrics_jsonl import lineage_steps, read_events
from rlfleet.local.redis import start_redis
from rlfleet.local.stack import LocalStack, start_stack
from rlfleet.storage import RunsRoot, list_checkpoints
from tests import factories
from tests.factories import NO_EVAL, SFT
from tests.waits import scaled, wait_until

RUN = "store-gone"
STEPS = 3


@pytest.fixture
def stack(tmp_path: Path, procs):  # noqa: ANN201
    s = start_stack(tmp_path, runs_root=tmp_path / "runs", run=RUN, model_dir=SFT,
                    replicas=1, reward="format+task", group=procs)
    yield s
    s.close()


def start(config: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlfleet.cli", "learner", "run",
                             "--config", str(config), "--resume", "auto",
                             "--log-level", "WARNING"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


@pytest.mark.slow
def test_a_learner_whose_store_is_gone_stops_cleanly_and_resumes(
        stack: LocalStack, tmp_path: Path) -> None:
    config = factories.learner_config(
        stack, tmp_path, RUN, steps=STEPS, mode="sync",
        data={"groups_per_step": 2, "group_size": 4, "max_turns": 4, "temperature": 3.0},
        eval=NO_EVAL, checkpoint={"every": 1, "keep_last": 3}, ray={"num_workers": 1},
        fleet={"max_groups_in_flight": 2, "publish_retry_s": 8})
    root = RunsRoot(stack.runs_root)
    (redis,) = [p for p in stack.group.procs if p.name == "redis"]
    proc = start(config)
    try:
        wait_until("step 1 checkpointed", lambda: proc.poll() is None
                   and 1 in list_checkpoints(root, RUN), timeout_s=600)
        stack.group.kill(redis)  # SIGKILL: the fleet's store is gone
        out, _ = proc.communicate(timeout=scaled(600))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 3, out
    assert "Traceback" not in out, out
    stops = [line for line in out.splitlines() if "rlfleet learner: stopped:" in line]
    # ckpt-sync answers UNAVAILABLE once its Redis client gives up (~9 s); a call cut
    # short by the bound ends DEADLINE_EXCEEDED: both are transient, retried until then
    assert len(stops) == 1 and "did not answer announcing adapter version" in stops[0] \
        and ("UNAVAILABLE" in stops[0] or "DEADLINE_EXCEEDED" in stops[0]), out
    events = read_events(root.metrics_path(RUN))
    (failed,) = [e for e in events if e["event"] == "failed"]
    assert failed["error"] == "PublishFailed"
    assert failed["saved_step"] == failed["step"] == 2  # step 2 trained, not lost
    assert list_checkpoints(root, RUN)[-1] == 2

    start_redis(stack.group, port=urlparse(stack.redis_url).port, name="redis-back")
    proc = start(config)
    out, _ = proc.communicate(timeout=scaled(900))
    assert proc.returncode == 0 and "Traceback" not in out, out
    events = read_events(root.metrics_path(RUN))
    assert [s["step"] for s in lineage_steps(events)] == list(range(1, STEPS + 1))
