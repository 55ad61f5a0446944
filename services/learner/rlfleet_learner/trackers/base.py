"""What an experiment tracker is to the learner: a run elsewhere (W&B, MLflow, TensorBoard
files) that is opened once, given the learner's events and a few files, and closed.

A tracker's methods run on its sink's thread (rlfleet_learner.trackers.sink), never on the
training thread: they may be slow or fail, and the learner does not wait for them. The
numbers are metrics.jsonl's own, flattened as the TensorBoard event files name them
(``step/<field>``, ``eval/<set>/<field>``), so every tracker shows the same curves.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from rlfleet.learner_config import LearnerConfig
from rlfleet_learner.tensorboard import SCALAR_EVENTS, scalars

# How a run ended, as its trackers are told: its `end` event, a `failed` one, or neither (a
# signal, or an error that left no record).
Outcome = Literal["finished", "failed", "stopped"]


def flat_params(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a nested config (lists stay whole)."""
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flat_params(value, f"{name}.")
        else:
            yield name, value


def event_metrics(doc: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a `step` or `eval` event under their TensorBoard tags; {} for any
    other event."""
    kind = doc.get("event")
    if kind not in SCALAR_EVENTS or "step" not in doc:
        return {}
    return {f"{kind}/{tag}": value for tag, value in scalars(doc)}


class Tracker(ABC):
    """One tracker of one learner attempt. Built on the training thread (a config it
    cannot work with is refused there, before the run starts: ConfigError); everything
    else runs on the tracker's sink thread."""

    name: ClassVar[str]

    def __init__(self, cfg: LearnerConfig, run_dir: Path) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)

    @abstractmethod
    def open(self, resumed: Mapping[str, Any]) -> dict[str, Any]:
        """Starts the tracker's run, or continues the one `resumed` describes (what this
        method returned for the run before; {} for a new run). Returns what a resumed
        learner needs to continue it (kept in the run's trackers.json)."""

    def event(self, doc: Mapping[str, Any]) -> None:
        """One metrics.jsonl event: the resolved config of a `start` as parameters, the
        numbers of a `step` or `eval` as metrics at its step."""
        if doc.get("event") == "start" and isinstance(doc.get("config"), Mapping):
            self.log_params(doc["config"])
        metrics = event_metrics(doc)
        if metrics:
            self.log_metrics(int(doc["step"]), metrics, doc.get("time"))

    @abstractmethod
    def log_params(self, config: Mapping[str, Any]) -> None:
        """The run's resolved config (nested sections)."""

    @abstractmethod
    def log_metrics(self, step: int, metrics: Mapping[str, float], time: float | None
                    ) -> None:
        """Numbers at a learner step; `time` the event's wall time (seconds)."""

    @abstractmethod
    def log_files(self, paths: Sequence[Path]) -> None:
        """Files kept with the run (the learning curve, the summary)."""

    @abstractmethod
    def close(self, outcome: Outcome) -> None:
        """Ends this attempt's part of the run (everything logged is sent)."""
