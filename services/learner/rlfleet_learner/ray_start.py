"""Starting a Ray on this machine: the learner's own, and the test suite's.

Ray waits a fixed 30 s for its raylet to register with the GCS (`ray._private.node`, not
configurable). On a busy machine (a CI run beside other work, two CPU-bound processes on
two cores) that wait runs out although nothing is wrong, and the start raises "The
current node timed out during startup". That one failure is retried, a bounded number of
times; any other error is raised at once. A failed start leaves a half-started node behind
(its GCS server, raylet, dashboard, log monitor, autoscaler monitor: `ray.shutdown()`
knows nothing of a node whose start raised), so each attempt runs with a mark of its own
in the environment (ATTEMPT_ENV), which every process it starts inherits, and after a
failure the processes carrying it are killed, whatever the error.

Ray also starts its worker processes at nice 15 (its `worker_niceness`), below the
driver. A learner's workers are its trainer ranks, the job itself: beside any other
CPU-bound process at the usual nice 0 they got a small share of the CPU (a two-rank GRPO
test took 450 s with two `yes` beside it, under 23 s without). They start at nice 0 here.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import ray

from rlfleet.local.marks import kill_marked

log = logging.getLogger(__name__)
T = TypeVar("T")

# Ray's own settings (ray_config_def.h) for every Ray the learner's ranks run in: the
# trainer ranks are the job, not background work
SYSTEM_CONFIG: dict[str, Any] = {"worker_niceness": 0}

STARTUP_TIMEOUT = "timed out during startup"
ATTEMPT_ENV = "RLFLEET_RAY_START_ATTEMPT"
# Ray warns on every start that token authentication is on: it is, by design (the
# learner's Ray is ours alone); a warning a user can do nothing about is noise
AUTH_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"


def start_with_retry(start: Callable[[], T], attempts: int = 4) -> T:
    """`start()`, anything that starts Ray's processes on this machine (`ray.init`, a
    `ray.cluster_utils.Cluster`, `ray start`), retrying Ray's start-up time-out up to
    `attempts` times in all. After a failed attempt, `ray.shutdown()` and every process the
    attempt started is killed; `start` itself ends what it holds (a Cluster's nodes)."""
    for attempt in range(1, attempts + 1):
        mark = f"{os.getpid()}-{attempt}-{uuid.uuid4().hex[:8]}"
        before = os.environ.get(ATTEMPT_ENV)
        os.environ[ATTEMPT_ENV] = mark
        try:
            return start()
        except Exception as exc:  # Ray raises a bare Exception for its time-out
            ray.shutdown()
            left = kill_marked(ATTEMPT_ENV, mark)
            if STARTUP_TIMEOUT not in str(exc) or attempt == attempts:
                raise
            log.warning("Ray did not start within its 30 s wait (a busy machine); retrying",
                        extra={"attempt": attempt, "attempts": attempts,
                               "killed": len(left)})
        finally:
            if before is None:
                os.environ.pop(ATTEMPT_ENV, None)
            else:
                os.environ[ATTEMPT_ENV] = before
    raise AssertionError("unreachable: the last attempt returns or raises")


def init_local_ray(attempts: int = 4, **init_kwargs: Any) -> None:
    """`ray.init(address="local", **init_kwargs)`, retrying Ray's start-up time-out up to
    `attempts` times in all (30 s each, Ray's own wait)."""
    logging.getLogger(AUTH_NOTICE_LOGGER).setLevel(logging.ERROR)
    init_kwargs["_system_config"] = {**SYSTEM_CONFIG, **init_kwargs.get("_system_config", {})}
    start_with_retry(lambda: ray.init(address="local", **init_kwargs), attempts)
