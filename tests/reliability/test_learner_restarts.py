"""A learner that is stopped, killed and restarted with the
deployed command (`rlfleet learner run --config ... --resume auto`, what the chart's
RayJob runs on every retry) continues one run instead of mixing attempts.

One run (checkpoint every 2 steps), in async and in sync mode, on the real local stack
(Redis, env/reward, ckpt-sync, a rollout replica) with the learner as a real process under
local Ray:
1. SIGTERM at a random point after step 2: it checkpoints and exits 143;
2. restarted, it resumes there; SIGKILL of its whole process group (Ray too: a node lost)
   at a random point after its next checkpoint and one more step;
3. its newest checkpoint's optimizer.pt is truncated and a torn line is left at the end
   of metrics.jsonl (a crash inside a write); restarted with `--steps` two past the
   killed attempt's last step, it falls back to the newest intact checkpoint (saying so),
   appends whole lines after the torn one, and finishes;
4. a fresh start (`--resume none`) over the run refuses and changes nothing.
The first two attempts are given more steps than they can reach (`--steps`), so a signal,
never the end of the run, stops them however fast a loaded or a quiet machine trains (an
async learner can train six steps in 2 s: with 8 steps, a SIGTERM 0.5 s after step 2 once
met step 6, and the kill after the next checkpoint had no step left).
Then: steps 1..final each once in the run's lineage; every training seed trained exactly once
across the attempts and the final checkpoint's cursor is exactly those seeds (lost 0,
duplicated 0); ckpt-sync's GC removed old versions but none a checkpoint serves.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rlfleet.local.metrics_jsonl import lineage_steps, read_events
from rlfleet.local.stack import LocalStack
from rlfleet.storage import (
    RunsRoot,
    checkpoint_adapter_versions,
    list_checkpoints,
    list_versions,
    load_checkpoint,
)
from rlfleet.storage.checkpoints import OPTIMIZER_FILE
from rlfleet_learner.cursor import SeedCursor
from tests import factories
from tests.factories import NO_EVAL, learner_process
from tests.waits import scaled

RUN = "restarts"
STEPS = 8  # the config's; attempts 1 and 2 run with OPEN_ENDED, the last with its own
OPEN_ENDED = 10_000
GROUPS_PER_STEP = 2


def learner_config(stack: LocalStack, tmp_path: Path, mode: str) -> Path:
    return factories.learner_config(
        stack, tmp_path, RUN, steps=STEPS, mode=mode,
        data={"groups_per_step": GROUPS_PER_STEP, "group_size": 4, "max_turns": 4,
              "temperature": 3.0},
        eval=NO_EVAL, checkpoint={"every": 2, "keep_last": 3}, ray={"num_workers": 1},
        fleet={"max_groups_in_flight": 2})


def wait_for_step(metrics: Path, proc: subprocess.Popen, after: int, step: int,
                  timeout_s: float = scaled(600)) -> None:
    """Until the attempt whose events start at index `after` has logged `step`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = read_events(metrics)[after:] if metrics.exists() else []
        if any(e["event"] == "step" and e["step"] >= step for e in events):
            return
        if proc.poll() is not None:
            raise AssertionError(f"the learner exited early:\n{proc.communicate()[0]}")
        time.sleep(0.05)
    raise AssertionError(f"no step {step} after {timeout_s}s")


def event_count(metrics: Path) -> int:
    return len(read_events(metrics)) if metrics.exists() else 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_stopped_killed_and_damaged_runs_resume_and_train_every_seed_once(
        stack: LocalStack, tmp_path: Path, mode: str) -> None:
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    config = learner_config(stack, tmp_path, mode)
    root = RunsRoot(stack.runs_root)
    metrics = root.metrics_path(RUN)
    outputs: list[str] = []

    # 1. SIGTERM at a random point after step 2 (waiting for rollouts or updating)
    proc = learner_process(config, steps=OPEN_ENDED)
    wait_for_step(metrics, proc, 0, 2)
    time.sleep(rng.uniform(0, 0.5))
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=scaled(300))
    outputs.append(out)
    assert proc.returncode == 143, out
    stopped = [e for e in read_events(metrics) if e["event"] == "stopped"]
    assert len(stopped) == 1 and list_checkpoints(root, RUN)[-1] == stopped[0]["step"]

    # 2. restarted: resumes there; SIGKILL of everything at a random point after its next
    # checkpoint (every 2 steps) and one more step
    first = event_count(metrics)
    proc = learner_process(config, steps=OPEN_ENDED)
    next_checkpoint = stopped[0]["step"] // 2 * 2 + 2
    wait_for_step(metrics, proc, first, next_checkpoint + 1)
    time.sleep(rng.uniform(0, 2))
    os.killpg(proc.pid, signal.SIGKILL)
    killed_after = max(e["step"] for e in read_events(metrics)[first:] if e["event"] == "step")
    out, _ = proc.communicate(timeout=scaled(60))
    outputs.append(out)
    resumed = [e for e in read_events(metrics)[first:] if e["event"] == "resumed"]
    assert [e["step"] for e in resumed] == [stopped[0]["step"]]

    # 3. the newest checkpoint damaged, a torn record at the end of metrics.jsonl
    saved = list_checkpoints(root, RUN)
    assert len(saved) >= 2, saved
    damaged = root.checkpoint_dir(RUN, saved[-1]) / OPTIMIZER_FILE
    with open(damaged, "r+b") as f:
        f.truncate(damaged.stat().st_size // 2)
    with open(metrics, "ab") as f:
        f.write(b'{"event": "step", "step": 99, "rew')
    second = event_count(metrics)
    final = killed_after + 2
    proc = learner_process(config, steps=final)
    out, _ = proc.communicate(timeout=scaled(900))
    outputs.append(out)
    assert proc.returncode == 0, out
    assert f"checkpoint step_{saved[-1]:06d} is damaged" in out, out
    assert f"resuming from step_{saved[-2]:06d}, the newest intact checkpoint" in out, out
    events = read_events(metrics)
    resumed = [e for e in events[second:] if e["event"] == "resumed"]
    assert [e["step"] for e in resumed] == [saved[-2]]
    assert events[-1]["event"] == "end" and events[-1]["step"] == final
    lines = metrics.read_bytes().split(b"\n")
    assert b'{"event": "step", "step": 99, "rew' in lines  # the torn one stands alone

    # 4. a fresh start over the run refuses and changes nothing
    before = (metrics.read_bytes(), list_versions(root, RUN), list_checkpoints(root, RUN))
    proc = learner_process(config, resume="none")
    out, _ = proc.communicate(timeout=scaled(300))
    outputs.append(out)
    assert proc.returncode == 2, out
    assert "already has checkpoints" in out and "--resume auto" in out, out
    assert "Traceback" not in out
    assert (metrics.read_bytes(), list_versions(root, RUN), list_checkpoints(root, RUN)) \
        == before

    # the run's lineage: steps 1..final once each, every seed trained exactly once
    steps = lineage_steps(events)
    assert [s["step"] for s in steps] == list(range(1, final + 1))
    seeds = [seed for s in steps for seed in s["seeds"]]
    assert len(seeds) == len(set(seeds)) == final * GROUPS_PER_STEP  # duplicated 0
    last = load_checkpoint(root.checkpoint_dir(RUN, final))
    cursor = SeedCursor(7)
    cursor.mark_trained(seeds)  # raises if any seed came twice
    expected = {**cursor.to_dict(), "version": last.data_cursor["version"]}
    assert last.data_cursor == expected  # lost 0: the cursor is exactly these seeds
    # GC removed old versions, none that a checkpoint served
    versions = list_versions(root, RUN)
    pinned = checkpoint_adapter_versions(root, RUN)
    assert pinned and pinned <= set(versions), (pinned, versions)
    assert versions[0] > 1  # something was collected
    for out in outputs:
        assert "DestinationExists" not in out and "Traceback" not in out, out
    print(f"learner restarts, {mode} (random seed {seed}): SIGTERM at step {stopped[0]['step']}, "
          f"SIGKILL after step {killed_after}, damaged "
          f"step_{saved[-1]} -> resumed from step_{saved[-2]}; {len(steps)} steps, "
          f"{len(seeds)} seeds trained once each (lost 0, duplicated 0); versions kept "
          f"{versions}, pinned by checkpoints {sorted(pinned)}")
