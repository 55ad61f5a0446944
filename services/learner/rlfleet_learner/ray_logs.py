"""The Ray workers' output in the learner's log, as JSON lines.

With `log_to_driver`, Ray prints every line its workers write to the driver's stdout or
stderr with a coloured "(TrainWorker pid=...)" prefix: plain text amid the learner's JSON
lines. `relay_worker_output` swaps Ray's printer for one that logs each line as a record
of the driver's JSON log (logger `ray.worker`, with the worker's pid, actor or task and
node); a line that is a JSON log record already (a worker that set up rlfleet.logs) keeps
its own fields, timestamp, level and logger.

Not every line is relayed: the batches Ray marks pid "autoscaler" are its monitor's log
(a cluster status dump every few seconds) and keep only their warnings and errors (e.g.
"Warning: The following resource request cannot be scheduled"); a line a worker's
library writes in Ray's own log format ("... INFO worker.py:123 -- ...") is dropped
below WARNING, and so is a worker's JSON record of a library logger (ray, transformers,
...) below WARNING. A progress bar (tqdm's "Loading weights: 100%|...| 86/86", redrawn
with carriage returns on stderr) is kept as what a terminal would show last, at INFO: a
bar is not a warning. What the trainers print, and every warning or error, stays.

Ray's printer is reached through `ray._private.ray_logging` (no public API swaps it); if
that moves in a later Ray, the learner keeps Ray's printer and says so once.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from rlfleet.logs import is_library_logger

log = logging.getLogger(__name__)
worker_log = logging.getLogger("ray.worker")

RAY_PRINTER = "ray_print_logs"  # the name ray.init gives its handler
RELAY = "rlfleet_json_lines"
AUTOSCALER = "autoscaler"
EVENT_SUMMARY = ":event_summary:"  # Ray's mark of an autoscaler event (v1 monitor)
# Ray's own log format, e.g. "2026-01-01 10:00:00,123\tINFO worker.py:1 -- Connecting".
_RAY_LOG_LINE = re.compile(r"^\S+ \S+\s+(DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+:\d+ -- ")
# tqdm's bar: "<desc>: 100%|██████████| 86/86 [00:00<00:00, ...]"
_PROGRESS_BAR = re.compile(r"\d+%\|[^|]*\|\s*\d+/\d+")
_PROBLEM = re.compile(r"\b(error|warning|exception|traceback|failed|fatal)\b", re.I)
_ERROR = re.compile(r"\b(error|traceback|fatal|exception)\b", re.I)
QUIET_BELOW = logging.WARNING  # library chatter under this level is not relayed


def autoscaler_problems(lines: list[str]) -> list[tuple[int, str]]:
    """The lines of an autoscaler batch worth a person's attention, with their level:
    its warnings and errors (a status dump, node counts and "Adding node" events are
    not). Autoscaler v2 sends JSON events (severity, message); v1 the monitor's log."""
    kept: list[tuple[int, str]] = []
    for line in lines:
        line = line.rstrip("\n")
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if isinstance(event, dict) and "message" in event:
            level = logging.getLevelName(str(event.get("severity", "INFO")).upper())
            if isinstance(level, int) and level >= logging.WARNING and event["message"]:
                kept.append((level, str(event["message"])))
            continue
        fmt = _RAY_LOG_LINE.match(line)
        if EVENT_SUMMARY in line:
            text = line.split(EVENT_SUMMARY, 1)[1].strip()
        else:
            text = line[fmt.end():].strip() if fmt else line.strip()
        level = logging.getLevelName(fmt.group(1)) if fmt else logging.INFO
        # An event's own words count as well as its line's level: Ray logs "Warning: a
        # resource request cannot be scheduled" as an INFO event summary.
        if (not fmt or EVENT_SUMMARY in line) and _PROBLEM.search(text):
            level = max(level, logging.ERROR if _ERROR.search(text) else logging.WARNING)
        if level >= logging.WARNING and text:
            kept.append((level, text))
    return kept


def is_library_chatter(line: str) -> bool:
    """A line in Ray's log format below WARNING: a library talking, not the trainers."""
    fmt = _RAY_LOG_LINE.match(line)
    return bool(fmt) and logging.getLevelName(fmt.group(1)) < QUIET_BELOW


def _worker_fields(batch: dict[str, Any]) -> dict[str, Any]:
    fields = {"worker_pid": batch.get("pid"), "node_ip": batch.get("ip")}
    for key in ("actor_name", "task_name"):
        if batch.get(key):
            fields[key] = batch[key]
    return fields


def last_redraw(line: str) -> str:
    """What a terminal shows of a line redrawn with carriage returns (a progress bar):
    its last non-empty part."""
    parts = [part for part in line.split("\r") if part.strip()]
    return parts[-1] if parts else ""


def is_progress_bar(line: str) -> bool:
    """A tqdm progress bar's line (after `last_redraw`)."""
    return bool(_PROGRESS_BAR.search(line))


def _relay_line(line: str, is_err: bool, fields: dict[str, Any]) -> None:
    line = last_redraw(line)
    if not line:
        return
    if is_progress_bar(line):
        worker_log.info(line, extra=fields)
        return
    try:
        doc = json.loads(line)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and "msg" in doc and "level" in doc:
        level = logging.getLevelName(str(doc["level"]).upper())
        name = str(doc.get("logger", "ray.worker"))
        if is_library_logger(name) and isinstance(level, int) and level < QUIET_BELOW:
            return
        logger = logging.getLogger(name)
        extra = {k: v for k, v in doc.items()
                 if k not in ("ts", "level", "service", "logger", "msg")}
        record = logger.makeRecord(logger.name, level if isinstance(level, int) else 20,
                                   "(ray worker)", 0, str(doc["msg"]), (), None,
                                   extra={**extra, **fields})
        if isinstance(doc.get("ts"), (int, float)):
            record.created = float(doc["ts"])
        logger.handle(record)
        return
    if is_library_chatter(line):
        return
    worker_log.log(logging.WARNING if is_err else logging.INFO, line, extra=fields)


def relay_batch(batch: dict[str, Any]) -> None:
    """One batch of a worker's output lines (Ray's dict: pid, ip, is_err, lines, ...)."""
    fields = _worker_fields(batch)
    if batch.get("pid") == AUTOSCALER:
        for level, text in autoscaler_problems(list(batch.get("lines") or ())):
            logging.getLogger("ray.autoscaler").log(level, text, extra=fields)
        return
    for line in batch.get("lines") or ():
        if line.strip():
            _relay_line(line.rstrip("\n"), bool(batch.get("is_err")), fields)


def relay_worker_output() -> bool:
    """After ray.init(log_to_driver=True): worker output as JSON lines. False if Ray's
    printer could not be replaced (it then prints as before)."""
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        log.warning("cannot relay Ray worker output as JSON lines (Ray moved its printer)")
        return False
    if not any(name == RAY_PRINTER for name, _ in getattr(dispatcher, "handlers", [])):
        log.warning("cannot relay Ray worker output as JSON lines (no printer to replace)")
        return False
    dispatcher.remove_handler(RAY_PRINTER)
    dispatcher.remove_handler(RELAY)  # once, whatever the calls
    dispatcher.add_handler(RELAY, relay_batch)
    return True
