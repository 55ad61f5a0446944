"""`report_to: [tensorboard]`: the run's TensorBoard event files (rlfleet_learner.tensorboard)
in its directory, beside metrics.jsonl."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlfleet_learner.tensorboard import TensorBoardLog
from rlfleet_learner.trackers.base import Outcome, Tracker


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def open(self, resumed: Mapping[str, Any]) -> dict[str, Any]:
        # A resumed learner writes files of its own into the same directory: TensorBoard
        # reads them all as one run.
        self._log = TensorBoardLog(self.run_dir)
        return {}

    def event(self, doc: Mapping[str, Any]) -> None:
        self._log.write(doc)

    def log_params(self, config: Mapping[str, Any]) -> None:
        """The config stays in metrics.jsonl's start event (TensorBoard shows scalars)."""

    def log_metrics(self, step: int, metrics: Mapping[str, float], time: float | None
                    ) -> None:
        """Written by `event`, as TensorBoardLog writes each event."""

    def log_files(self, paths: Sequence[Path]) -> None:
        """The files are in the run's directory already, which TensorBoard is pointed at."""

    def close(self, outcome: Outcome) -> None:
        self._log.close()
