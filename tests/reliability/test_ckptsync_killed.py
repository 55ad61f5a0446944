"""Fault 3: ckpt-sync SIGKILLed. Replicas keep serving the last adapter (groups complete
with it, heartbeats go on); a restarted ckpt-sync rebuilds from /shared (a version the
learner wrote while it was down) and from the replicas' heartbeats."""

from __future__ import annotations

import threading

import pytest

from rlfleet.clients.rollout_pool import RolloutPool
from rlfleet.fleet import AdapterDirectory, ReplicaDirectory, connect
from rlfleet.v1 import sync_pb2
from tests.reliability.conftest import (
    Fleet,
    Sync,
    assert_exactly_once,
    group,
    metric_value,
    wait_until,
)


@pytest.mark.slow
def test_ckptsync_killed_replicas_keep_serving_and_restart_rebuilds(fleet: Fleet) -> None:
    fleet.start_redis()
    fleet.start_env()
    fleet.start_sync()
    fleet.start_replicas(["ra", "rb"])
    v1 = fleet.publish(1)
    assert sorted(fleet.wait_replicas(1, 2)) == ["ra", "rb"]
    redis = connect(fleet.redis_url)
    replicas = ReplicaDirectory(redis)

    pool = RolloutPool(redis_url=fleet.redis_url, run=fleet.run, stream_timeout_s=120)
    before_kill = [group(seed=1_000_300 + i, g=2, turns=4, min_version=1) for i in range(4)]
    results: list = []
    runner = threading.Thread(target=lambda: results.extend(
        pool.run_groups(before_kill, max_in_flight=4)))
    runner.start()
    wait_until("a replica playing a group",
               lambda: any(r.active_groups for r in replicas.live()), timeout_s=60,
               period_s=0.02)
    fleet.procs.kill(fleet.sync)  # SIGKILL while groups are in flight
    runner.join(180)
    assert not runner.is_alive()
    # with ckpt-sync dead: more groups, and the learner writes v2 to /shared (its Publish
    # call would fail; the file is there)
    after_kill = [group(seed=1_000_310 + i, g=2, turns=3, min_version=1) for i in range(4)]
    results += list(pool.run_groups(after_kill, max_in_flight=4))
    fleet.write_version(2)

    trajectories = assert_exactly_once(before_kill + after_kill, results)
    assert trajectories == 16
    served = {(t.adapter.version, t.adapter.sha256) for _, ts in results for t in ts}
    assert served == {(1, v1.manifest_sha256)}  # the last adapter, on both replicas
    assert {t.replica_id for _, ts in results for t in ts} == {"ra", "rb"}
    live = {r.replica_id: r.adapter_version for r in replicas.live()}
    assert live == {"ra": 1, "rb": 1}  # heartbeats went on without ckpt-sync
    assert {fleet.status(p).adapter.version for p in fleet.replicas.values()} == {1}

    # Restart (same address). It re-announces v2 from /shared (newer than Redis' v1) and
    # knows who serves what from the heartbeats alone.
    sync = fleet.start_sync("ckptsync-2")
    latest = fleet.sync_client().call(Sync, "GetLatest", sync_pb2.GetLatestRequest(run=fleet.run))
    assert latest.version == 2
    assert sorted(fleet.wait_replicas(2, 2)) == ["ra", "rb"]
    wait_until("the live-replica gauge", lambda: metric_value(sync.extra["metrics_port"],
                                                              "rlfleet_sync_live_replicas") == 2)
    history = [r.version for r in AdapterDirectory(redis).history(fleet.run)]
    assert history == sorted(history) and history[-1] == 2
    again = [group(seed=1_000_320 + i, g=2, turns=2, min_version=2) for i in range(2)]
    results2 = list(pool.run_groups(again))
    assert_exactly_once(again, results2)
    assert {t.adapter.version for _, ts in results2 for t in ts} == {2}
    pool.close()
