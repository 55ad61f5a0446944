"""What a restarted learner reads back: the newest intact checkpoint (damaged newer ones
set aside), whether a run has trained before, the adapter versions its checkpoints pin,
and metrics.jsonl appends that never leave a torn record."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlfleet.local.metrics_jsonl import read_events
from rlfleet.storage import (
    checkpoint_adapter_versions,
    has_checkpoints,
    list_checkpoints,
    load_latest_intact_checkpoint,
    save_checkpoint,
)
from rlfleet.storage.checkpoints import KEEP_DAMAGED, OPTIMIZER_FILE, CheckpointError
from rlfleet.storage.jsonl import append_json_line
from rlfleet.storage.paths import RunsRoot


@pytest.fixture
def rr(tmp_path: Path) -> RunsRoot:
    return RunsRoot(tmp_path / "runs")


def save(rr: RunsRoot, step: int, version: int) -> Path:
    optimizer = {"state": {0: {"exp_avg": torch.full((64, 64), float(step))}},
                 "param_groups": [{"lr": 1e-3, "params": [0]}]}
    return save_checkpoint(rr, "exp", step, adapter_state={"a": torch.ones(2, 2) * step},
                           optimizer_state=optimizer,
                           data_cursor={"cursor": step, "version": version})


def truncate(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)


def test_a_truncated_newest_checkpoint_falls_back_to_the_newest_intact(
        rr: RunsRoot, caplog: pytest.LogCaptureFixture) -> None:
    for step in (2, 4, 6):
        save(rr, step, version=step + 1)
    truncate(rr.checkpoint_dir("exp", 6) / OPTIMIZER_FILE)
    with caplog.at_level(logging.WARNING, logger="rlfleet.storage.checkpoints"):
        ckpt = load_latest_intact_checkpoint(rr, "exp")
    assert ckpt is not None and ckpt.step == 4
    assert float(ckpt.optimizer_state["state"][0]["exp_avg"][0, 0]) == 4.0
    messages = [r.getMessage() for r in caplog.records]
    assert any("step_000006 is damaged" in m for m in messages), messages
    assert any("resuming from step_000004" in m for m in messages), messages
    # set aside, not deleted: step 6 can be checkpointed again by the resumed run
    names = sorted(os.listdir(rr.checkpoints_root("exp")))
    assert names[:2] == ["damaged-step_000006-" + names[0].rsplit("-", 1)[1], "step_000002"]
    assert list_checkpoints(rr, "exp") == [2, 4]
    save(rr, 6, version=7)
    assert load_latest_intact_checkpoint(rr, "exp").step == 6


def test_every_checkpoint_damaged_is_a_clear_error_and_the_run_counts_as_trained(
        rr: RunsRoot) -> None:
    assert not has_checkpoints(rr, "exp")
    assert load_latest_intact_checkpoint(rr, "exp") is None
    save(rr, 3, version=3)
    assert has_checkpoints(rr, "exp")
    truncate(rr.checkpoint_dir("exp", 3) / OPTIMIZER_FILE)
    with pytest.raises(CheckpointError, match="every checkpoint of run 'exp' is damaged"):
        load_latest_intact_checkpoint(rr, "exp")
    assert list_checkpoints(rr, "exp") == []
    assert has_checkpoints(rr, "exp")  # the damaged one still says the run trained


def test_checkpoints_pin_the_adapter_versions_they_served(rr: RunsRoot) -> None:
    save(rr, 3, version=4)
    save(rr, 5, version=6)
    tmp = rr.checkpoints_root("exp") / ".step_000007.tmp-1-x"  # an unfinished write
    tmp.mkdir()
    (tmp / "data_cursor.json").write_text(json.dumps({"version": 8}))
    assert checkpoint_adapter_versions(rr, "exp") == {4, 6}
    assert checkpoint_adapter_versions(rr, "other") == set()


def test_append_closes_an_old_torn_line_and_readers_skip_it(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    append_json_line(path, {"event": "step", "step": 1})
    with open(path, "ab") as f:
        f.write(b'{"event": "step", "st')  # a crash inside an earlier write
    append_json_line(path, {"event": "step", "step": 2})
    lines = path.read_bytes().split(b"\n")
    assert lines[1] == b'{"event": "step", "st' and json.loads(lines[2])["step"] == 2
    assert [e["step"] for e in read_events(path)] == [1, 2]


APPEND_UNDER_LIMIT = """
import resource, signal, sys
from rlfleet.storage.jsonl import append_json_line
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death at the limit
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
try:
    append_json_line(sys.argv[1], {"event": "step", "step": 2, "pad": "x" * 400})
except OSError as exc:
    print(f"refused: {exc}")
"""


def test_an_append_the_disk_cannot_take_whole_leaves_no_torn_record(tmp_path: Path) -> None:
    """A real file-size limit (RLIMIT_FSIZE, as a full disk): the kernel writes part of
    the record and stops; the append cuts it back and raises."""
    path = tmp_path / "metrics.jsonl"
    append_json_line(path, {"event": "step", "step": 1})
    before = path.read_bytes()
    out = subprocess.run([sys.executable, "-c", APPEND_UNDER_LIMIT, str(path),
                          str(len(before) + 100)], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    assert out.startswith("refused:") and "short write" in out, out
    assert path.read_bytes() == before  # whole lines only
    append_json_line(path, {"event": "step", "step": 2})
    assert [e["step"] for e in read_events(path)] == [1, 2]


def test_the_lineage_keeps_the_resumed_attempts_records_of_a_step() -> None:
    from rlfleet.local.metrics_jsonl import lineage_steps

    events = [{"event": "start", "step": 0}, *({"event": "step", "step": s, "a": 1}
                                               for s in (1, 2, 3)),
              {"event": "resumed", "step": 2}, {"event": "start", "step": 2},
              {"event": "step", "step": 3, "a": 2}, {"event": "step", "step": 4, "a": 2}]
    assert [(e["step"], e["a"]) for e in lineage_steps(events)] == [(1, 1), (2, 1), (3, 2),
                                                                    (4, 2)]
    # an attempt that never checkpointed: a fresh start supersedes all of it
    fresh = [{"event": "start", "step": 0}, {"event": "step", "step": 1, "a": 1},
             {"event": "start", "step": 0}, {"event": "step", "step": 1, "a": 2}]
    assert [e["a"] for e in lineage_steps(fresh)] == [2]


def test_set_aside_checkpoints_are_bounded_in_number(rr: RunsRoot) -> None:
    # a disk that damages the same step again and again (5 times within a second or so):
    # the newest 3 set-aside copies stay for inspection, the rest are removed
    save(rr, 2, version=3)
    for _ in range(5):
        save(rr, 4, version=5)
        truncate(rr.checkpoint_dir("exp", 4) / OPTIMIZER_FILE)
        ckpt = load_latest_intact_checkpoint(rr, "exp")
        assert ckpt is not None and ckpt.step == 2
    names = sorted(p.name for p in rr.checkpoints_root("exp").iterdir())
    aside = [n for n in names if n.startswith("damaged-step_000004-")]
    assert len(aside) == KEEP_DAMAGED == 3, names
    assert list_checkpoints(rr, "exp") == [2] and has_checkpoints(rr, "exp")
