"""Fault 4: Redis killed and restarted empty (flushed) while every service runs. Nobody is
restarted: replicas re-register by heartbeat and catch up, ckpt-sync re-announces from
/shared, the rollout pool keeps delivering groups, and no version ever goes backwards."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from rlfleet.clients.rollout_pool import RolloutPool
from rlfleet.fleet import AdapterDirectory, ReplicaDirectory, connect
from rlfleet.v1 import common_pb2, sync_pb2
from tests.reliability.conftest import (
    Fleet,
    Sync,
    assert_exactly_once,
    group,
    metric_total,
    wait_until,
)

OUTAGE_S = 12.0  # longer than the Redis client's own retry window (~9 s)


class VersionWatch:
    """Polls every replica's live adapter version and Redis' latest; records each."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.seen: dict[str, list[int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._store = AdapterDirectory(connect(fleet.redis_url))

    def _sample_replicas(self) -> None:
        for name, proc in self.fleet.replicas.items():
            try:
                self.seen.setdefault(name, []).append(self.fleet.status(proc).adapter.version)
            except grpc.RpcError:
                pass

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            self._sample_replicas()
            try:
                latest = self._store.latest(self.fleet.run)
            except Exception:  # noqa: BLE001 - Redis is down on purpose
                continue
            if latest is not None:
                self.seen.setdefault("redis-latest", []).append(latest.version)

    def __enter__(self) -> VersionWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        # a last sample: the loop may have been inside a slow call (Redis' reconnect
        # retries) when a replica went live on the newest version
        self._sample_replicas()


@pytest.mark.slow
def test_redis_restarted_and_flushed_fleet_heals_without_restarts(fleet: Fleet) -> None:
    fleet.start_redis()
    fleet.start_env()
    fleet.start_sync()
    fleet.start_replicas(["ra", "rb"])
    fleet.publish(1)
    fleet.wait_replicas(1, 2)
    pool = RolloutPool(redis_url=fleet.redis_url, run=fleet.run, stream_timeout_s=120)
    pids = {name: p.popen.pid for name, p in fleet.replicas.items()}
    pids["ckptsync"] = fleet.sync.popen.pid
    retries_before = metric_total("rlfleet_pool_group_retries")

    requests = [group(seed=1_000_400 + i, g=2, turns=4, min_version=1) for i in range(10)]
    results: list = []
    errors: list = []

    def run() -> None:
        try:
            results.extend(pool.run_groups(requests, max_in_flight=2))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with VersionWatch(fleet) as watch:
        runner = threading.Thread(target=run)
        runner.start()
        wait_until("first groups done", lambda: len(results) >= 2, timeout_s=120)
        # flush, then kill: the new server starts empty (no persistence configured)
        connect(fleet.redis_url).flushall()
        fleet.procs.kill(fleet.redis)
        killed_at = time.monotonic()
        # during the outage the learner writes v2 to /shared; ckpt-sync cannot record it
        fleet.write_version(2)
        publish = sync_pb2.PublishRequest(adapter=common_pb2.AdapterRef(run=fleet.run,
                                                                        version=2))
        with pytest.raises(grpc.RpcError) as err:
            fleet.sync_client(max_attempts=1).call(Sync, "Publish", publish)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
        time.sleep(max(0.0, killed_at + OUTAGE_S - time.monotonic()))
        fleet.start_redis("redis-2")  # same port, empty

        redis = connect(fleet.redis_url)
        replicas = ReplicaDirectory(redis)
        wait_until("both replicas re-registered",
                   lambda: {r.replica_id for r in replicas.live()} == {"ra", "rb"})
        adapters = AdapterDirectory(redis)
        wait_until("ckpt-sync re-announced v2 from /shared",
                   lambda: getattr(adapters.latest(fleet.run), "version", 0) == 2)
        assert sorted(fleet.wait_replicas(2, 2)) == ["ra", "rb"]  # they caught up
        runner.join(300)
        assert not runner.is_alive()
        more = [group(seed=1_000_420 + i, g=2, turns=2, min_version=2) for i in range(2)]
        later = list(pool.run_groups(more))

    assert not errors, f"the pool failed during the Redis outage: {errors!r}"
    assert assert_exactly_once(requests, results) == 20
    assert_exactly_once(more, later)
    assert {t.adapter.version for _, ts in later for t in ts} == {2}
    for name, versions in watch.seen.items():
        assert versions == sorted(versions), f"{name} went backwards: {versions}"
    assert watch.seen["ra"][-1] == watch.seen["rb"][-1] == 2
    # nobody was restarted
    assert {n: p.popen.pid for n, p in fleet.replicas.items()} | {
        "ckptsync": fleet.sync.popen.pid} == pids
    assert all(p.alive for p in fleet.replicas.values()) and fleet.sync.alive
    # the same version again is accepted (idempotent), an older one refused
    fleet.sync_client().call(Sync, "Publish", publish)
    retries = metric_total("rlfleet_pool_group_retries") - retries_before
    samples = sum(len(v) for v in watch.seen.values())
    print(f"redis outage {OUTAGE_S}s: {len(results) + len(later)} groups, {retries:.0f} pool "
          f"retries, {samples} version samples, none backwards")
    pool.close()
