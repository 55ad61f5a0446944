"""The learner's TensorBoard event files hold metrics.jsonl's numbers: the event files are
read back here from their bytes (TFRecord framing, checksums, Event protos), not through
the writer that wrote them."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from tensorboardX.crc32c import crc32c
from tensorboardX.proto.event_pb2 import Event

from rlfleet.storage.jsonl import append_json_line
from rlfleet_learner.tensorboard import TensorBoardLog, scalars


def _masked(data: bytes) -> int:
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path: Path) -> list[bytes]:
    """The records of a TFRecord file; fails on a torn record or a bad checksum."""
    data, records, at = path.read_bytes(), [], 0
    while at < len(data):
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        assert header_crc == _masked(header), f"{path}: bad length checksum at {at}"
        body = data[at + 12:at + 12 + length]
        (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        assert len(body) == length and body_crc == _masked(body), f"{path}: torn at {at}"
        records.append(body)
        at += 16 + length
    return records


def read_event_scalars(log_dir: Path) -> dict[tuple[str, int], tuple[float, float]]:
    """(tag, step) -> (value, wall time) of every scalar in the event files of `log_dir`."""
    files = sorted(log_dir.glob("events.out.tfevents.*"))
    assert files, f"no event files in {log_dir}"
    found = {}
    for path in files:
        for record in read_records(path):
            event = Event.FromString(record)
            for value in event.summary.value:
                found[(value.tag, event.step)] = (value.simple_value, event.wall_time)
    return found


def expected_scalars(metrics: Path) -> dict[tuple[str, int], float]:
    """What metrics.jsonl says the event files hold: every number of its step and eval
    events, as `TensorBoardLog` names them."""
    out = {}
    for line in metrics.read_text().splitlines():
        doc = json.loads(line)
        if doc["event"] in ("step", "eval"):
            for tag, value in scalars(doc):
                out[(f"{doc['event']}/{tag}", doc["step"])] = value
    return out


def step_doc(step: int) -> dict:
    return {"event": "step", "time": 1_800_000_000.0 + step, "step": step, "version": step + 1,
            "reward_mean": 0.25 * step, "solve_rate_sampled": 0.5, "trajectories": 8,
            "seeds": [100 + step, 200 + step], "reward_name": "format+task",
            "reward_services": {"format+task 1": 8}, "loss_loss": -0.125 * step,
            "loss_kl": 0.01, "grad_norm": 1.5, "rollout_s": 2.0, "step_s": 3.25}


def test_event_files_hold_the_step_and_eval_scalars_of_metrics_jsonl(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    board = TensorBoardLog(tmp_path)
    docs = [{"event": "start", "time": 1.0, "step": 0, "config": {"steps": 2}},
            step_doc(1), step_doc(2),
            {"event": "eval", "time": 1_800_000_010.0, "step": 2, "version": 3,
             "seconds": 4.5, "eval": {"solve_rate": 0.375, "episodes": 64},
             "heldout": {"solve_rate": 0.25, "episodes": 128}},
            {"event": "end", "time": 2.0, "step": 2}]
    for doc in docs:  # as the learner's _event does: the line, then the scalars
        append_json_line(metrics, doc)
        board.write(doc)
    board.close()
    got = read_event_scalars(tmp_path)
    want = expected_scalars(metrics)
    assert {k: v for k, (v, _) in got.items()} == pytest.approx(want)
    assert ("step/reward_mean", 2) in got and ("eval/heldout/solve_rate", 2) in got
    assert got[("eval/eval/solve_rate", 2)][0] == 0.375
    assert got[("step/reward_mean", 2)][1] == 1_800_000_002.0  # the event's own wall time
    assert not any(tag.startswith(("step/seeds", "start/", "end/")) for tag, _ in got)


def test_a_resumed_run_adds_an_event_file_and_keeps_the_first(tmp_path: Path) -> None:
    first = TensorBoardLog(tmp_path)
    first.write(step_doc(1))
    first.close()
    second = TensorBoardLog(tmp_path)  # a learner resumed in the same run directory
    second.write(step_doc(2))
    second.close()
    got = read_event_scalars(tmp_path)
    assert got[("step/reward_mean", 1)][0] == 0.25 and got[("step/reward_mean", 2)][0] == 0.5


def test_no_event_file_before_the_first_step_or_eval(tmp_path: Path) -> None:
    board = TensorBoardLog(tmp_path)  # a learner that refuses to start gets this far
    assert board.write({"event": "start", "time": 1.0, "step": 0}) == 0
    board.close()
    assert list(tmp_path.iterdir()) == []


def test_tensorboard_itself_reads_the_run(tmp_path: Path) -> None:
    """`tensorboard --logdir runs/<id>`, as the README says (set-up installs it)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = TensorBoardLog(tmp_path)
    board.write(step_doc(1))
    board.write(step_doc(2))
    board.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert "step/reward_mean" in events.Tags()["scalars"]
    assert [e.step for e in events.Scalars("step/reward_mean")] == [1, 2]
