"""The `rlfleet` command. Built-in sub-commands live in the library (health, conformance,
scale); each service adds its own (`rlfleet env serve`, ...) through the
`rlfleet.commands` entry-point group, so the library never imports a service."""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import entry_points

from rlfleet import __version__


def _health(args: argparse.Namespace) -> int:
    from rlfleet.rpc.health import check

    status = check(args.address, args.service, timeout_s=args.timeout)
    print(status)
    return 0 if status == "SERVING" else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlfleet", description=__doc__)
    parser.add_argument("--version", action="version", version=f"rlfleet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    health = sub.add_parser("health", help="exit 0 iff a gRPC service reports SERVING")
    health.add_argument("address", help="HOST:PORT")
    health.add_argument("--service", default="", help="service name ('' = whole server)")
    health.add_argument("--timeout", type=float, default=3.0)
    health.set_defaults(func=_health)

    from rlfleet.conformance.cli import register as register_conformance

    register_conformance(sub)
    # Optional parts: slim images (env, ckpt-sync) have neither torch nor the kube client.
    for module, name in (("rlfleet.sft.cli", "register"),
                         ("rlfleet.kube.scale", "register_scale_command")):
        try:
            register = getattr(importlib.import_module(module), name)
        except ImportError:
            continue
        register(sub)

    for ep in sorted(entry_points(group="rlfleet.commands"), key=lambda e: e.name):
        try:
            register = ep.load()
        except ImportError as exc:
            print(f"rlfleet: command '{ep.name}' unavailable: {exc}", file=sys.stderr)
            continue
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
