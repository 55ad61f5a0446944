"""`rlfleet env serve`: the env and/or reward service."""

from __future__ import annotations

import argparse

from rlfleet.cliargs import add_common_args, add_setting, field_choices

# named, not imported: registering the command must not import pydantic or grpc
SETTINGS = "rlfleet_env.settings:EnvSettings"


def _serve(args: argparse.Namespace) -> int:
    from rlfleet.service import serve_forever, settings_or_exit
    from rlfleet_env.server import banner, make_server
    from rlfleet_env.settings import EnvSettings

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
                    "--skyrl-env; reward functions from rlfleet (task, format+task, progress, "
                    "novelty) and from `rlfleet.rewards` entry points.")
    add_common_args(serve, SETTINGS)
    # every flag's help is its settings field's description (EnvSettings)
    add_setting(serve, "--role", SETTINGS, choices=field_choices(SETTINGS, "role"))
    add_setting(serve, "--reward", SETTINGS)
    add_setting(serve, "--tasks", SETTINGS, metavar="NAME[,NAME...]")
    add_setting(serve, "--skyrl-env", SETTINGS, action="append", metavar="ENV_ID[=DATA]")
    add_setting(serve, "--max-episodes", SETTINGS, type=int, metavar="N")
    add_setting(serve, "--episode-ttl-s", SETTINGS, type=float, metavar="SECONDS")
    serve.set_defaults(func=_serve)
