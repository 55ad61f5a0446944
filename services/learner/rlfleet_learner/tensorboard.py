"""A run's TensorBoard event files, beside its metrics.jsonl (`tensorboard --logdir
runs/<run>`), so its curves can be viewed without the cluster's Prometheus.

The scalars are metrics.jsonl's own numbers: every number of a `step` event under
``step/<field>`` and of an `eval` event under ``eval/<set>/<field>`` (nested fields joined
with "/"; characters TensorBoard does not keep in a tag become "_"), at the event's step
and wall time. Lists (the trained seeds) and text stay in metrics.jsonl only.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

# Events that carry the run's curves, and the fields that place them rather than measure.
SCALAR_EVENTS = ("step", "eval")
_PLACING = frozenset({"event", "time", "step"})
_NOT_IN_TAGS = re.compile(r"[^A-Za-z0-9_./-]")  # what TensorBoard would rewrite itself


def scalars(doc: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """(tag, value) of every number in `doc`, nested mappings flattened with "/"
    (booleans are numbers too: 0 or 1)."""
    for key, value in doc.items():
        if not prefix and key in _PLACING:
            continue
        tag = prefix + _NOT_IN_TAGS.sub("_", str(key))
        if isinstance(value, Mapping):
            yield from scalars(value, f"{tag}/")
        elif isinstance(value, (int, float)):
            yield tag, float(value)


class TensorBoardLog:
    """Writes the scalars of each `step` and `eval` event to event files in `log_dir`.

    The file is opened at the first such event (a learner that refuses to start leaves
    none), and tensorboardX imported then, not at module import. Each event is flushed at
    once, so the files are whole whenever the learner stops."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self._writer: Any = None

    def _open(self) -> Any:
        from tensorboardX import SummaryWriter

        # A file of its own: tensorboardX names files by the second and the host, and a
        # learner resumed within the same second would otherwise overwrite its
        # predecessor's file (TensorBoard reads every file of the directory).
        return SummaryWriter(logdir=str(self.log_dir),
                             filename_suffix=f".{os.getpid()}.{uuid.uuid4().hex[:8]}")

    def write(self, doc: Mapping[str, Any]) -> int:
        """Writes `doc`'s scalars if it is a step or eval event; how many it wrote."""
        kind = doc.get("event")
        if kind not in SCALAR_EVENTS or "step" not in doc:
            return 0
        if self._writer is None:
            self._writer = self._open()
        written = 0
        for tag, value in scalars(doc):
            self._writer.add_scalar(f"{kind}/{tag}", value, global_step=int(doc["step"]),
                                    walltime=doc.get("time"))
            written += 1
        self._writer.flush()
        return written

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
