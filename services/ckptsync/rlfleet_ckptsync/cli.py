"""`rlfleet ckptsync serve`: the checkpoint-sync service."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from rlfleet.cliargs import add_common_args, add_setting

# named, not imported: registering the command must not import pydantic or grpc
SETTINGS = "rlfleet_ckptsync.settings:SyncSettings"


def _serve(args: argparse.Namespace) -> int:
    from rlfleet.config import ConfigError
    from rlfleet.service import serve_forever, settings_or_exit
    from rlfleet_ckptsync.server import make_server
    from rlfleet_ckptsync.settings import SyncSettings

    settings = settings_or_exit(SyncSettings, args, "ckptsync")
    try:
        server, reconciler = make_server(settings)
    except ConfigError as exc:
        raise SystemExit(f"rlfleet ckptsync: {exc}") from None
    try:
        reconciler.tick()  # rebuild from /shared before answering anyone
    except Exception as exc:  # noqa: BLE001 - Redis may come later; the loop retries
        logging.getLogger(__name__).warning(
            "initial rebuild from /shared failed; retrying in the background",
            extra={"error": repr(exc)})
    reconciler.start()
    return serve_forever(server, "ckptsync", on_stop=reconciler.stop)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ckptsync", help="the checkpoint-sync service")
    p_sub = p.add_subparsers(dest="subcommand", required=True)
    serve = p_sub.add_parser("serve", help="publish adapter versions, track replicas")
    add_common_args(serve, SETTINGS)
    # every flag's help is its settings field's description (SyncSettings)
    add_setting(serve, "--redis-url", SETTINGS, metavar="URL")
    add_setting(serve, "--runs-root", SETTINGS, type=Path, metavar="DIR")
    add_setting(serve, "--keep-last", SETTINGS, type=int, metavar="N")
    add_setting(serve, "--gc-delay-s", SETTINGS, type=float, metavar="SECONDS")
    serve.set_defaults(func=_serve)
