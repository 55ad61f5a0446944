"""A hung replica (SIGSTOP: its sockets stay open, nothing arrives, its
heartbeat stops) loses its groups to another replica once its heartbeat expires, not
after the pool's stream deadline (1800 s) or idle timeout (600 s): the pool's watchdog
cancels every stream to a replica whose heartbeat has expired, and the groups complete
on the other replica, each index exactly once. After SIGCONT the replica re-registers
and plays groups again.

The idle timeout (no trajectory for `idle_timeout_s`, the only check for static
addresses) is tested in test_hung_peer.py.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from rlfleet.clients.rollout_pool import RolloutPool
from rlfleet.fleet import ReplicaDirectory, connect
from tests.reliability.conftest import (
    Fleet,
    assert_exactly_once,
    group,
    metric_total,
    wait_until,
)
from tests.waits import hang_process_group

HEARTBEAT_TTL_S = 3.0  # what conftest's replicas advertise (--heartbeat-ttl-s 3)


@pytest.mark.slow
def test_stopped_replica_loses_its_groups_when_its_heartbeat_expires(fleet: Fleet) -> None:
    fleet.start_redis()
    fleet.start_env()
    ra, rb = fleet.start_replicas(["ra", "rb"])
    # the defaults: a stream deadline of 1800 s and an idle timeout of 600 s; only the
    # heartbeat's expiry can move the groups within this test's time
    pool = RolloutPool(redis_url=fleet.redis_url, run=fleet.run)
    assert (pool.stream_timeout_s, pool.idle_timeout_s) == (1800.0, 600.0)
    store = ReplicaDirectory(connect(fleet.redis_url))
    requests = [group(seed=1_001_100 + i, g=2, turns=4) for i in range(6)]
    results: list = []
    errors: list = []

    def run() -> None:
        try:
            results.extend(pool.run_groups(requests, max_in_flight=4))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    retries_before = metric_total("rlfleet_pool_group_retries")
    runner = threading.Thread(target=run)
    runner.start()
    wait_until("replica rb mid-group", lambda: fleet.status(rb).active_groups, timeout_s=120,
               period_s=0.02)
    hang_process_group(rb.popen.pid)
    stopped_at = time.monotonic()
    try:
        wait_until("rb's heartbeat to expire",
                   lambda: "rb" not in {r.replica_id for r in store.live()},
                   timeout_s=60, period_s=0.05)
        expired_s = time.monotonic() - stopped_at
        wait_until("the watchdog to cancel rb's streams",
                   lambda: pool.cancelled.get("heartbeat_expired", 0) >= 1, timeout_s=60,
                   period_s=0.05)
        moved_s = time.monotonic() - stopped_at
        runner.join(300)
        assert not runner.is_alive()
    finally:
        os.killpg(rb.popen.pid, signal.SIGCONT)
    assert not errors, errors
    trajectories = assert_exactly_once(requests, results)
    assert trajectories == 12
    assert pool.cancelled.get("idle", 0) == 0  # the heartbeat, not the idle timeout
    retries = metric_total("rlfleet_pool_group_retries") - retries_before
    assert retries >= 1
    played_by = {t.replica_id for _, ts in results for t in ts}
    assert "ra" in played_by

    # SIGCONT: rb heartbeats again and gets groups again
    wait_until("rb re-registered", lambda: "rb" in {r.replica_id for r in store.live()},
               timeout_s=60)
    again = [group(seed=1_001_120 + i, g=2, turns=2) for i in range(2)]
    later = RolloutPool(addresses=[rb.address or ""], run=fleet.run)
    assert_exactly_once(again, list(later.run_groups(again)))
    later.close()
    assert ra.alive and rb.alive
    print(f"hung replica: heartbeat expired {expired_s:.1f}s after SIGSTOP, its streams "
          f"cancelled {moved_s:.1f}s after (TTL {HEARTBEAT_TTL_S:g}s; 2x TTL = "
          f"{2 * HEARTBEAT_TTL_S:g}s); {len(results)} groups / {trajectories} trajectories "
          f"exactly once, {retries:.0f} retries, cancelled {pool.cancelled}")
    pool.close()
