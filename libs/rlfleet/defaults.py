"""Defaults every process agrees on, defined once: the services' ports, the runs root and
the local cache.

The services' settings, the learner's config and the CLI take them from here; the Helm
chart's templates take the same numbers from its `_helpers.tpl` (`rlfleet.port.*`), and
tests/unit/test_defaults.py checks that the two agree.
"""

from __future__ import annotations

import os
from pathlib import Path

# Where runs live: adapters, checkpoints, evals (the shared volume's runs folder).
RUNS_ROOT = Path("/shared/runs")


def cache_dir() -> Path:
    """This machine's cache of slow one-time builds (the tiny model, the vllm venv, the
    images): ``$RLFLEET_CACHE``, or ``~/.cache/rlfleet``."""
    return Path(os.environ.get("RLFLEET_CACHE", Path.home() / ".cache" / "rlfleet")).expanduser()


# gRPC. Env and reward services share a port: a pod runs one of them, and a reward
# service swapped in for another keeps the address replicas dial.
ENV_PORT = 50051
ROLLOUT_PORT = 50052
CKPTSYNC_PORT = 50053
# a stand-alone reward service of one's own (`rlfleet.reward.main`) on a developer's
# machine, beside an env service on ENV_PORT; in the chart it serves on ENV_PORT
REWARD_PORT = 50061

# Prometheus endpoints.
ENV_METRICS_PORT = 9101
ROLLOUT_METRICS_PORT = 9102
CKPTSYNC_METRICS_PORT = 9103
LEARNER_METRICS_PORT = 9104
REWARD_METRICS_PORT = 9111


def local_address(port: int) -> str:
    """The loopback address of a service on this machine."""
    return f"127.0.0.1:{port}"
