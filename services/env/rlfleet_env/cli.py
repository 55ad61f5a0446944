"""`rlfleet env serve`: the env/reward service."""

from __future__ import annotations

import argparse

from rlfleet.service import add_common_args, serve_forever, settings_or_exit
from rlfleet_env.rewards import REWARDS


def _serve(args: argparse.Namespace) -> int:
    from rlfleet_env.server import EnvSettings, make_server

    settings = settings_or_exit(EnvSettings, args, "env")
    server, table = make_server(settings)
    return serve_forever(server, f"env service ({settings.reward})", on_stop=table.close)


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
