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


def lineage_steps(events: list[dict]) -> list[dict]:
    """The step records of the run as it stands after its restarts: an attempt's `start`
    (or `resumed`) event at step s drops the records of steps after s that an earlier
    attempt wrote (its work after its last checkpoint, trained again by this attempt; all
    of it when that attempt never checkpointed). Ordered by step."""
    by_step: dict[int, dict] = {}
    for e in events:
        if e.get("event") in ("start", "resumed"):
            by_step = {s: doc for s, doc in by_step.items() if s <= int(e["step"])}
        elif e.get("event") == "step":
            by_step[int(e["step"])] = e
    return [by_step[s] for s in sorted(by_step)]
