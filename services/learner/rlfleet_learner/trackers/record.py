"""runs/<run>/trackers.json: which tracker run each tracker of a run writes to, so a
resumed learner continues the same W&B and MLflow runs instead of starting new ones.

{"wandb": {"run_id": ...}, "mlflow": {"run_id": ..., "experiment_id": ...}}: each
tracker's entry is what its `open` returned. The file is replaced whole (written aside,
renamed over: rlfleet.storage.atomic.replace_file), never left half-written.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlfleet.storage.atomic import replace_file

log = logging.getLogger(__name__)

RECORD_FILE = "trackers.json"


class TrackerRecord:
    """The run directory's trackers.json; `save` may be called from any sink's thread."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / RECORD_FILE
        self._lock = threading.Lock()
        self._entries = self._read()

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            # Unreadable: the trackers start new runs (said), training is not refused.
            log.warning("cannot read %s (%s): trackers start new runs", self.path, exc)
            return {}
        if not isinstance(data, dict):
            log.warning("%s is not a JSON object: trackers start new runs", self.path)
            return {}
        return {k: v for k, v in data.items() if isinstance(v, dict)}

    def get(self, tracker: str) -> dict[str, Any]:
        with self._lock:
            return dict(self._entries.get(tracker, {}))

    def save(self, tracker: str, entry: Mapping[str, Any]) -> None:
        """Records `tracker`'s entry (the file rewritten only when it changes)."""
        with self._lock:
            if self._entries.get(tracker, {}) == dict(entry):
                return  # unchanged, or nothing to keep (TensorBoard's files need no id)
            self._entries[tracker] = dict(entry)
            data = json.dumps(self._entries, indent=2, sort_keys=True) + "\n"
            replace_file(self.run_dir, RECORD_FILE, data.encode())
