"""A learner whose fleet is lost (its only replica SIGKILLed, none comes
back) stops with one clear line and exit code 3 after `fleet.replacement_wait_s`, its
trained steps checkpointed; with a replica back, the deployed command resumes the run.

The learner is a real process under local Ray (sync mode, checkpoint every step) on the
real local stack.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.local.metrics_jsonl import lineage_steps, read_events
from rlfleet.local.stack import LocalStack, start_stack
from rlfleet.storage import RunsRoot, list_checkpoints
from tests import factories
from tests.factories import HOT_SHORT_EPISODES, NO_EVAL, SFT, learner_process
from tests.reliability.conftest import stopped_cleanly_after_step_1
from tests.waits import scaled

RUN = "fleet-lost"
STEPS = 3


@pytest.fixture
def stack(tmp_path: Path, procs):  # noqa: ANN201
    s = start_stack(tmp_path, runs_root=tmp_path / "runs", run=RUN, model_dir=SFT,
                    replicas=0, reward="format+task", group=procs)
    s.add_replica("rollout-0", "--heartbeat-ttl-s", "3")
    yield s
    s.close()


@pytest.mark.slow
def test_a_learner_that_lost_its_fleet_stops_cleanly_and_resumes(
        stack: LocalStack, tmp_path: Path) -> None:
    config = factories.learner_config(
        stack, tmp_path, RUN, steps=STEPS, mode="sync",
        data=HOT_SHORT_EPISODES,
        eval=NO_EVAL, checkpoint={"every": 1, "keep_last": 3}, ray={"num_workers": 1},
        fleet={"max_groups_in_flight": 2, "replacement_wait_s": 10})
    root = RunsRoot(stack.runs_root)
    # SIGKILL of the only replica: the whole fleet is gone
    out, stop = stopped_cleanly_after_step_1(
        config, root, RUN, lambda: stack.group.kill(stack.replicas[0]))
    assert "no live rollout replica" in stop, out
    events = read_events(root.metrics_path(RUN))
    (failed,) = [e for e in events if e["event"] == "failed"]
    assert failed["error"] == "RolloutsFailed"
    assert list_checkpoints(root, RUN)[-1] == failed["saved_step"] >= 1

    stack.add_replica("rollout-1", "--heartbeat-ttl-s", "3")  # a replacement
    proc = learner_process(config)
    out, _ = proc.communicate(timeout=scaled(900))
    assert proc.returncode == 0 and "Traceback" not in out, out
    events = read_events(root.metrics_path(RUN))
    assert [s["step"] for s in lineage_steps(events)] == list(range(1, STEPS + 1))
