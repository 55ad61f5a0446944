"""The `rlfleet` command. Built-in sub-commands live in the library (health, conformance,
scale, sft, eval); each service adds its own (`rlfleet env serve`, ...) through the
`rlfleet.commands` entry-point group, so the library never imports a service."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from rlfleet import __version__
from rlfleet.cliargs import Parser, address, positive_float

# Registering a command imports only argparse-level code; each command imports what it
# needs (grpc, torch, the kube client, ...) when it runs. `rlfleet health` is the pods'
# readiness probe (5 s budget): it skips even the entry points.
_LIBRARY_COMMANDS = (
    ("rlfleet.conformance.cli", "register"),
    ("rlfleet.sft.cli", "register"),
    ("rlfleet.evaluation.cli", "register"),
    ("rlfleet.policy.model_cli", "register"),
    ("rlfleet.kube.scale", "register_scale_command"),
)

# What a health status other than SERVING means, for the one line `rlfleet health` prints.
_HEALTH_MEANING = {
    "NOT_SERVING": "the server is up but not ready",
    "SERVICE_UNKNOWN": "the server has no such service",
    "NOT_FOUND": "the server has no such service",
    "UNAVAILABLE": "nothing answers there (no server listening, or not reachable)",
    "DEADLINE_EXCEEDED": "no answer within the timeout",
    "UNIMPLEMENTED": "the server has no gRPC health service",
    "UNAUTHENTICATED": "the server asks for credentials on health checks",
}


def _health(args: argparse.Namespace) -> int:
    from rlfleet.rpc.health import check
    from rlfleet.rpc.tls import client_options_from_env

    # Flags over RLFLEET_TLS_* (a pod's own certificate: the probes pass none).
    env = dict(os.environ)
    for flag, name in (("tls_ca", "RLFLEET_TLS_CA"), ("tls_cert", "RLFLEET_TLS_CERT"),
                       ("tls_key", "RLFLEET_TLS_KEY")):
        if getattr(args, flag):
            env[name] = getattr(args, flag)
    tls = client_options_from_env(env)
    if args.tls_server_name:
        if tls is None:
            print("rlfleet health: --tls-server-name needs a CA (--tls-ca or RLFLEET_TLS_CA "
                  "/ RLFLEET_TLS_CLIENT_CA)", file=sys.stderr)
            return 2
        tls["server_name"] = args.tls_server_name
    status = check(args.address, args.service, timeout_s=args.timeout, tls=tls)
    if status == "SERVING":
        print(status)
        return 0
    what = f"{args.address} ({args.service})" if args.service else args.address
    meaning = _HEALTH_MEANING.get(status, "not serving")
    print(f"rlfleet health: {what}: {status}: {meaning}", file=sys.stderr)
    return 1


def _add_health(sub: argparse._SubParsersAction) -> None:
    health = sub.add_parser(
        "health", help="exit 0 iff a gRPC service reports SERVING",
        description="Asks grpc.health.v1 at ADDRESS. Exit 0: SERVING (printed on stdout); "
                    "1: anything else (one line on stderr says what); 2: bad arguments.")
    health.add_argument("address", type=address, help="HOST:PORT of the server")
    health.add_argument("--service", default="",
                        help="service name to ask about ('' = the whole server)")
    health.add_argument("--timeout", type=positive_float, default=3.0, metavar="SECONDS",
                        help="how long to wait for the answer")
    health.add_argument("--tls-ca", metavar="FILE", help="check the server's certificate "
                        "with this CA (default RLFLEET_TLS_CA, else RLFLEET_TLS_CLIENT_CA; "
                        "none of them: plaintext)")
    health.add_argument("--tls-cert", metavar="FILE", help="client certificate, for a "
                        "server that asks for one (default RLFLEET_TLS_CERT)")
    health.add_argument("--tls-key", metavar="FILE", help="the key of --tls-cert (default "
                        "RLFLEET_TLS_KEY)")
    health.add_argument("--tls-server-name", metavar="NAME", help="the name the server's "
                        "certificate must carry (a probe calls 127.0.0.1; default: the "
                        "address's host)")
    health.set_defaults(func=_health)


def _add_all_commands(sub: argparse._SubParsersAction) -> None:
    from importlib.metadata import entry_points

    for module, name in _LIBRARY_COMMANDS:
        getattr(importlib.import_module(module), name)(sub)
    for ep in sorted(entry_points(group="rlfleet.commands"), key=lambda e: e.name):
        try:
            register = ep.load()
        except ImportError as exc:  # a service installed without its package's deps
            print(f"rlfleet: command '{ep.name}' unavailable: {exc}", file=sys.stderr)
            continue
        register(sub)


def build_parser(only_health: bool = False) -> argparse.ArgumentParser:
    """The `rlfleet` parser; `only_health`: just `rlfleet health` (the probes' fast path)."""
    parser = Parser(prog="rlfleet", description=__doc__)
    parser.add_argument("--version", action="version", version=f"rlfleet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_health(sub)
    if not only_health:
        _add_all_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(only_health=argv[:1] == ["health"]).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as exc:  # a command of a part this installation lacks
        print(f"rlfleet {args.command}: needs the Python package {exc.name!r}, which is not "
              "installed here (install the matching extra)", file=sys.stderr)
        return 1
    except OSError as exc:
        from rlfleet.rpc.server import BindError  # loaded already if one was raised

        if not isinstance(exc, BindError):
            raise
        print(f"rlfleet {args.command}: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        tls = sys.modules.get("rlfleet.rpc.tls")  # loaded already if its error was raised
        if tls is None or not isinstance(exc, tls.TlsFileError):
            raise
        print(f"rlfleet {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
