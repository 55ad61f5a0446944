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

from rlfleet.config import ConfigError, load_config
from rlfleet.logs import setup_logging

log = logging.getLogger(__name__)


def _run(args: argparse.Namespace) -> int:
    import ray
    from prometheus_client import start_http_server

    from rlfleet_learner.config import LearnerConfig
    from rlfleet_learner.loop import Learner, NoCheckpoint

    overrides = {k: v for k, v in {"steps": args.steps, "run": args.run}.items()
                 if v is not None}
    try:
        cfg = load_config(LearnerConfig, args.config, overrides=overrides, env={})
    except ConfigError as exc:
        print(f"rlfleet learner: {exc}", file=sys.stderr)
        return 2
    setup_logging("learner", args.log_level)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        print(f"learner: {signal.Signals(signum).name}, stopping after this step", flush=True)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.metrics_port is not None:
        start_http_server(args.metrics_port, addr=args.metrics_host)
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        ray.init(num_cpus=max(2, cfg.ray.num_workers), include_dashboard=False,
                 object_store_memory=cfg.ray.object_store_mb * 1024 * 1024,
                 log_to_driver=True, configure_logging=False)
    try:
        learner = Learner(cfg, resume=args.resume, stop=stop)
        summary = learner.run()
    except NoCheckpoint as exc:
        print(f"rlfleet learner: {exc}", file=sys.stderr)
        return 2
    finally:
        ray.shutdown()
    if args.summary:
        Path(args.summary).write_text(json.dumps(summary, indent=2))
    return 0 if not summary.get("stopped") else 130


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("learner", help="the GRPO learner (a Ray job)")
    p_sub = p.add_subparsers(dest="subcommand", required=True)
    run = p_sub.add_parser("run", help="train")
    run.add_argument("--config", required=True, help="learner YAML (see configs/)")
    run.add_argument("--resume", default="none",
                     help="none (fresh), latest (newest complete checkpoint; error if none), "
                          "auto (latest if any, else fresh), or a checkpoint path under the "
                          "runs root")
    run.add_argument("--steps", type=int, default=None)
    run.add_argument("--run", default=None, help="run name (overrides the config)")
    run.add_argument("--metrics-port", type=int, default=None)
    run.add_argument("--metrics-host", default="127.0.0.1")
    run.add_argument("--summary", default=None, help="write the final summary JSON here")
    run.add_argument("--log-level", default="WARNING")
    run.set_defaults(func=_run)
