"""A conformance kit for env and reward services: any implementation of the contracts,
ours or a third party's, can be checked with `rlfleet conformance --target HOST:PORT`.
Core checks hold for any task; task checks run for the rlfleet tasks a service lists."""

from rlfleet.lazy import lazy_exports

# each public name -> the submodule that defines it, imported on first use
_EXPORTS = {
    "Check": "rlfleet.conformance.checks",
    "CheckResult": "rlfleet.conformance.checks",
    "Unreachable": "rlfleet.conformance.checks",
    "all_checks": "rlfleet.conformance.checks",
    "checks_for": "rlfleet.conformance.checks",
    "run_checks": "rlfleet.conformance.checks",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
