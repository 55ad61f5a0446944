"""`rlfleet ckptsync serve`: the checkpoint-sync service."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlfleet.config import ConfigError
from rlfleet.service import add_common_args, serve_forever, settings_or_exit


def _serve(args: argparse.Namespace) -> int:
    from rlfleet_ckptsync.server import SyncSettings, make_server

    settings = settings_or_exit(SyncSettings, args, "ckptsync")
    try:
        server, reconciler = make_server(settings)
    except ConfigError as exc:
        raise SystemExit(f"rlfleet ckptsync: {exc}") from None
    try:
        reconciler.tick()  # rebuild from /shared before answering anyone
    except Exception as exc:  # noqa: BLE001 - Redis may come later; the loop retries
        print(f"ckptsync: initial rebuild failed ({exc!r}); retrying in the background")
    reconciler.start()
    return serve_forever(server, "ckptsync", on_stop=reconciler.stop)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ckptsync", help="the checkpoint-sync service")
    p_sub = p.add_subparsers(dest="subcommand", required=True)
    serve = p_sub.add_parser("serve", help="publish adapter versions, track replicas")
    add_common_args(serve, port=50053, metrics_port=9103)
    serve.add_argument("--redis-url", default=None)
    serve.add_argument("--runs-root", type=Path, default=None)
    serve.add_argument("--keep-last", type=int, default=None)
    serve.add_argument("--gc-delay-s", type=float, default=None,
                       help="collect old versions at the latest this long after a publish "
                            "(default 10; sooner once every replica serves it)")
    serve.set_defaults(func=_serve)
