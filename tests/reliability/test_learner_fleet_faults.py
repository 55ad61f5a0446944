"""A sync learner (a real process under local Ray, the deployed
command) against the real local stack, with real signals.

1. min_replicas 2; after step 1 one replica is SIGSTOPped (it hangs, holding its sockets):
   once its heartbeat expires the learner stops waiting for it and trains on with the
   replica that serves each version, saying so (a warning and a `replicas_short` event),
   long before its sync timeout.
2. After step 3 ckpt-sync is SIGSTOPped: the next publish is retried (DEADLINE_EXCEEDED)
   for the configured bound, then the learner checkpoints the step it trained and stops
   with one clear line and exit code 3, no traceback.
3. Both back, the deployed command (`--resume auto`) resumes from that step and finishes:
   steps 1..5 once each in the run's lineage, every seed trained once (no step lost).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from rlfleet.local.metrics_jsonl import lineage_steps, read_events
from rlfleet.local.stack import LocalStack, start_stack
from rlfleet.storage import RunsRoot, list_checkpoints
from tests import factories
from tests.factories import NO_EVAL, SFT, learner_process
from tests.waits import hang_process_group, scaled, wait_until

RUN = "fleet-faults"
STEPS = 5
GROUPS_PER_STEP = 2


@pytest.fixture
def stack(tmp_path: Path, procs):  # noqa: ANN201
    s = start_stack(tmp_path, runs_root=tmp_path / "runs", run=RUN, model_dir=SFT,
                    replicas=0, reward="format+task", group=procs)
    for name in ("rollout-0", "rollout-1"):
        s.add_replica(name, "--heartbeat-ttl-s", "3")
    yield s
    for proc in [*s.replicas, s.sync]:
        if proc is not None and proc.alive:
            os.killpg(proc.popen.pid, signal.SIGCONT)
    s.close()


def events_of(metrics: Path, kind: str) -> list[dict]:
    return [e for e in read_events(metrics) if e["event"] == kind] if metrics.exists() else []


def stepped(metrics: Path, proc: subprocess.Popen, step: int) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"the learner exited early:\n{proc.communicate()[0]}")
    return any(e["step"] >= step for e in events_of(metrics, "step"))


@pytest.mark.slow
def test_a_sync_learner_trains_on_without_lost_replicas_and_stops_cleanly_without_ckptsync(
        stack: LocalStack, tmp_path: Path) -> None:
    config = factories.learner_config(
        stack, tmp_path, RUN, steps=STEPS, mode="sync",
        data={"groups_per_step": GROUPS_PER_STEP, "group_size": 4, "max_turns": 4,
              "temperature": 3.0},
        eval=NO_EVAL, checkpoint={"every": 2, "keep_last": 3}, ray={"num_workers": 1},
        # the sync timeout is far away: the stalled replica is dropped by its heartbeat
        fleet={"max_groups_in_flight": 2, "min_replicas": 2,
               "sync_timeout_s": scaled(900), "publish_retry_s": 8})
    metrics = RunsRoot(stack.runs_root).metrics_path(RUN)
    stalled = stack.replicas[1]
    assert stack.sync is not None

    proc = learner_process(config)
    try:
        wait_until("step 1", lambda: stepped(metrics, proc, 1), timeout_s=600)
        hang_process_group(stalled.popen.pid)
        wait_until("step 3, trained on one replica", lambda: stepped(metrics, proc, 3),
                   timeout_s=600)
        short = events_of(metrics, "replicas_short")
        assert short and all(e["serving"] == ["rollout-0"] and e["wanted"] == 2
                             for e in short), short
        hang_process_group(stack.sync.popen.pid)
        out, _ = proc.communicate(timeout=scaled(600))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 3, out
    assert "training on with fewer replicas than min_replicas" in out, out
    assert "Traceback" not in out, out
    stops = [line for line in out.splitlines() if "rlfleet learner: stopped:" in line]
    assert len(stops) == 1 and "did not answer announcing adapter version" in stops[0] \
        and "DEADLINE_EXCEEDED" in stops[0], out
    (failed,) = events_of(metrics, "failed")
    # the step trained before the publish failed is recorded and saved, not lost
    unpublished = events_of(metrics, "step")[-1]
    assert unpublished["published"] is False and unpublished["step"] == failed["step"] > 3
    assert failed["error"] == "PublishFailed" and failed["saved_step"] == failed["step"]
    assert list_checkpoints(RunsRoot(stack.runs_root), RUN)[-1] == failed["step"]

    # both back: the deployed command resumes from that step and finishes the run
    os.killpg(stack.sync.popen.pid, signal.SIGCONT)
    os.killpg(stalled.popen.pid, signal.SIGCONT)
    proc = learner_process(config)
    out, _ = proc.communicate(timeout=scaled(900))
    assert proc.returncode == 0, out
    assert [e["step"] for e in events_of(metrics, "resumed")] == [failed["step"]]
    steps = lineage_steps(read_events(metrics))
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    seeds = [seed for s in steps for seed in s["seeds"]]
    assert len(seeds) == len(set(seeds)) == STEPS * GROUPS_PER_STEP
    assert "Traceback" not in out, out
