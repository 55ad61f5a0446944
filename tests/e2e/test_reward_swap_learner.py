"""The reward service swapped while a real learner trains: env and reward as separate
processes (as in the chart), the learner's run under way on the `task` reward, then the
reward service replaced at the same address by the example written outside the library
(examples/path-efficiency-reward). The learner is never touched; every step whose
rollouts began after the swap records the new service's name and version in
metrics.jsonl, the step in flight during the swap may record both."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlfleet.local.forkserver import popen
from rlfleet.local.metrics_jsonl import read_events
from rlfleet.local.stack import LocalStack, start_stack
from tests.factories import NO_EVAL, REPO, SFT, learner_config

EXAMPLE = REPO / "examples" / "path-efficiency-reward" / "src"

pytestmark = pytest.mark.slow


def config(stack: LocalStack, tmp_path: Path, run: str) -> Path:
    return learner_config(stack, tmp_path, run, steps=200, eval=NO_EVAL,
                          data={"groups_per_step": 2, "group_size": 4},
                          checkpoint={"every": 1000}, ray={"num_workers": 1})


def steps(metrics: Path) -> list[dict]:
    return [e for e in read_events(metrics) if e["event"] == "step"] if metrics.exists() \
        else []


def wait_for_steps(metrics: Path, n: int, learner: subprocess.Popen,
                   timeout_s: float = 900) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while len(found := steps(metrics)) < n:
        assert learner.poll() is None, learner.communicate()[0][-4000:]
        assert time.monotonic() < deadline, f"fewer than {n} steps after {timeout_s}s"
        time.sleep(0.2)
    return found


def test_the_learner_records_the_new_reward_from_the_next_step(tmp_path: Path,
                                                               procs) -> None:
    stack = start_stack(tmp_path, runs_root=tmp_path / "runs", run="swap-learner",
                        model_dir=SFT, replicas=1, reward="task", separate_reward=True,
                        group=procs, log=lambda *_: None)
    run = "swap-learner"
    metrics = stack.runs_root / run / "metrics.jsonl"
    learner = popen([sys.executable, "-m", "rlfleet.cli", "learner", "run", "--config",
                     str(config(stack, tmp_path, run))], env={**os.environ, **stack.service_env})
    try:
        env_pid = stack.env.popen.pid
        before = wait_for_steps(metrics, 1, learner)
        assert {(s["reward_name"], s["reward_version"]) for s in before} == {("task", "1.0.0")}

        pythonpath = os.pathsep.join(filter(None, [str(EXAMPLE), os.environ.get("PYTHONPATH")]))
        stack.swap_reward(
            lambda port, metrics_port: [sys.executable, "-m", "path_efficiency_reward",
                                        "--port", str(port), "--metrics-port",
                                        str(metrics_port)],
            name="path-efficiency", env={"PYTHONPATH": pythonpath})
        # Steps recorded by now scored (at least partly) on the old service; the next one
        # may have been under way during the swap; every later one began after it.
        swapped_at = len(steps(metrics))
        after = wait_for_steps(metrics, swapped_at + 2, learner)
        assert learner.poll() is None  # the learner kept running through the swap
        assert stack.env.alive and stack.env.popen.pid == env_pid  # the env never moved
    finally:
        if learner.poll() is None:
            learner.send_signal(signal.SIGTERM)
        out, _ = learner.communicate(timeout=300)
    assert learner.returncode == 143, out[-4000:]  # stopped by us, cleanly

    for s in after[swapped_at + 1:]:
        assert (s["reward_name"], s["reward_version"]) == ("path-efficiency", "1.0.0"), s
        assert set(s["reward_services"]) == {"path-efficiency 1.0.0"}
    in_flight = after[swapped_at]["reward_services"]
    assert set(in_flight) <= {"task 1.0.0", "path-efficiency 1.0.0"}
    # the learner's step numbers run on without a gap: nothing was restarted
    numbers = [s["step"] for s in after]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
