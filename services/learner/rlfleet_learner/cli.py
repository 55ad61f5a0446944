"""`rlfleet learner run`: the learner as a Ray job (local Ray by default, RAY_ADDRESS or
`ray.address` for a cluster such as KubeRay)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from rlfleet.cliargs import LOG_LEVELS, add_learner_args

# Registering `rlfleet learner` imports no more than this; yaml, pydantic, ray and torch
# are imported by the functions that use them.
log = logging.getLogger(__name__)


def _run(args: argparse.Namespace) -> int:
    import ray
    from prometheus_client import start_http_server

    from rlfleet.clients.rollout_pool import InsufficientCapacity
    from rlfleet.config import ConfigError
    from rlfleet.evaluation.solvable import config_turn_caps
    from rlfleet.learner_config import flag_overrides, load_learner_config
    from rlfleet.logs import human_console
    from rlfleet.policy.loading import ModelLoadError
    from rlfleet.storage import PathOutsideRunsRoot
    from rlfleet.storage.checkpoints import CheckpointError
    from rlfleet_learner.console import learner_log_file, setup_learner_logging
    from rlfleet_learner.faults import EXIT_FLEET_FAILURE, FleetFailure
    from rlfleet_learner.identity import ResumeRefused
    from rlfleet_learner.lease import EXIT_RUN_HELD, LeaseHeld, LeaseLost, hold_run
    from rlfleet_learner.loop import FreshStartRefused, Learner, NoCheckpoint
    from rlfleet_learner.ray_logs import relay_worker_output
    from rlfleet_learner.ray_start import init_local_ray

    try:
        cfg = load_learner_config(args.config, os.environ, **flag_overrides(args))
        config_turn_caps(cfg)  # an eval set the limit cannot solve: refused before Ray
        human = human_console()  # RLFLEET_CONSOLE, else whether stderr is a terminal
    except (ConfigError, ValueError) as exc:
        print(f"rlfleet learner: {exc}", file=sys.stderr)
        return 2
    try:  # one learner per run, resuming what it trained: before Ray and any write
        lease = hold_run(cfg, args.resume)
    except LeaseHeld as exc:
        print(f"rlfleet learner: {exc}", file=sys.stderr)
        return EXIT_RUN_HELD
    except (ResumeRefused, CheckpointError, PathOutsideRunsRoot, ModelLoadError,
            ValueError, OSError) as exc:
        print(f"rlfleet learner: {exc}", file=sys.stderr)
        return 2
    # A person at the console reads short lines; the JSON lines go to the run's log file.
    log_file = learner_log_file(cfg.fleet.runs_root, cfg.run) if human else None
    if setup_learner_logging(args.log_level, human, log_file):
        log.info(f"rlfleet learner: run {cfg.run}; the JSON log is in {log_file}")
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        log.warning("signal received: finishing or abandoning this step, then "
                    "checkpointing and stopping", extra={"signal": signal.Signals(signum).name})
        received.append(signum)
        stop.set()

    def install_handlers() -> None:
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    install_handlers()  # already while Ray starts
    if cfg.metrics.port is not None:
        start_http_server(cfg.metrics.port, addr=cfg.metrics.host)
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        # address="local": a Ray of its own, even where another Ray runs on this machine
        # (ray.init() alone would join the newest one it finds).
        init_local_ray(num_cpus=max(2, cfg.ray.num_workers), include_dashboard=False,
                       object_store_memory=cfg.ray.object_store_mb * 1024 * 1024,
                       log_to_driver=True, configure_logging=False)
    # ray.init puts its own SIGTERM handler in place (it kills the driver at once, with
    # the trainers' state unsaved and Ray's agents orphaned): ours goes back on top; and
    # may configure Ray's loggers: they go back to the JSON lines.
    install_handlers()
    setup_learner_logging(args.log_level, human, log_file)
    relay_worker_output()  # the trainers' output: JSON lines, not Ray's prefixed text
    try:
        learner = Learner(cfg, resume=args.resume, stop=stop, lease=lease)
        summary = learner.run()
    except (NoCheckpoint, PathOutsideRunsRoot, InsufficientCapacity, ConfigError,
            ModelLoadError, FreshStartRefused, CheckpointError, ResumeRefused) as exc:
        log.error("rlfleet learner: %s", exc, extra={"error": type(exc).__name__})
        return 2
    except FleetFailure as exc:  # the trained steps are checkpointed (Learner.run)
        log.error("rlfleet learner: stopped: %s; rerun with --resume auto once the fleet is "
                  "back", exc, extra={"error": type(exc).__name__})
        return EXIT_FLEET_FAILURE
    except LeaseLost as exc:  # fenced off: nothing more was written
        log.error("rlfleet learner: stopped: %s", exc, extra={"error": type(exc).__name__})
        return EXIT_RUN_HELD
    finally:
        ray.shutdown()
        lease.release()
    if args.summary:
        Path(args.summary).write_text(json.dumps(summary, indent=2))
    if not summary.get("stopped"):
        return 0
    # stopped cleanly by a signal: the shell's code for it (143 for SIGTERM, 130 for ^C)
    return 128 + (received[0] if received else signal.SIGTERM)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("learner", help="the GRPO learner (a Ray job)")
    p_sub = p.add_subparsers(dest="subcommand", required=True)
    run = p_sub.add_parser("run", help="train")
    run.add_argument("--resume", default="none",
                     help="none (fresh; refused over a run that has checkpoints), latest "
                          "(newest intact checkpoint; error if none), auto (latest if any, "
                          "else fresh: what a deployment uses), or a checkpoint path under "
                          "the runs root")
    add_learner_args(run)
    run.add_argument("--summary", default=None, metavar="FILE",
                     help="write the final summary JSON here (default: none)")
    run.add_argument("--log-level", default="INFO", type=str.upper,
                     choices=LOG_LEVELS,
                     help="log level (INFO: a JSON line per step and eval, and every ~10 s "
                          "of a wait for replicas or rollouts)")
    run.set_defaults(func=_run)
    from rlfleet_learner.submit import register_remote_commands  # submit/logs/status/stop
    register_remote_commands(p_sub)
