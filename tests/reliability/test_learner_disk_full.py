"""A full disk under the runs root ends a learner with one clear line and
an exit code, not a traceback, and loses no checkpointed step.

The runs root is a small tmpfs of its own (a real filesystem that fills up; the test
needs root to mount it and is skipped without). A sync learner (a real process under local
Ray, the deployed command) checkpoints every step; after its step 1 checkpoint the disk is
filled to the last byte: the next write (the adapter of step 2, its record, its
checkpoint) fails with ENOSPC, and the learner stops with exit code 3 and one line naming
the full disk. Space freed, the deployed command (`--resume auto`) resumes from step 1 and
finishes the run.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlfleet.local.metrics_jsonl import lineage_steps, read_events
from rlfleet.local.stack import LocalStack, start_stack
from rlfleet.storage import RunsRoot, list_checkpoints
from tests import factories
from tests.factories import HOT_SHORT_EPISODES, NO_EVAL, SFT, learner_process
from tests.reliability.conftest import stopped_cleanly_after_step_1
from tests.waits import scaled

RUN = "disk-full"
STEPS = 3


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "shared"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def stack(small_disk: Path, tmp_path: Path, procs):  # noqa: ANN201
    s = start_stack(tmp_path, runs_root=small_disk / "runs", run=RUN, model_dir=SFT,
                    replicas=1, reward="format+task", group=procs)
    yield s
    s.close()


def fill(disk: Path) -> Path:
    """Writes a file until the filesystem has not one byte left."""
    junk = disk / "junk"
    with open(junk, "wb") as f:
        chunk = b"\0" * (1 << 20)
        with contextlib.suppress(OSError):
            while True:
                f.write(chunk)
                f.flush()
        for size in (4096, 1):  # the last pages
            with contextlib.suppress(OSError):
                while True:
                    os.write(f.fileno(), b"\0" * size)
    with pytest.raises(OSError) as err:
        (disk / "probe").write_bytes(b"x" * 4096)
    assert err.value.errno == errno.ENOSPC
    return junk


@pytest.mark.slow
def test_a_full_disk_stops_the_learner_cleanly_and_the_rerun_resumes(
        stack: LocalStack, small_disk: Path, tmp_path: Path) -> None:
    config = factories.learner_config(
        stack, tmp_path, RUN, steps=STEPS, mode="sync",
        data=HOT_SHORT_EPISODES,
        eval=NO_EVAL, checkpoint={"every": 1, "keep_last": 3}, ray={"num_workers": 1},
        fleet={"max_groups_in_flight": 2})
    root = RunsRoot(stack.runs_root)
    junk: list[Path] = []
    out, stop = stopped_cleanly_after_step_1(
        config, root, RUN, lambda: junk.append(fill(small_disk)))
    assert "No space left on device" in stop, out
    assert list_checkpoints(root, RUN)[0] == 1  # nothing checkpointed was lost

    junk[0].unlink()
    proc = learner_process(config)
    out, _ = proc.communicate(timeout=scaled(900))
    assert proc.returncode == 0, out
    assert "Traceback" not in out, out
    events = read_events(root.metrics_path(RUN))
    resumed = [e["step"] for e in events if e["event"] == "resumed"]
    assert resumed and resumed[-1] >= 1
    assert [s["step"] for s in lineage_steps(events)] == list(range(1, STEPS + 1))
