"""The learner's console for a person: a short line per step, a small table per eval,
waits, warnings and errors, while the JSON lines go to the run's log file.

Off a terminal (a pod's log, a pipe) nothing changes: JSON lines on stderr, the format
the cluster's log tooling reads. On one (or with RLFLEET_CONSOLE=human, which `make run`
sets when its own output is a terminal) `setup_learner_logging` sends the JSON lines to
<runs_root>/<run>/logs/learner.log and puts `ConsoleHandler` on stderr. A progress
record (`report_progress`) carries its human rendering in `_console`, which the JSON
formatter leaves out (a key with a leading underscore).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from rlfleet.logs import JsonFormatter, is_library_logger, setup_logging
from rlfleet.maze.difficulty import BANDS
from rlfleet.storage import PathOutsideRunsRoot, RunsRoot, validate_run_name

CONSOLE_ATTR = "_console"  # a record's human rendering: a callable returning the text
PHASES = ("rollout", "score", "update", "publish")
# the held-out set, then its bands of shortest-path length (rlfleet.maze.difficulty)
EVAL_SETS = ("eval", "heldout", *(f"heldout_{key}" for key, _, _, _ in BANDS), "heldout_curve")


def step_line(doc: Mapping[str, Any], steps: int | None = None) -> str:
    """One step as a person reads it: step, reward, sampled solve rate, turns, the
    phases' seconds and the adapter version the step published."""
    total = f"/{steps}" if steps else ""
    phases = " ".join(f"{p} {doc[f'{p}_s']:.1f}s" for p in PHASES if f"{p}_s" in doc)
    return (f"step {doc['step']:>3}{total}  reward {doc['reward_mean']:.3f}  "
            f"solved {100 * doc['solve_rate_sampled']:3.0f}%  "
            f"turns {doc['mean_turns']:.1f}  |  {phases}  |  adapter v{doc['version']}")


def eval_table(doc: Mapping[str, Any]) -> str:
    """An eval's sets (eval, held-out, the curve's subset) as a small table."""
    sets = [name for name in EVAL_SETS if isinstance(doc.get(name), Mapping)]
    head = (f"eval at step {doc['step']} (adapter v{doc['version']}, "
            f"{doc.get('seconds', 0.0):.1f}s)")
    lines = [head, f"  {'set':<20}{'mazes':>6}{'solved':>9}{'± se':>7}{'pass@1':>8}"
                   f"{'turns':>7}"]
    for name in sets:
        s = doc[name]
        lines.append(f"  {name:<20}{s.get('episodes', 0):>6}"
                     f"{100 * s.get('solve_rate', 0.0):>8.1f}%"
                     f"{100 * s.get('solve_rate_se', 0.0):>6.1f}%"
                     f"{100 * s.get('pass_at_1', 0.0):>7.1f}%"
                     f"{s.get('mean_turns', 0.0):>7.1f}")
    lines.append("  solved: stopped on the target (true solve); pass@1: reward > 0 (the "
                 "published seed run's metric)")
    lines.extend(f"  turn cap: {cap}" for cap in doc.get("turn_caps", ()))
    return "\n".join(lines)


class ConsoleHandler(logging.Handler):
    """Plain lines for a person: a progress record's rendering; the project's other INFO
    records (starting, resuming, waiting for replicas) as their message; every warning
    and error, the libraries' too, as "warning: ..."; library INFO chatter not at all."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        super().__init__(logging.INFO)
        self.stream = stream

    def render(self, record: logging.LogRecord) -> str | None:
        human = getattr(record, CONSOLE_ATTR, None)
        if human is not None:
            return human() if callable(human) else str(human)
        if record.levelno >= logging.WARNING:
            text = f"{record.levelname.lower()}: {record.getMessage()}"
            if record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
            return text
        if is_library_logger(record.name):
            return None
        return record.getMessage()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.render(record)
            if text is not None:
                stream = self.stream or sys.stderr
                stream.write(text + "\n")
                stream.flush()
        except Exception:  # noqa: BLE001 - logging's contract: report, never raise
            self.handleError(record)


def learner_log_file(runs_root: str | Path, run: str) -> Path | None:
    """Where a human console's learner writes its JSON lines: beside the run's other
    logs (`make run` keeps its services' logs in the same directory). The whole path
    goes through the runs root's containment check, so a `logs` directory (or a
    `learner.log`) that is a symlink out of the root is not followed. None for a run name
    or a path the runs root refuses (the JSON lines then stay on stderr)."""
    try:
        return RunsRoot(runs_root).resolve(f"{validate_run_name(run)}/logs/learner.log")
    except (PathOutsideRunsRoot, ValueError):
        return None


def setup_learner_logging(level: str, human: bool, log_file: Path | None) -> Path | None:
    """The learner's logging (again after ray.init, which configures its own): JSON
    lines on stderr, or with `human` a console for a person and the JSON lines in
    `log_file` (returned; None when they stay on stderr). Library loggers (Ray's above
    all: "Started a local Ray instance", its autoscaler) say only warnings and errors."""
    root = logging.getLogger()
    for old in root.handlers:  # a second set-up replaces the first one's file
        if isinstance(old, logging.FileHandler):
            old.close()
    setup_logging("learner", level)
    for name in ("ray", "filelock", "urllib3", "asyncio"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if not human or log_file is None:
        return None
    try:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        json_file = logging.FileHandler(log_file, encoding="utf-8")
    except OSError as exc:
        logging.getLogger(__name__).warning(
            "cannot write the JSON log to %s (%s): it stays on the console", log_file, exc)
        return None
    json_file.setFormatter(JsonFormatter("learner"))
    root.handlers[:] = [json_file, ConsoleHandler()]
    return log_file
