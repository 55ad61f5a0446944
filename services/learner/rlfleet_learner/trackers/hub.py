"""The learner's trackers together: every metrics.jsonl event to each (`write`), and at the
end the run's learning curve and summary as files, then each closed (`close`).

Sinks start at the first event, not when the learner is built: a learner that refuses to
start opens no tracker run. Closing waits at most `CLOSE_WAIT_S` for all of them together.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlfleet.learner_config import LearnerConfig
from rlfleet_learner.trackers import TRACKERS
from rlfleet_learner.trackers.base import Outcome, Tracker
from rlfleet_learner.trackers.record import TrackerRecord
from rlfleet_learner.trackers.sink import THREAD_PREFIX, TrackerSink

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 120.0  # the end of a run waits this long, at most, for its trackers
CURVE_FILE = "learning_curve.png"
SUMMARY_FILE = "summary.json"
_OUTCOMES: dict[str, Outcome] = {"end": "finished", "failed": "failed", "stopped": "stopped"}


class _QuietTrackerThreads(logging.Filter):
    """Drops third-party log records made on a sink's thread (a client's retry warnings,
    its progress): the sink says what went wrong itself, once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.threadName.startswith(THREAD_PREFIX)
                    and not record.name.startswith("rlfleet"))


class TrackerHub:
    """The trackers `cfg.report_to` names, for the run in `run_dir` (whose metrics.jsonl
    is `metrics_path`). Building it builds each tracker: a config one cannot work with
    is refused now (ConfigError), before the run starts."""

    def __init__(self, cfg: LearnerConfig, run_dir: Path, metrics_path: Path) -> None:
        self.run_dir = Path(run_dir)
        self.metrics_path = Path(metrics_path)
        self.trackers: list[Tracker] = [TRACKERS.get(name)(cfg, self.run_dir)
                                        for name in cfg.report_to]
        self.sinks: list[TrackerSink] = []
        self._record: TrackerRecord | None = None
        self._outcome: Outcome = "stopped"
        self._end: Mapping[str, Any] | None = None

    def _start(self) -> None:
        self._record = record = TrackerRecord(self.run_dir)
        quiet = _QuietTrackerThreads()
        for handler in logging.getLogger().handlers:
            if not any(isinstance(f, _QuietTrackerThreads) for f in handler.filters):
                handler.addFilter(quiet)
        for tracker in self.trackers:
            self.sinks.append(TrackerSink(tracker, record.get(tracker.name),
                                          lambda entry, n=tracker.name: record.save(n, entry)))

    def write(self, doc: Mapping[str, Any]) -> None:
        """Hands `doc` (a metrics.jsonl event, already written there) to every tracker."""
        if not self.trackers:
            return
        if self._record is None:
            self._start()
        kind = str(doc.get("event"))
        if kind in _OUTCOMES:
            self._outcome = _OUTCOMES[kind]
            self._end = doc if kind == "end" else None
        for sink in self.sinks:
            sink.put("event", doc)

    def close(self) -> None:
        """The learning curve and summary of a run that ended (its `end` event) to every
        tracker, then each closed; waits at most CLOSE_WAIT_S for them all."""
        if not self.sinks:
            return
        deadline = time.monotonic() + CLOSE_WAIT_S
        with tempfile.TemporaryDirectory(prefix="rlfleet-trackers-") as tmp:
            if self._end is not None:
                files = self._end_files(Path(tmp), self._end)
                for sink in self.sinks:
                    sink.put("log_files", files)
            for sink in self.sinks:
                sink.close(self._outcome, deadline)
        self.sinks = []

    def _end_files(self, out: Path, end: Mapping[str, Any]) -> list[Path]:
        """summary.json (what `rlfleet learner run --summary` writes) and the learning
        curve drawn from metrics.jsonl as `make run` draws it."""
        summary = out / SUMMARY_FILE
        summary.write_text(json.dumps(end, indent=2))
        files = [summary]
        try:
            from rlfleet.local.metrics_jsonl import read_events
            from rlfleet.local.plots import learning_curve

            events = read_events(self.metrics_path)
            learning_curve([e for e in events if e["event"] == "step"],
                           [e for e in events if e["event"] == "eval"], out / CURVE_FILE,
                           title=f"rlfleet {self.run_dir.name}")
            files.insert(0, out / CURVE_FILE)
        except Exception as exc:  # noqa: BLE001 - a plot must not fail the run's end
            log.warning("could not draw the learning curve for the trackers: %s", exc)
        return files
