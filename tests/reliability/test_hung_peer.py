"""Fault 7: a hung peer (SIGSTOP: the process holds its sockets open and never answers).

- A hung env service: the replica's env calls hit their deadline (env_timeout_s), the group
  fails with UNAVAILABLE in bounded time, the pool retries it on a replica whose env is
  healthy, and the stuck replica still answers GetStatus. After SIGCONT it works again.
- A hung rollout replica mid-stream (static addresses: no heartbeat to expire): the pool's
  per-message idle timeout fires (no trajectory for `idle_timeout_s`; the stream deadline
  stays at its 1800 s default) and the group is re-sent to the other replica; every index
  arrives exactly once. With a fleet store, the heartbeat's expiry moves the groups sooner
  (test_hung_replica.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from rlfleet.clients.rollout_pool import RolloutPool
from rlfleet.local.procs import Proc
from tests.reliability.conftest import (
    Fleet,
    assert_exactly_once,
    group,
    metric_total,
    stream_code,
    wait_until,
)
from tests.waits import hang_process_group

ENV_TIMEOUT_S = 2.0
IDLE_TIMEOUT_S = 8.0  # longer than a trajectory of these groups takes (a few seconds)


@contextlib.contextmanager
def stopped(proc: Proc) -> Iterator[None]:
    hang_process_group(proc.popen.pid)
    try:
        yield
    finally:
        os.killpg(proc.popen.pid, signal.SIGCONT)


@pytest.mark.slow
def test_hung_env_and_hung_replica_deadlines_fire_and_work_moves(fleet: Fleet) -> None:
    env_a = fleet.start_env("env-a")
    env_b = fleet.start_env("env-b")
    timeout = {"RLFLEET_ENV_TIMEOUT_S": str(ENV_TIMEOUT_S)}
    ra, rb = fleet.start_replicas(["ra", "rb"], env=timeout, fleet_store=False, env_addresses={
        "ra": env_a.address or "", "rb": env_b.address or ""})
    retries_before = metric_total("rlfleet_pool_group_retries")

    # -- a hung env service ------------------------------------------------------------
    pool = RolloutPool(addresses=[ra.address, rb.address], run=fleet.run,
                       stream_timeout_s=60)
    requests = [group(seed=1_000_700 + i, g=2, turns=6) for i in range(6)]
    results: list = []
    runner = threading.Thread(target=lambda: results.extend(
        pool.run_groups(requests, max_in_flight=4)))
    runner.start()
    wait_until("replica ra mid-group", lambda: fleet.status(ra).active_groups, timeout_s=60,
               period_s=0.05)
    with stopped(env_a):
        start = time.monotonic()
        code, _, details = stream_code(ra.address, group(seed=1_000_790))
        direct_s = time.monotonic() - start
        assert code == grpc.StatusCode.UNAVAILABLE, details
        assert "DEADLINE_EXCEEDED" in details
        assert fleet.status(ra).replica_id == "ra"  # the replica itself is not wedged
        runner.join(240)
        assert not runner.is_alive()
    assert assert_exactly_once(requests, results) == 12
    env_retries = metric_total("rlfleet_pool_group_retries") - retries_before
    assert env_retries >= 1
    code, got, _ = stream_code(ra.address, group(seed=1_000_791))  # SIGCONT: works again
    assert code == grpc.StatusCode.OK and len(got) == 2

    # -- a hung rollout replica mid-stream -----------------------------------------------
    pool = RolloutPool(addresses=[ra.address, rb.address], run=fleet.run,
                       idle_timeout_s=IDLE_TIMEOUT_S)
    requests = [group(seed=1_000_720 + i, g=2, turns=4) for i in range(4)]
    results = []
    runner = threading.Thread(target=lambda: results.extend(
        pool.run_groups(requests, max_in_flight=4)))
    runner.start()
    wait_until("replica rb mid-group", lambda: fleet.status(rb).active_groups, timeout_s=60,
               period_s=0.02)
    before = metric_total("rlfleet_pool_group_retries")
    with stopped(rb):
        runner.join(120)
        assert not runner.is_alive()
    assert assert_exactly_once(requests, results) == 8
    assert metric_total("rlfleet_pool_group_retries") > before
    assert pool.cancelled.get("idle", 0) >= 1  # the idle timeout, not the stream deadline
    assert ra.alive and rb.alive and env_a.alive
    print(f"hung env: direct group UNAVAILABLE after {direct_s:.1f}s, {env_retries:.0f} "
          f"pool retries; hung replica: "
          f"{metric_total('rlfleet_pool_group_retries') - before:.0f} retries, "
          f"streams cancelled {pool.cancelled}")
    pool.close()
