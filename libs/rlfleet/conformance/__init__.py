"""A conformance kit for env and reward services: any implementation of the contracts,
ours or a third party's, can be checked with `rlfleet conformance --target HOST:PORT`."""

from rlfleet.conformance.checks import CheckResult, run_checks

__all__ = ["CheckResult", "run_checks"]
