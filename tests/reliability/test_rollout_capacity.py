"""The rollout pool respects each replica's capacity, with real replica processes (the
tiny policy), a real env service and a real Redis: an eval-like burst of single-episode
groups against two replicas with small limits is answered without one RESOURCE_EXHAUSTED
and without one retry, no replica ever plays more than its limit, and a replica SIGKILLed
mid-run still has its groups re-sent and delivered exactly once."""

from __future__ import annotations

import threading

import pytest

from rlfleet.clients.rollout_pool import Capacity, RolloutPool
from rlfleet.fleet import ReplicaDirectory, connect
from rlfleet.v1 import common_pb2, rollout_pb2
from tests.reliability.conftest import (
    Fleet,
    assert_exactly_once,
    metric_total,
    metric_value,
    metrics_text,
    wait_until,
)

MAX_GROUPS, MAX_EPISODES = 2, 3


def eval_group(seed: int, turns: int = 2) -> rollout_pb2.GroupRequest:
    """What the learner's greedy eval sends: one episode per group, temperature 0."""
    return rollout_pb2.GroupRequest(
        task=common_pb2.TaskSpec(task="maze_2d", seed=seed, size=7, max_turns=turns),
        group_size=1,
        sampling=rollout_pb2.SamplingParams(temperature=0.0, max_new_tokens=3),
        idempotency_key=f"cap/eval/seed{seed}/t{turns}")


def refused(port: int) -> float:
    """RESOURCE_EXHAUSTED answers to RolloutGroup, as the replica's own metrics count them."""
    n = 0.0
    for line in metrics_text(port).splitlines():
        if line.startswith("rlfleet_grpc_requests_total{") \
                and 'grpc_method="RolloutGroup"' in line \
                and 'grpc_code="RESOURCE_EXHAUSTED"' in line:
            n += float(line.rsplit(" ", 1)[1])
        elif line.startswith("rlfleet_rollout_groups_refused_total{"):
            n += float(line.rsplit(" ", 1)[1])
    return n


@pytest.mark.slow
def test_eval_burst_fits_the_fleet_and_a_dead_replica_is_covered(fleet: Fleet) -> None:
    fleet.start_redis()
    fleet.start_env()
    ra, rb = fleet.start_replicas(["ra", "rb"], "--max-groups", str(MAX_GROUPS),
                                  env={"RLFLEET_MAX_EPISODES": str(MAX_EPISODES)})
    ports = {p.name: p.extra["metrics_port"] for p in (ra, rb)}
    live = {r.replica_id: (r.max_groups, r.max_episodes)
            for r in ReplicaDirectory(connect(fleet.redis_url)).live()}
    assert live == {"ra": (MAX_GROUPS, MAX_EPISODES), "rb": (MAX_GROUPS, MAX_EPISODES)}
    status = fleet.status(ra)
    assert (status.max_groups, status.max_episodes) == (MAX_GROUPS, MAX_EPISODES)

    pool = RolloutPool(redis_url=fleet.redis_url, run=fleet.run, stream_timeout_s=120)
    assert pool.capacity() == Capacity(2 * MAX_GROUPS, 2 * MAX_EPISODES)
    assert pool.groups_that_fit(1) == 4
    retries_before = metric_total("rlfleet_pool_group_retries")

    # -- the burst: 4x more in flight than the fleet holds -------------------------------
    requests = [eval_group(seed) for seed in range(16)]
    results = list(pool.run_groups(requests, max_in_flight=16))
    assert assert_exactly_once(requests, results) == 16
    burst_retries = metric_total("rlfleet_pool_group_retries") - retries_before
    burst_refused = {name: refused(port) for name, port in ports.items()}
    peaks = {name: (metric_value(port, "rlfleet_rollout_peak_groups"),
                    metric_value(port, "rlfleet_rollout_peak_episodes"))
             for name, port in ports.items()}
    assert burst_retries == 0
    assert burst_refused == {"ra": 0, "rb": 0}
    for name, (groups, episodes) in peaks.items():
        assert 1 <= groups <= MAX_GROUPS and episodes <= MAX_EPISODES, (name, groups, episodes)
    assert {t.replica_id for _, ts in results for t in ts} == {"ra", "rb"}

    # -- a replica SIGKILLed mid-run: its groups are re-sent to the other ----------------
    requests = [eval_group(seed, turns=6) for seed in range(100, 112)]
    results = []
    runner = threading.Thread(target=lambda: results.extend(
        pool.run_groups(requests, max_in_flight=12)))
    before = metric_total("rlfleet_pool_group_retries")
    runner.start()
    wait_until("ra mid-group", lambda: fleet.status(ra).active_groups, timeout_s=120,
               period_s=0.02)
    fleet.procs.kill(ra)
    runner.join(300)
    assert not runner.is_alive()
    assert not ra.alive and rb.alive
    assert assert_exactly_once(requests, results) == 12
    kill_retries = metric_total("rlfleet_pool_group_retries") - before
    # the cut groups were re-sent, and only they (never more than MAX_GROUPS were on ra; a
    # failed replica gets no group until it answers GetStatus, its heartbeat lingering)
    assert 1 <= kill_retries <= MAX_GROUPS
    assert refused(ports["rb"]) == 0
    rb_peak = metric_value(ports["rb"], "rlfleet_rollout_peak_groups")
    assert rb_peak <= MAX_GROUPS
    print(f"capacity {MAX_GROUPS} groups / {MAX_EPISODES} episodes per replica: burst of 16 "
          f"single-episode groups, 16 in flight: {burst_retries:.0f} retries, "
          f"RESOURCE_EXHAUSTED {burst_refused}, peak (groups, episodes) {peaks}; "
          f"ra killed mid-run: {kill_retries:.0f} retries, rb refused 0, rb peak {rb_peak:.0f}")
    pool.close()
