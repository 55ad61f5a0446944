"""A conformance kit for env and reward services: any implementation of the contracts,
ours or a third party's, can be checked with `rlfleet conformance --target HOST:PORT`.
Core checks hold for any task; task checks run for the rlfleet tasks a service lists."""

from rlfleet.conformance.checks import (
    Check,
    CheckResult,
    Unreachable,
    all_checks,
    checks_for,
    run_checks,
)

__all__ = ["Check", "CheckResult", "Unreachable", "all_checks", "checks_for", "run_checks"]
