"""A stopped learner: SIGTERM mid-step trains and publishes nothing partial, checkpoints no
empty step, shuts Ray down (no orphaned Ray processes) and exits 143."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from rlfleet.local.forkserver import ForkedProcess, popen
from rlfleet.local.metrics_jsonl import read_events
from rlfleet.local.stack import LocalStack, start_stack
from rlfleet.maze.tasks import train_seeds
from rlfleet.storage import RunsRoot, latest_complete_checkpoint, list_versions, load_checkpoint
from tests.factories import NO_EVAL, SFT, learner_config
from tests.reliability.conftest import metric_value
from tests.waits import scaled, wait_until


@pytest.fixture
def stack(tmp_path: Path, procs):  # noqa: ANN201
    s = start_stack(tmp_path, runs_root=tmp_path / "runs", run="stop", model_dir=SFT,
                    replicas=1, group=procs)
    yield s
    s.close()


def config(stack: LocalStack, tmp_path: Path, run: str, group_size: int = 8,
           max_turns: int = 40) -> Path:
    # hot sampling and long episodes: a step's rollouts take seconds, so the signal lands
    # while the learner waits for them
    # a step's 4 groups in flight, not the recipe's 12: the stack has one replica
    return learner_config(stack, tmp_path, run, steps=50, eval=NO_EVAL,
                          data={"groups_per_step": 4, "group_size": group_size,
                                "max_turns": max_turns, "turn_margin": 0,
                                "temperature": 3.0},
                          fleet={"max_groups_in_flight": 4},
                          checkpoint={"every": 1000}, ray={"num_workers": 1})


def start_learner(path: Path) -> subprocess.Popen | ForkedProcess:
    return popen([sys.executable, "-m", "rlfleet.cli", "learner", "run", "--config",
                  str(path)])


def wait_for(events_path: Path, predicate, timeout_s: float = 300,  # noqa: ANN001
             proc: subprocess.Popen | ForkedProcess | None = None) -> list[dict]:
    """The run's events once `predicate` holds; fails at once if `proc` (the learner)
    exits first, rather than waiting out the deadline for events that cannot come."""
    deadline = time.monotonic() + scaled(timeout_s)
    while time.monotonic() < deadline:
        events = read_events(events_path) if events_path.exists() else []
        if predicate(events):
            return events
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the learner exited ({proc.returncode}) before the events "
                                 f"in {events_path} came")
        time.sleep(0.1)
    raise AssertionError(f"no such events in {events_path} after {scaled(timeout_s):.0f}s")


def tokens_generated(stack: LocalStack) -> float:
    """The stack's one replica's generated-token count (its Prometheus counter)."""
    port = urllib.parse.urlsplit(stack.replicas[0].extra["metrics_url"]).port
    return metric_value(port, "rlfleet_rollout_tokens_total")


def session_gone(pgid: int, timeout_s: float = 30) -> bool:
    """Every process of the learner's session (its Ray workers and agents too) exited."""
    deadline = time.monotonic() + scaled(timeout_s)
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_sigterm_while_waiting_for_rollouts_abandons_the_step(stack: LocalStack,
                                                               tmp_path: Path) -> None:
    run = stack.run  # the replica plays for this run only
    metrics = stack.runs_root / run / "metrics.jsonl"
    proc = start_learner(config(stack, tmp_path, run))
    # the first step's rollouts are under way: the replica generates for them (the
    # initial version's publication alone is not enough: on a busy machine the learner
    # may still be waiting for the replicas to load it, a stop before the step begins)
    wait_for(metrics, lambda ev: any(e["event"] == "start" for e in ev), proc=proc)
    root = RunsRoot(stack.runs_root)
    wait_until("the replica generating the first step's rollouts",
               lambda: tokens_generated(stack) > 0, timeout_s=300, period_s=0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=scaled(300))
    assert proc.returncode == 143, out
    events = read_events(metrics)
    kinds = [e["event"] for e in events]
    assert "step" not in kinds  # nothing trained ...
    assert kinds[-2:] == ["abandoned", "stopped"], kinds
    assert list_versions(root, run) == [1]  # ... nothing published after the start
    assert latest_complete_checkpoint(root, run) is None  # and no empty step saved
    assert session_gone(proc.pid), "Ray processes outlived the learner"
    assert "Traceback" not in out


def test_sigterm_after_a_step_checkpoints_it_and_resumes_there(stack: LocalStack,
                                                                tmp_path: Path) -> None:
    run = stack.run
    metrics = stack.runs_root / run / "metrics.jsonl"
    # a quarter of the first test's turns a step: the signal comes once a step is recorded,
    # while the next one's rollouts (still the bulk of a step) are under way
    path = config(stack, tmp_path, run, group_size=4, max_turns=20)
    proc = start_learner(path)
    wait_for(metrics, lambda ev: any(e["event"] == "step" for e in ev), timeout_s=600,
             proc=proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=scaled(300))
    assert proc.returncode == 143, out
    events = read_events(metrics)
    steps = [e["step"] for e in events if e["event"] == "step"]
    stopped = next(e for e in events if e["event"] == "stopped")
    assert stopped["step"] == steps[-1] >= 1
    root = RunsRoot(stack.runs_root)
    saved = latest_complete_checkpoint(root, run)
    assert saved is not None and saved.name == f"step_{steps[-1]:06d}"
    # the cursor counts the groups of the trained steps, not those of the abandoned one
    trained = len(load_checkpoint(saved).data_cursor.get("trained_ahead", []))
    cursor = load_checkpoint(saved).data_cursor["cursor"]
    seeds = train_seeds(0, 4 * steps[-1], 7)
    assert cursor == seeds.next_cursor and trained == 0
    assert session_gone(proc.pid)
