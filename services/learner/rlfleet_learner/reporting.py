"""What the learner says while it works: each step's line, and what it waits for.

A step's (or eval's) line is a JSON log line with its fields; a person's console shows
its human rendering instead (rlfleet_learner.console: a pod's log stays pure JSON). A wait
(for replicas, for rollouts, for acknowledgements) that lasts is reported every
`WAIT_REPORT_S` with what it waits for, never silence.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from rlfleet_learner.console import CONSOLE_ATTR

log = logging.getLogger("rlfleet_learner")

WAIT_REPORT_S = 10.0


def report_progress(msg: str, fields: Mapping[str, Any], human: Callable[[], str]) -> None:
    """`msg` logged with `fields` (only their scalar values: lists and mappings stay in
    metrics.jsonl), carrying `human` for a person's console (rlfleet_learner.console),
    which shows `human()` instead; the JSON lines leave it out."""
    scalars = {k: v for k, v in fields.items() if isinstance(v, (int, float, str, bool))}
    log.info(msg, extra={**scalars, CONSOLE_ATTR: human})


def start_line(run: str, resume: str, step: int | None, checkpoint: str | Path | None
               ) -> str:
    """The learner's first word on a run: resuming it (from which step and checkpoint,
    what a deploy over an old run's directory does with --resume auto) or starting it."""
    if step is not None:
        return f"resuming run {run} from step {step} (checkpoint {checkpoint})"
    how = "no checkpoint yet" if resume in ("auto", "latest") else f"--resume {resume}"
    return f"starting run {run} from step 0 ({how})"


class WaitReport:
    """Logs "waiting for <what>" with `state()`'s fields and the seconds waited, every
    `every_s` while the `with` block runs (nothing if it ends sooner). `state` runs on
    the reporter's thread; a failure there is reported in the line, never raised."""

    def __init__(self, what: str, state: Callable[[], Mapping[str, Any]],
                 every_s: float = WAIT_REPORT_S) -> None:
        if every_s <= 0:
            raise ValueError("every_s must be > 0")
        self.what = what
        self.state = state
        self.every_s = every_s
        self.reports = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="wait-report", daemon=True)
        self._start = 0.0

    def __enter__(self) -> WaitReport:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._done.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._done.wait(self.every_s):
            try:
                fields = dict(self.state())
            except Exception as exc:  # noqa: BLE001 - a report must not end the wait
                fields = {"state_error": repr(exc)}
            if self._done.is_set():
                return
            self.reports += 1
            log.info(f"waiting for {self.what}",
                     extra={**fields, "elapsed_s": round(time.monotonic() - self._start, 1)})


def replica_state(pool: Any, wanted: int | None = None, version: int | None = None
                  ) -> dict[str, Any]:
    """The fleet as a wait report shows it: the run, the replicas wanted (if given), the
    ids of those seen live (verified heartbeats) and, with `version`, of those that serve
    it (acknowledged: what ckpt-sync's WaitForReplicas counts)."""
    state: dict[str, Any] = {"run": pool.run}
    if wanted is not None:
        state["replicas_wanted"] = wanted
    if version is not None:
        state["version"] = version
    if pool.fleet is None:  # fixed addresses: no heartbeats to read versions from
        state["replicas_seen"] = sorted(r.replica_id for r in pool.replicas())
        return state
    live = [r for r in pool.fleet.live() if pool.run is None or r.run == pool.run]
    state["replicas_seen"] = sorted(r.replica_id for r in live)
    if version is not None:
        state["replicas_acknowledged"] = sorted(r.replica_id for r in live
                                                if r.adapter_version >= version)
    return state
