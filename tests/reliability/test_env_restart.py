"""Fault 5: the env/reward service SIGKILLed mid-group and restarted at the same address.
Episodes in flight are lost with it; the replica fails their group cleanly (UNAVAILABLE,
never UNKNOWN/INTERNAL) and the rollout pool retries the group, possibly after the env is
back, delivering every index exactly once."""

from __future__ import annotations

import os
import signal
import threading
import time

import grpc
import pytest

from rlfleet.clients.rollout_pool import RolloutPool
from tests.reliability.conftest import (
    Fleet,
    assert_exactly_once,
    group,
    metric_total,
    stream_code,
    wait_until,
)
from tests.waits import scaled


@pytest.mark.slow
def test_env_restarted_mid_group_groups_retried_exactly_once(fleet: Fleet) -> None:
    env = fleet.start_env()
    ra, rb = fleet.start_replicas(["ra", "rb"], fleet_store=False)
    pool = RolloutPool(addresses=[ra.address, rb.address], run=fleet.run,
                       stream_timeout_s=120)
    retries_before = metric_total("rlfleet_pool_group_retries")
    duplicates_before = metric_total("rlfleet_pool_duplicate_trajectories")

    # The env is frozen (SIGSTOP) before it is killed, so no episode can end in between:
    # a group still short of trajectories once the env is frozen is certainly cut off by
    # the kill. Episodes can end fast (a reply that says stop), so an attempt where the
    # direct group or replica rb had already finished is thawed, let run out, and redone.
    for attempt in range(5):
        direct: dict = {}  # one long group straight on replica ra, to see its status
        direct_got: list = []
        long_group = group(seed=1_000_500 + 100 * attempt, g=4, turns=40, max_new_tokens=4)
        direct_thread = threading.Thread(
            target=lambda d=direct, g=long_group, got=direct_got: d.update(
                result=stream_code(ra.address, g, got=got)))
        requests = [group(seed=1_000_510 + 100 * attempt + i, g=3, turns=8)
                    for i in range(8)]
        results: list = []
        pool_thread = threading.Thread(target=lambda out=results, r=requests: out.extend(
            pool.run_groups(r, max_in_flight=4)))
        direct_thread.start()
        pool_thread.start()
        wait_until("both replicas mid-group", lambda: all(
            fleet.status(p).active_groups for p in (ra, rb)), timeout_s=60, period_s=0.05)
        time.sleep(0.3)  # a few turns in
        os.killpg(env.popen.pid, signal.SIGSTOP)
        time.sleep(scaled(0.5))  # a trajectory already on its way lands
        if (direct_thread.is_alive() and len(direct_got) < long_group.group_size
                and fleet.status(rb).active_groups):
            break
        os.killpg(env.popen.pid, signal.SIGCONT)
        direct_thread.join(scaled(180))
        pool_thread.join(scaled(300))
    else:
        pytest.fail("in 5 attempts the env was never frozen with both replicas mid-group")
    fleet.procs.kill(env)  # SIGKILL: every open episode is gone
    time.sleep(1.0)
    fleet.start_env("env-2", env.extra["port"])  # back at the same address, empty

    direct_thread.join(scaled(180))
    pool_thread.join(scaled(300))
    assert not direct_thread.is_alive() and not pool_thread.is_alive()
    code, got, details = direct["result"]
    assert code == grpc.StatusCode.UNAVAILABLE, (code, details)
    assert len(got) < long_group.group_size  # it really was cut off
    assert assert_exactly_once(requests, results) == 24
    retries = metric_total("rlfleet_pool_group_retries") - retries_before
    assert retries >= 1  # groups were cut by the restart and re-sent
    dropped = metric_total("rlfleet_pool_duplicate_trajectories") - duplicates_before
    # both replicas survived and serve groups against the new env
    assert ra.alive and rb.alive
    for proc in (ra, rb):
        assert fleet.status(proc).active_groups == 0
    again = [group(seed=1_000_530 + i) for i in range(2)]
    assert_exactly_once(again, pool.run_groups(again))
    for proc in (ra, rb):
        log = proc.log_path.read_text()
        assert "Traceback" not in log and "unhandled error" not in log
    print(f"env restart: 8 groups, {retries:.0f} retried, {dropped:.0f} duplicate "
          f"trajectories dropped, direct group ended {code.name} after {len(got)}")
    pool.close()
