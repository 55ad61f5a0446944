"""The whole fleet end to end: Redis, env/reward, ckpt-sync, 2 rollout replicas and the
learner under local Ray, as real processes; a few GRPO steps; resume determinism."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlfleet.fleet import ReplicaDirectory, connect
from rlfleet.local.forkserver import ForkedProcess, popen
from rlfleet.local.procs import ProcessGroup
from rlfleet.local.stack import LocalStack, start_stack
from rlfleet.storage import RunsRoot, latest_complete_checkpoint, list_versions, load_checkpoint
from rlfleet_learner.budget import PLAN_AFTER_STEPS
from tests import factories
from tests.factories import NO_EVAL, SFT
from tests.unit.test_learner_tensorboard import expected_scalars, read_event_scalars
from tests.waits import SCALE

# the shipped SFT policy sampled hot (T = 3), in short episodes
SHORT_EPISODES = {"groups_per_step": 2, "group_size": 4, "max_turns": 4, "temperature": 3.0}
# (four turns solve none of the eval mazes: the cap is accepted, these runs are about the
# fleet, not the score)
SHORT_RUN = {"eval": {"every": 0, "eval_seeds": 4, "heldout_seeds": 4,
                      "accept_turn_cap": True},
             "checkpoint": {"every": 1, "keep_last": 5}}


# One fleet for the module, on one xdist worker: no test here stops or kills a service of
# it (each runs learners against it, on runs of their own), so starting it once is enough.
pytestmark = pytest.mark.xdist_group("e2e-training-run")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    # The shipped SFT policy sampled hot (T = 3) writes a mix of valid and invalid actions,
    # so the format+task reward varies within every group and every step trains.
    work = tmp_path_factory.mktemp("stack")
    group = ProcessGroup(work / "logs", wait_scale=SCALE)
    try:
        s = start_stack(work, runs_root=work / "runs", run="e2e",
                        model_dir=SFT, replicas=2, reward="format+task", group=group)
        yield s
    finally:
        group.stop_all()


def learner_config(stack: LocalStack, tmp_path: Path, run: str, model_dir: Path, **over
                   ) -> Path:
    """A 3-step run: 2 groups of 4 four-turn episodes sampled hot, 4 eval and held-out
    seeds, a checkpoint every step; `over` replaces top-level keys or sections."""
    return factories.learner_config(stack, tmp_path, run, model_dir, data=SHORT_EPISODES,
                                    **{"steps": 3, **SHORT_RUN, **over})


def learner(config: Path, *extra: str) -> subprocess.Popen | ForkedProcess:
    return popen([sys.executable, "-m", "rlfleet.cli", "learner", "run", "--config",
                  str(config), *extra])


def test_a_short_training_run(stack: LocalStack, tmp_path: Path) -> None:
    # deterministic: fixed sampling seeds, so the rewards (and the updates) are reproducible
    config = learner_config(stack, tmp_path, "e2e", SFT, deterministic=True)
    proc = learner(config, "--summary", str(tmp_path / "summary.json"))
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    # its output is JSON lines only (not a terminal): a line per step and per eval
    logged = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert [d["step"] for d in logged if d["msg"] == "step"] == [1, 2, 3]
    assert [d["step"] for d in logged if d["msg"] == "eval"] == [0, 3]
    metrics = stack.runs_root / "e2e" / "metrics.jsonl"
    events = [json.loads(line) for line in metrics.read_text().splitlines()]
    # TensorBoard event files beside metrics.jsonl, with its numbers per step and eval
    tensorboard = read_event_scalars(metrics.parent)
    assert {k: v for k, (v, _) in tensorboard.items()} == pytest.approx(
        expected_scalars(metrics))
    assert ("step/reward_mean", 3) in tensorboard
    steps = [e for e in events if e["event"] == "step"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    trained = [s for s in steps if s["rows"] > 0 and s["grad_norm"] > 0]
    assert trained  # groups with reward variance made real updates
    evals = [e for e in events if e["event"] == "eval"]
    assert len(evals) == 2 and all(e["eval"]["episodes"] == 4 for e in evals)
    root = RunsRoot(stack.runs_root)
    assert list_versions(root, "e2e")[-1] == 4  # initial + one per step
    assert latest_complete_checkpoint(root, "e2e").name == "step_000003"
    live = [r for r in ReplicaDirectory(connect(stack.redis_url)).live() if r.run == "e2e"]
    assert sorted(r.adapter_version for r in live) == [4, 4]  # both replicas serve the last
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["step"] == 3 and summary["last_eval"]["eval"]["episodes"] == 4


def test_resume_latest_without_a_checkpoint_says_so(stack: LocalStack, tmp_path: Path,
                                                    ) -> None:
    config = learner_config(stack, tmp_path, "nothing-yet", SFT)
    proc = learner(config, "--resume", "latest")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2
    assert "no complete checkpoint" in out
    assert not (stack.runs_root / "nothing-yet" / "adapters").exists()  # started nothing


@pytest.mark.timeout(1200)  # three learner runs, one after another
def test_killed_and_resumed_run_is_bit_identical(stack: LocalStack, tmp_path: Path,
                                                 ) -> None:
    over = {"deterministic": True, "eval": NO_EVAL}
    stack.add_replica("det-a", run="det-a")
    stack.add_replica("det-b", run="det-b")
    # the uninterrupted run
    proc = learner(learner_config(stack, tmp_path, "det-a", SFT, **over))
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    # the same run, SIGKILLed (its whole process group, Ray too: a lost node) once its
    # step-2 checkpoint is complete, then resumed
    config_b = learner_config(stack, tmp_path, "det-b", SFT, **over)
    proc = learner(config_b)
    complete = stack.runs_root / "det-b" / "checkpoints" / "step_000002" / "COMPLETE"
    deadline = time.monotonic() + 900
    while not complete.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    ended = proc.poll()
    os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate()
    assert complete.exists(), f"the learner ended first (exit {ended}):\n{out}"
    proc = learner(config_b, "--resume", "latest")
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    a = stack.runs_root / "det-a" / "checkpoints" / "step_000003"
    b = stack.runs_root / "det-b" / "checkpoints" / "step_000003"
    assert (a / "adapter_model.safetensors").read_bytes() == \
        (b / "adapter_model.safetensors").read_bytes()
    # and the adapters really changed along the way
    first = stack.runs_root / "det-a" / "checkpoints" / "step_000001"
    assert (first / "adapter_model.safetensors").read_bytes() != \
        (a / "adapter_model.safetensors").read_bytes()


def test_a_time_budget_plans_the_run_and_a_resume_keeps_the_plan(stack: LocalStack,
                                                                  tmp_path: Path) -> None:
    # A budget the first steps already spend: planned after PLAN_AFTER_STEPS steps (no
    # curve evaluations), it ends the run there, far short of the config's 50 steps.
    stack.add_replica("budget", run="budget")
    config = learner_config(stack, tmp_path, "budget", SFT, steps=50, minutes=0.001,
                            eval=NO_EVAL)
    # factories.learner_process: a learner this test leaves running if it fails is killed
    proc = factories.learner_process(config)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    metrics = stack.runs_root / "budget" / "metrics.jsonl"
    events = [json.loads(line) for line in metrics.read_text().splitlines()]
    planned = [e for e in events if e["event"] == "planned"]
    assert len(planned) == 1 and planned[0]["step"] == planned[0]["steps"] == PLAN_AFTER_STEPS
    assert planned[0]["max_steps"] == 50 and planned[0]["seconds_per_step"] > 0
    assert [e["step"] for e in events if e["event"] == "step"] == \
        list(range(1, PLAN_AFTER_STEPS + 1))
    assert events[-1]["event"] == "end" and events[-1]["step"] == PLAN_AFTER_STEPS
    last = load_checkpoint(latest_complete_checkpoint(RunsRoot(stack.runs_root), "budget"))
    assert last.step == PLAN_AFTER_STEPS
    assert last.data_cursor["planned_steps"] == PLAN_AFTER_STEPS
    # saved after the plan (the record rounds to 0.1 s, the checkpoint to 1 ms)
    assert round(last.data_cursor["budget_spent_s"], 1) >= planned[0]["spent_s"] > 0.06
    # resumed with more steps allowed, the run keeps its plan: it is done, nothing trains
    proc = factories.learner_process(config, steps=60)  # --resume auto
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    events = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "step"] == \
        list(range(1, PLAN_AFTER_STEPS + 1))
    assert len([e for e in events if e["event"] == "planned"]) == 1
