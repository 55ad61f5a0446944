"""The learner's trackers off the training thread: each gets every event in order on a
thread of its own; one that fails or falls behind is warned about once, then counted, and
never blocks the caller; trackers.json keeps each tracker's run across restarts."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from rlfleet.config import ConfigError
from rlfleet.learner_config import TRACKER_NAMES, LearnerConfig
from rlfleet.storage.jsonl import append_json_line
from rlfleet_learner.trackers import TRACKERS
from rlfleet_learner.trackers.base import Outcome, Tracker, event_metrics, flat_params
from rlfleet_learner.trackers.hub import TrackerHub
from rlfleet_learner.trackers.record import RECORD_FILE, TrackerRecord
from rlfleet_learner.trackers.sink import TrackerSink
from tests.unit.test_learner_tensorboard import expected_scalars, read_event_scalars, step_doc
from tests.waits import scaled, wait_until

SINK_LOG = "rlfleet_learner.trackers.sink"


class Recording(Tracker):
    """A tracker that keeps what it is given (and on which thread); `fail` makes every
    call after `open` raise, `gate` holds every call until it is set."""

    name = "recording"

    def __init__(self, fail: bool = False, gate: threading.Event | None = None) -> None:
        super().__init__(LearnerConfig(), Path("."))
        self.fail = fail
        self.gate = gate
        self.calls: list[tuple[str, Any]] = []
        self.threads: set[str] = set()

    def _record(self, what: str, arg: Any) -> None:
        if self.gate is not None:
            self.gate.wait()
        self.threads.add(threading.current_thread().name)
        if self.fail:
            raise ConnectionError("tracking server refused the connection")
        self.calls.append((what, arg))

    def open(self, resumed: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("open", dict(resumed)))
        return {"run_id": resumed.get("run_id", "new-run")}

    def log_params(self, config: Mapping[str, Any]) -> None:
        self._record("params", dict(config))

    def log_metrics(self, step: int, metrics: Mapping[str, float], time: float | None
                    ) -> None:
        self._record("metrics", (step, dict(metrics)))

    def log_files(self, paths: Sequence[Path]) -> None:
        self._record("files", [p.name for p in paths])

    def close(self, outcome: Outcome) -> None:
        self.calls.append(("close", outcome))


def sink_for(tracker: Tracker, resumed: Mapping[str, Any] | None = None, **kw: Any
             ) -> tuple[TrackerSink, list[dict]]:
    opened: list[dict] = []
    return TrackerSink(tracker, resumed or {}, opened.append, **kw), opened


def deadline(seconds: float) -> float:
    return time.monotonic() + scaled(seconds)


def test_every_event_reaches_the_tracker_in_order_on_its_own_thread() -> None:
    tracker = Recording()
    sink, opened = sink_for(tracker, {"run_id": "abc"})
    sink.put("event", {"event": "start", "step": 0, "config": {"run": "r", "optim": {"lr": 1}}})
    for step in (1, 2, 3):
        sink.put("event", step_doc(step))
    sink.put("event", {"event": "checkpoint", "step": 3})  # no numbers: nothing logged
    assert sink.close("finished", deadline(30))
    assert tracker.calls[0] == ("open", {"run_id": "abc"})
    assert opened == [{"run_id": "abc"}]
    assert tracker.calls[1] == ("params", {"run": "r", "optim": {"lr": 1}})
    assert [c[1][0] for c in tracker.calls if c[0] == "metrics"] == [1, 2, 3]
    assert ("metrics", (2, event_metrics(step_doc(2)))) in tracker.calls
    assert tracker.calls[-1] == ("close", "finished")
    assert tracker.threads == {"tracker-recording"}
    assert (sink.delivered, sink.failed, sink.dropped) == (5, 0, 0)


def test_a_failing_tracker_is_warned_about_once_then_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    tracker = Recording(fail=True)
    sink, _ = sink_for(tracker, retry_after_s=0.0)  # tried again every time
    with caplog.at_level(logging.WARNING, logger=SINK_LOG):
        for step in range(1, 6):
            assert sink.put("event", step_doc(step))
        assert sink.close("failed", deadline(30))
    warnings = [r.getMessage() for r in caplog.records if r.name == SINK_LOG]
    assert len(warnings) == 2, warnings  # the first failure, then the count at the end
    assert "tracker recording failed" in warnings[0]
    assert "refused the connection" in warnings[0]
    assert "5 of 5 events and files not delivered" in warnings[1]
    assert len(tracker.threads) == 1 and sink.failed == 5  # every one was tried
    assert tracker.calls[-1] == ("close", "failed")  # and still closed at the end


def test_a_tracker_that_failed_is_left_alone_for_a_while() -> None:
    tracker = Recording(fail=True)
    sink, _ = sink_for(tracker, retry_after_s=3600.0)
    for step in range(1, 4):
        sink.put("event", step_doc(step))
    assert sink.close("stopped", deadline(30))
    # one call failed; the two after it were counted without calling the tracker
    assert sink.failed == 3 and sink.delivered == 0


def test_a_stuck_tracker_never_blocks_the_caller(caplog: pytest.LogCaptureFixture) -> None:
    gate = threading.Event()
    tracker = Recording(gate=gate)
    sink, _ = sink_for(tracker, max_queued=2)
    with caplog.at_level(logging.WARNING, logger=SINK_LOG):
        sink.put("event", step_doc(1))  # taken by the thread, which then waits at the gate
        wait_until("the sink's thread to take the first event", lambda: sink._queue.empty())
        accepted = [sink.put("event", step_doc(step)) for step in range(2, 12)]
        assert accepted == [True, True] + [False] * 8  # the queue holds 2; the rest dropped
        assert not sink.close("finished", time.monotonic())  # gave up at once
        gate.set()  # the tracker answers again: what is queued goes, then the close
        assert sink.close("finished", deadline(30))
    warnings = [r.getMessage() for r in caplog.records if r.name == SINK_LOG]
    assert "queue of 2 is full" in warnings[0]
    assert "did not finish in time" in warnings[1]
    assert "8 of 11 events and files not delivered (8 dropped" in warnings[2]
    assert len(warnings) == 3, warnings
    assert sink.dropped == 8
    assert [c[1][0] for c in tracker.calls if c[0] == "metrics"] == [1, 2, 3]


def test_trackers_json_keeps_each_trackers_run(tmp_path: Path) -> None:
    record = TrackerRecord(tmp_path)
    assert record.get("mlflow") == {}
    record.save("mlflow", {"run_id": "m1", "experiment_id": "2"})
    record.save("wandb", {"run_id": "w1"})
    again = TrackerRecord(tmp_path)  # a resumed learner
    assert again.get("mlflow") == {"run_id": "m1", "experiment_id": "2"}
    assert again.get("wandb") == {"run_id": "w1"}
    assert [p.name for p in tmp_path.iterdir()] == [RECORD_FILE]  # no temp file left
    (tmp_path / RECORD_FILE).write_text("{torn")
    assert TrackerRecord(tmp_path).get("wandb") == {}  # unreadable: new runs, no refusal


def test_the_registry_holds_the_configs_tracker_names() -> None:
    assert TRACKERS.names() == sorted(TRACKER_NAMES)
    for name in TRACKER_NAMES:
        assert TRACKERS.get(name).name == name


def test_report_to_is_checked_when_the_config_loads() -> None:
    with pytest.raises(ValueError, match="twice"):
        LearnerConfig(report_to=["wandb", "wandb"])
    with pytest.raises(ValueError, match="report_to"):
        LearnerConfig(report_to=["comet"])
    assert LearnerConfig().report_to == ["tensorboard"]  # today's behaviour by default


def test_mlflow_without_a_server_is_refused_before_the_run(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(ConfigError, match="MLFLOW_TRACKING_URI"):
        TrackerHub(LearnerConfig(report_to=["mlflow"]), tmp_path, tmp_path / "m.jsonl")


def test_the_hub_feeds_tensorboard_the_events_of_metrics_jsonl(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    hub = TrackerHub(LearnerConfig(), tmp_path, metrics)
    for doc in [{"event": "start", "step": 0, "config": {"run": "r"}},
                *(step_doc(s) for s in (1, 2)),
                {"event": "eval", "time": 1_800_000_003.0, "step": 2,
                 "eval": {"solve_rate": 0.5, "episodes": 4}},
                {"event": "end", "step": 2}]:
        append_json_line(metrics, doc)
        hub.write(doc)
    hub.close()
    assert {k: v for k, (v, _) in read_event_scalars(tmp_path).items()} == pytest.approx(
        expected_scalars(metrics))
    assert not (tmp_path / RECORD_FILE).exists()  # tensorboard has no run to continue


def test_a_config_flattens_to_dotted_parameters() -> None:
    config = {"run": "r", "optim": {"lr": 0.1, "betas": [0.9, 0.99]}, "ray": {}}
    assert dict(flat_params(config)) == {"run": "r", "optim.lr": 0.1,
                                         "optim.betas": [0.9, 0.99], "ray": {}}
    assert json.dumps(dict(flat_params(config)))
