"""`rlfleet conformance --target HOST:PORT`."""

from __future__ import annotations

import argparse
import json
import sys

from rlfleet.cliargs import address, positive_float


def _run(args: argparse.Namespace) -> int:
    from rlfleet.config import read_secret
    from rlfleet.conformance.checks import Unreachable, run_checks
    from rlfleet.rpc.tls import client_options_from_env

    try:
        # TLS from RLFLEET_TLS_* as every rlfleet command that calls the fleet
        results = run_checks(args.target, token=read_secret("RLFLEET_AUTH_TOKEN"),
                             timeout_s=args.timeout, tls=client_options_from_env())
    except Unreachable as exc:
        print(f"rlfleet conformance: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([r.__dict__ for r in results], indent=2))
    else:
        width = max(len(r.name) for r in results)
        for r in results:
            print(f"{r.name:<{width}}  {r.outcome.upper():<4}  {r.detail}")
    failed = [r for r in results if r.outcome == "fail"]
    passed = sum(r.outcome == "pass" for r in results)
    # With --json, stdout is the JSON document alone (for tools); the summary goes to stderr.
    print(f"{passed} passed, {len(failed)} failed, {len(results) - passed - len(failed)} skipped",
          file=sys.stderr if args.json else sys.stdout)
    return 1 if failed or not passed else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "conformance", help="check an env/reward service against the contracts",
        description="Runs the core checks (any implementation) and the task checks of the "
                    "rlfleet tasks the service lists. Exit 0: all passed; 1: a check failed; "
                    "2: nothing answers at the target.")
    p.add_argument("--target", required=True, type=address, help="HOST:PORT of the service")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    p.add_argument("--timeout", type=positive_float, default=10.0, metavar="SECONDS",
                   help="deadline of each one-episode call (default 10); a call of a whole "
                        "batch gets 6 times it: raise it for a busy or distant service")
    p.set_defaults(func=_run)
