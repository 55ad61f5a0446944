"""`rlfleet conformance --target HOST:PORT`."""

from __future__ import annotations

import argparse
import json

from rlfleet.config import read_secret


def _run(args: argparse.Namespace) -> int:
    from rlfleet.conformance.checks import run_checks

    results = run_checks(args.target, token=read_secret("RLFLEET_AUTH_TOKEN"))
    if args.json:
        print(json.dumps([r.__dict__ for r in results], indent=2))
    else:
        width = max(len(r.name) for r in results)
        for r in results:
            print(f"{r.name:<{width}}  {r.outcome.upper():<4}  {r.detail}")
    failed = [r for r in results if r.outcome == "fail"]
    passed = sum(r.outcome == "pass" for r in results)
    print(f"{passed} passed, {len(failed)} failed, {len(results) - passed - len(failed)} skipped")
    return 1 if failed or not passed else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("conformance", help="check an env/reward service against the contracts")
    p.add_argument("--target", required=True, help="HOST:PORT of the service")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    p.set_defaults(func=_run)
