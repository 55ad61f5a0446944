"""Reading a run's metrics.jsonl."""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def read_events(path: Path) -> list[dict]:
    """Every event of a metrics.jsonl; a torn line (a write cut short by a crash or a
    full disk) is skipped with a warning instead of failing the reader."""
    events = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("skipping a torn line in %s", path, extra={"line": n})
    return events
