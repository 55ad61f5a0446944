"""`rlfleet env serve`: the env and/or reward service."""

from __future__ import annotations

import argparse

from rlfleet.cliargs import add_common_args, add_setting, field_choices

# named, not imported: registering the command must not import pydantic or grpc
SETTINGS = "rlfleet_env.server:EnvSettings"


def _serve(args: argparse.Namespace) -> int:
    from rlfleet.service import serve_forever, settings_or_exit
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
    add_common_args(serve, SETTINGS)
    add_setting(serve, "--role", SETTINGS, choices=field_choices(SETTINGS, "role"),
                help="which contracts to serve (env+reward: both on one port; run env and "
                     "reward apart to change one without the other, and point replicas at "
                     "both with --env-address and --reward-address)")
    add_setting(serve, "--reward", SETTINGS,
                help="reward function: task, format+task, or the name of an "
                     "`rlfleet.rewards` entry point")
    add_setting(serve, "--tasks", SETTINGS, metavar="NAME[,NAME...]",
                help="task names to serve (default: [], every registered task)")
    add_setting(serve, "--skyrl-env", SETTINGS, action="append", metavar="ENV_ID[=DATA]",
                help="serve a registered skyrl-gym environment as task skyrl:ENV_ID; DATA is "
                     "a JSON-lines file of SkyRL dataset rows (prompt, reward_spec, "
                     "extra_info), row = seed mod rows (repeatable; default: none)")
    add_setting(serve, "--max-episodes", SETTINGS, type=int, metavar="N",
                help="episodes open at once")
    add_setting(serve, "--episode-ttl-s", SETTINGS, type=float, metavar="SECONDS",
                help="an idle episode is closed after this long")
    serve.set_defaults(func=_serve)
