"""`rlfleet env serve`: the env/reward service."""

from __future__ import annotations

import argparse

from rlfleet.config import ConfigError
from rlfleet.logs import setup_logging
from rlfleet.service import add_common_args, load_settings
from rlfleet_env.rewards import REWARDS


def _serve(args: argparse.Namespace) -> int:
    from rlfleet_env.server import EnvSettings, make_server

    try:
        settings = load_settings(EnvSettings, args)
    except ConfigError as exc:
        raise SystemExit(f"rlfleet env serve: {exc}") from None
    setup_logging("env", settings.log_level)
    server, table = make_server(settings)
    server.install_signal_handlers(on_stop=table.close)
    server.start()
    print(f"env service ({settings.reward}) listening on {server.address}", flush=True)
    server.wait()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    env = sub.add_parser("env", help="the env/reward service")
    env_sub = env.add_subparsers(dest="subcommand", required=True)
    serve = env_sub.add_parser("serve", help="serve the maze env and a reward function")
    add_common_args(serve, port=50051, metrics_port=9101)
    serve.add_argument("--reward", choices=sorted(REWARDS), default=None,
                       help="reward function (default: task)")
    serve.add_argument("--max-episodes", type=int, default=None)
    serve.add_argument("--episode-ttl-s", type=float, default=None)
    serve.add_argument("--role", choices=["env+reward", "env", "reward"], default=None)
    serve.set_defaults(func=_serve)
