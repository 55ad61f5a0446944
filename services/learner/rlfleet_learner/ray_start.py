"""Starting a Ray of the learner's own on this machine.

Ray waits a fixed 30 s for its raylet to register with the GCS (`ray._private.node`, not
configurable). On a busy machine (a CI run beside other work, two CPU-bound processes on
two cores) that wait runs out although nothing is wrong, and `ray.init` raises "The
current node timed out during startup". That one failure is retried, a bounded number of
times, after `ray.shutdown()` has cleaned up the half-started node; any other error is
raised at once.

Ray also starts its worker processes at nice 15 (its `worker_niceness`), below the
driver. A learner's workers are its trainer ranks, the job itself: beside any other
CPU-bound process at the usual nice 0 they got a small share of the CPU (a two-rank GRPO
test took 450 s with two `yes` beside it, under 23 s without). They start at nice 0 here.
"""

from __future__ import annotations

import logging
from typing import Any

import ray

log = logging.getLogger(__name__)

# Ray's own settings (ray_config_def.h) for every Ray the learner's ranks run in: the
# trainer ranks are the job, not background work
SYSTEM_CONFIG: dict[str, Any] = {"worker_niceness": 0}

STARTUP_TIMEOUT = "timed out during startup"
# Ray warns on every start that token authentication is on: it is, by design (the
# learner's Ray is ours alone); a warning a user can do nothing about is noise
AUTH_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"


def init_local_ray(attempts: int = 4, **init_kwargs: Any) -> None:
    """`ray.init(address="local", **init_kwargs)`, retrying Ray's start-up time-out up to
    `attempts` times in all (30 s each, Ray's own wait)."""
    logging.getLogger(AUTH_NOTICE_LOGGER).setLevel(logging.ERROR)
    init_kwargs["_system_config"] = {**SYSTEM_CONFIG, **init_kwargs.get("_system_config", {})}
    for attempt in range(1, attempts + 1):
        try:
            ray.init(address="local", **init_kwargs)
            return
        except Exception as exc:  # Ray raises a bare Exception for this one
            if STARTUP_TIMEOUT not in str(exc) or attempt == attempts:
                raise
            log.warning("Ray did not start within its 30 s wait (a busy machine); retrying",
                        extra={"attempt": attempt, "attempts": attempts})
            ray.shutdown()
