"""`rlfleet env serve`: the env and/or reward service."""

from __future__ import annotations

import argparse

from rlfleet.service import add_common_args, serve_forever, settings_or_exit


def _serve(args: argparse.Namespace) -> int:
    from rlfleet_env.server import EnvSettings, banner, make_server

    settings = settings_or_exit(EnvSettings, args, "env")
    server, table = make_server(settings)
    return serve_forever(server, banner(settings), on_stop=table.close)


def register(sub: argparse._SubParsersAction) -> None:
    env = sub.add_parser("env", help="the env/reward service")
    env_sub = env.add_subparsers(dest="subcommand", required=True)
    serve = env_sub.add_parser(
        "serve", help="serve env tasks (the maze, plugins, SkyRL envs) and/or a reward function",
        description="Serve the env contract (episodes of every registered task), the reward "
                    "contract (one reward function), or both (--role). Tasks come from rlfleet "
                    "(maze_2d, maze_2d_hard), from `rlfleet.tasks` entry points and from "
                    "--skyrl-env; reward functions from rlfleet (task, format+task) and from "
                    "`rlfleet.rewards` entry points.")
    add_common_args(serve, port=50051, metrics_port=9101)
    serve.add_argument("--role", choices=["env+reward", "env", "reward"], default=None,
                       help="which contracts to serve (default env+reward: both on one "
                            "port; run env and reward apart to change one without the "
                            "other, and point replicas at both with --env-address and "
                            "--reward-address)")
    serve.add_argument("--reward", default=None,
                       help="reward function: task (default), format+task, or the name of "
                            "an `rlfleet.rewards` entry point")
    serve.add_argument("--tasks", default=None,
                       help="comma-separated task names to serve (default: every task)")
    serve.add_argument("--skyrl-env", action="append", default=None, metavar="ENV_ID[=DATA]",
                       help="serve a registered skyrl-gym environment as task skyrl:ENV_ID; "
                            "DATA is a JSON-lines file of SkyRL dataset rows (prompt, "
                            "reward_spec, extra_info), row = seed mod rows (repeatable)")
    serve.add_argument("--max-episodes", type=int, default=None)
    serve.add_argument("--episode-ttl-s", type=float, default=None)
    serve.set_defaults(func=_serve)
