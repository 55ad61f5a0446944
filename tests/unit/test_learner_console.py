"""What a person sees of the learner: Ray's chatter filtered out of the relayed worker
output, the step line and eval table rendered from the documents metrics.jsonl holds,
and the console mode (RLFLEET_CONSOLE or a terminal) deciding where JSON lines go."""

from __future__ import annotations

import io
import json
import logging
import sys
import threading

import pytest

from rlfleet.local.run import learner_console_env
from rlfleet.logs import CONSOLE_ENV, JsonFormatter, human_console
from rlfleet_learner.console import (
    ConsoleHandler,
    eval_table,
    learner_log_file,
    setup_learner_logging,
    step_line,
)
from rlfleet_learner.ray_logs import autoscaler_problems, relay_batch
from rlfleet_learner.reporting import report_progress
from rlfleet_learner.submit import JobLogPrinter, write_working_dir

STATUS_DUMP = [
    "======== Autoscaler status: 2026-12-02 05:00:00.000000 ========",
    "Node status",
    "---------------------------------------------------------------",
    "Active:",
    " 1 node_0123456789abcdef",
    "Pending:",
    " (no pending nodes)",
    "Recent failures:",
    " (no failures)",
    "Resources",
    "Usage:",
    " 2.0/2.0 CPU",
    " 0B/1.00GiB object_store_memory",
    "Demands:",
    " (no resource demands)",
    "2026-12-02 05:00:00,123\tINFO autoscaler.py:461 -- StandardAutoscaler: 1 nodes",
    "2026-12-02 05:00:00,124\tINFO monitor.py:120 -- :event_summary:Resized to 2 CPUs.",
]


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records():
    handler = Records()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    # ray and transformers, once imported (by another test of this process), stop their
    # loggers' records at their own roots (and a learner's set-up raises their levels);
    # rlfleet.logs.setup_logging makes them propagate in a learner: here, for the capture
    saved = []
    for name in ("ray", "transformers"):
        library = logging.getLogger(name)
        saved.append((library, library.propagate, library.level, library.disabled))
        library.propagate, library.disabled = True, False
        library.setLevel(logging.NOTSET)
    yield handler.records
    for library, propagate, level, disabled in saved:
        library.propagate, library.disabled = propagate, disabled
        library.setLevel(level)
    root.removeHandler(handler)
    root.setLevel(old_level)


def batch(lines: list[str], pid: object = 4242, is_err: bool = False) -> dict:
    return {"pid": pid, "ip": "10.0.0.1", "is_err": is_err, "lines": lines,
            "actor_name": "TrainWorker" if pid != "autoscaler" else ""}


def test_autoscaler_status_dumps_are_not_relayed(records):
    relay_batch(batch(STATUS_DUMP, pid="autoscaler"))
    assert records == []


def test_autoscaler_warnings_and_errors_are_relayed(records):
    relay_batch(batch(STATUS_DUMP + [
        "2026-12-02 05:00:01,000\tINFO monitor.py:120 -- :event_summary:Warning: The "
        "following resource request cannot be scheduled right now: {'CPU': 4.0}.",
        "2026-12-02 05:00:02,000\tERROR monitor.py:300 -- Monitor: Cleanup failed",
    ], pid="autoscaler"))
    assert [(r.levelno, r.name) for r in records] == [
        (logging.WARNING, "ray.autoscaler"), (logging.ERROR, "ray.autoscaler")]
    assert records[0].getMessage().startswith("Warning: The following resource request")
    assert records[1].getMessage() == "Monitor: Cleanup failed"


def test_autoscaler_v2_events_keep_only_warnings_and_errors():
    lines = [json.dumps({"severity": "INFO", "message": "Adding 1 node(s)"}),
             json.dumps({"severity": "ERROR", "message": "node launch failed"})]
    assert autoscaler_problems(lines) == [(logging.ERROR, "node launch failed")]


def test_worker_lines_keep_the_trainers_output_and_drop_library_info(records):
    relay_batch(batch([
        "2026-12-02 05:00:00,000\tINFO worker.py:1 -- Connecting to existing Ray cluster",
        "loaded 3 shards",
        json.dumps({"ts": 1.0, "level": "info", "logger": "ray.train", "msg": "chatter"}),
        json.dumps({"ts": 1.0, "level": "info", "logger": "rlfleet_learner.workers",
                    "msg": "rank 0 ready"}),
        json.dumps({"ts": 1.0, "level": "warning", "logger": "transformers.modeling",
                    "msg": "weights not used"}),
    ]))
    assert [r.getMessage() for r in records] == ["loaded 3 shards", "rank 0 ready",
                                                 "weights not used"]


def test_worker_errors_in_rays_format_are_kept(records):
    relay_batch(batch(["2026-12-02 05:00:00,000\tERROR worker.py:9 -- Task failed"],
                      is_err=True))
    assert [r.levelno for r in records] == [logging.WARNING]


def test_a_workers_progress_bar_is_its_last_redraw_at_info(records):
    bar = ("\rLoading weights:   0%|          | 0/86 [00:00<?, ?it/s]"
           "\rLoading weights: 100%|\u2588\u2588\u2588\u2588| 86/86 [00:00<00:00, 9.1it/s]")
    relay_batch(batch([bar, "\r"], is_err=True))
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.INFO, "Loading weights: 100%|\u2588\u2588\u2588\u2588| 86/86 "
                       "[00:00<00:00, 9.1it/s]")]
    assert "\r" not in records[0].getMessage()


def test_the_job_log_printer_leaves_out_rays_info_lines_across_chunks():
    out = io.StringIO()
    printer = JobLogPrinter(out)
    text = ("2026-12-07 20:00:46,197\tINFO job_manager.py:581 -- Runtime env is setting up.\n"
            "Running entrypoint for job raysubmit_1: rlfleet learner run\n"
            "step   1/2  reward 0.625\n"
            "2026-12-07 20:00:47,000\tWARNING worker.py:9 -- a worker died\n"
            "job ends without a newline")
    for i in range(0, len(text), 7):  # chunks that split lines anywhere
        printer.write(text[i:i + 7])
    printer.close()
    assert out.getvalue().splitlines() == [
        "Running entrypoint for job raysubmit_1: rlfleet learner run",
        "step   1/2  reward 0.625",
        "2026-12-07 20:00:47,000\tWARNING worker.py:9 -- a worker died",
        "job ends without a newline"]


def test_submit_puts_the_console_in_the_jobs_environment(tmp_path):
    env = write_working_dir(tmp_path, "run: r\n", None, 30, "human")["env_vars"]
    assert env[CONSOLE_ENV] == "human"
    unset = write_working_dir(tmp_path, "run: r\n", None, 30)["env_vars"]
    assert CONSOLE_ENV not in unset  # the cluster's own setting decides


STEP = {"event": "step", "step": 7, "version": 7, "reward_mean": 0.4123,
        "solve_rate_sampled": 0.375, "mean_turns": 4.25, "rollout_s": 3.14,
        "score_s": 0.2, "update_s": 2.05, "publish_s": 0.41, "step_s": 5.8,
        "seeds": [1, 2, 3], "signal_per_min": 120.0}


def test_step_line_reads_as_one_short_line():
    line = step_line(STEP, 20)
    assert "\n" not in line and len(line) < 120
    assert line.startswith("step   7/20")
    for part in ("reward 0.412", "solved  38%", "turns 4.2", "rollout 3.1s", "score 0.2s",
                 "update 2.0s", "publish 0.4s", "adapter v7"):
        assert part in line
    assert "{" not in line  # not JSON


def test_eval_table_has_a_row_per_set():
    summary = {"episodes": 20, "solve_rate": 0.45, "solve_rate_se": 0.111,
               "pass_at_1": 0.5, "mean_turns": 5.0}
    doc = {"event": "eval", "step": 0, "version": 0, "seconds": 12.34,
           "eval": summary, "heldout": {**summary, "episodes": 30, "solve_rate": 0.3}}
    lines = eval_table(doc).splitlines()
    assert lines[0] == "eval at step 0 (adapter v0, 12.3s)"
    assert lines[1].split() == ["set", "mazes", "solved", "±", "se", "pass@1", "turns"]
    assert lines[2].split() == ["eval", "20", "45.0%", "11.1%", "50.0%", "5.0"]
    assert lines[3].split() == ["heldout", "30", "30.0%", "11.1%", "50.0%", "5.0"]


def test_progress_is_json_in_the_log_and_human_on_the_console():
    json_out, console = io.StringIO(), io.StringIO()
    json_handler = logging.StreamHandler(json_out)
    json_handler.setFormatter(JsonFormatter("learner"))
    logger = logging.getLogger("rlfleet_learner")
    logger.addHandler(json_handler)
    logger.addHandler(ConsoleHandler(console))
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        report_progress("step", {**STEP, "steps": 20}, lambda: step_line(STEP, 20))
        logging.getLogger("ray.worker").info("Started a local Ray instance")
    finally:
        logger.handlers.clear()
        logger.setLevel(old)
    doc = json.loads(json_out.getvalue())
    assert doc["msg"] == "step" and doc["step"] == 7 and doc["reward_mean"] == 0.4123
    assert "_console" not in doc and "seeds" not in doc  # lists stay in metrics.jsonl
    assert console.getvalue() == step_line(STEP, 20) + "\n"


def test_console_shows_warnings_and_drops_library_info():
    handler = ConsoleHandler(io.StringIO())
    make = logging.getLogger("x").makeRecord
    assert handler.render(make("ray", logging.INFO, "f", 1, "Started Ray", (), None)) is None
    assert handler.render(make("rlfleet_learner", logging.INFO, "f", 1, "waiting", (),
                               None)) == "waiting"
    assert handler.render(make("ray", logging.WARNING, "f", 1, "disk full", (),
                               None)) == "warning: disk full"


@pytest.mark.parametrize(("env", "tty", "human"), [
    ({}, True, True), ({}, False, False),
    ({CONSOLE_ENV: "human"}, False, True), ({CONSOLE_ENV: "json"}, True, False)])
def test_console_mode(env, tty, human):
    class Stream(io.StringIO):
        def isatty(self) -> bool:
            return tty
    assert human_console(env, Stream()) is human
    assert learner_console_env(env, Stream()) == {CONSOLE_ENV: "human" if human else "json"}


def test_a_mistyped_console_mode_is_refused():
    with pytest.raises(ValueError, match="RLFLEET_CONSOLE"):
        human_console({CONSOLE_ENV: "pretty"}, io.StringIO())


def test_human_setup_sends_json_to_the_runs_log_file(tmp_path):
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    hooks = (sys.excepthook, threading.excepthook)
    try:
        log_file = learner_log_file(tmp_path, "run-a")
        assert log_file == tmp_path / "run-a" / "logs" / "learner.log"
        assert setup_learner_logging("INFO", True, log_file) == log_file
        logging.getLogger("rlfleet_learner").info("hello", extra={"step": 1})
        logging.getLogger("ray").info("Started a local Ray instance")
        for handler in root.handlers:
            handler.flush()
        docs = [json.loads(line) for line in log_file.read_text().splitlines()]
        assert [(d["msg"], d.get("step")) for d in docs] == [("hello", 1)]
        assert setup_learner_logging("INFO", False, None) is None  # off a terminal: stderr
        assert not any(isinstance(h, logging.FileHandler) for h in root.handlers)
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:], level = saved
        root.setLevel(level)
        logging.getLogger("ray").setLevel(logging.NOTSET)
        sys.excepthook, threading.excepthook = hooks  # set-up's process-wide changes
        logging.captureWarnings(False)
        logging.setLoggerClass(logging.Logger)
    assert learner_log_file(tmp_path, "../escape") is None


def test_the_start_line_says_whether_the_run_resumes():
    from rlfleet_learner.reporting import start_line

    assert start_line("tiny-maze", "auto", 15, "/shared/runs/tiny-maze/checkpoints/step_15") \
        == ("resuming run tiny-maze from step 15 "
            "(checkpoint /shared/runs/tiny-maze/checkpoints/step_15)")
    assert start_line("tiny-maze", "auto", None, None) == \
        "starting run tiny-maze from step 0 (no checkpoint yet)"
    assert start_line("r", "none", None, None) == "starting run r from step 0 (--resume none)"
