"""The Ray workers' output in the learner's log, as JSON lines.

With `log_to_driver`, Ray prints every line its workers write to the driver's stdout or
stderr with a coloured "(TrainWorker pid=...)" prefix: plain text amid the learner's JSON
lines. `relay_worker_output` swaps Ray's printer for one that logs each line as a record
of the driver's JSON log (logger `ray.worker`, with the worker's pid, actor or task and
node); a line that is a JSON log record already (a worker that set up rlfleet.logs) keeps
its own fields, timestamp, level and logger.

Ray's printer is reached through `ray._private.ray_logging` (no public API swaps it); if
that moves in a later Ray, the learner keeps Ray's printer and says so once.
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger(__name__)
worker_log = logging.getLogger("ray.worker")

RAY_PRINTER = "ray_print_logs"  # the name ray.init gives its handler
RELAY = "rlfleet_json_lines"


def _worker_fields(batch: dict[str, Any]) -> dict[str, Any]:
    fields = {"worker_pid": batch.get("pid"), "node_ip": batch.get("ip")}
    for key in ("actor_name", "task_name"):
        if batch.get(key):
            fields[key] = batch[key]
    return fields


def _relay_line(line: str, is_err: bool, fields: dict[str, Any]) -> None:
    try:
        doc = json.loads(line)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and "msg" in doc and "level" in doc:
        level = logging.getLevelName(str(doc["level"]).upper())
        logger = logging.getLogger(str(doc.get("logger", "ray.worker")))
        extra = {k: v for k, v in doc.items()
                 if k not in ("ts", "level", "service", "logger", "msg")}
        record = logger.makeRecord(logger.name, level if isinstance(level, int) else 20,
                                   "(ray worker)", 0, str(doc["msg"]), (), None,
                                   extra={**extra, **fields})
        if isinstance(doc.get("ts"), (int, float)):
            record.created = float(doc["ts"])
        logger.handle(record)
        return
    worker_log.log(logging.WARNING if is_err else logging.INFO, line, extra=fields)


def relay_batch(batch: dict[str, Any]) -> None:
    """One batch of a worker's output lines (Ray's dict: pid, ip, is_err, lines, ...)."""
    fields = _worker_fields(batch)
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
