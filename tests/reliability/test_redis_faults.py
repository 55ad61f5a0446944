"""Redis faults that used to end in unclean errors.

- 11: Redis full (maxmemory with noeviction: every write that may grow memory answers
  OOM). `Publish` answers UNAVAILABLE naming the cause (it was INTERNAL with a
  traceback); the learner's publisher retries it until Redis has room, then the version
  is announced and served; replicas stay registered throughout (their heartbeat replaces
  one small key and may run while Redis is out of memory) and groups keep completing.
- 12: a wrong REDIS_PASSWORD on the learner side: one clear error naming the refused
  credentials, exit code 2, no "fleet store unreachable" warnings, no traceback.
- 13: a replica started while Redis is down serves NOT_SERVING (it does not exit), and
  registers and turns SERVING when Redis comes back.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
import redis as redis_lib
import yaml

from rlfleet.clients.rollout_pool import RolloutPool
from rlfleet.fleet import FleetAuthError, ReplicaDirectory, connect
from rlfleet.local.forkserver import popen
from rlfleet.local.procs import free_port
from rlfleet.rpc.health import check
from rlfleet.v1 import common_pb2, sync_pb2
from rlfleet_learner.publisher import AdapterPublisher
from tests.reliability.conftest import (
    Fleet,
    Sync,
    assert_exactly_once,
    group,
    lora_files,
    metric_value,
    wait_until,
)
from tests.waits import scaled

HEARTBEAT_TTL_S = 3.0  # conftest's replicas: --heartbeat-ttl-s 3


def fill(client: redis_lib.Redis, junk: int = 2000) -> int:
    """Writes `junk` keys of 1 KB, then caps Redis 1 MiB below what it uses, with the
    noeviction policy: every write that may grow memory answers OOM until the junk is
    deleted (DEL is allowed). Returns the number of junk keys."""
    pipe = client.pipeline(transaction=False)
    for n in range(junk):
        pipe.set(f"junk:{n}", "x" * 1000)
    pipe.execute()
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", used - (1 << 20))
    return junk


@pytest.mark.slow
def test_redis_full_publish_is_retried_and_replicas_stay(fleet: Fleet, caplog) -> None:
    fleet.start_redis()
    fleet.start_env()
    fleet.start_sync()
    ra, rb = fleet.start_replicas(["ra", "rb"])
    fleet.publish(1)
    fleet.wait_replicas(1, 2)
    redis = connect(fleet.redis_url)
    store = ReplicaDirectory(redis)
    pool = RolloutPool(redis_url=fleet.redis_url, run=fleet.run)
    requests = [group(seed=1_001_500 + i, g=2, turns=4, min_version=1) for i in range(6)]
    results: list = []
    errors: list = []
    seen: list[set[str]] = []
    stop = threading.Event()

    def run() -> None:
        try:
            results.extend(pool.run_groups(requests, max_in_flight=2))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def watch() -> None:  # who the fleet store lists, every 100 ms while Redis is full
        while not stop.wait(0.1):
            try:
                seen.append({r.replica_id for r in store.live()})
            except redis_lib.RedisError:
                seen.append(set())

    junk = fill(redis)
    full_at = time.monotonic()
    with pytest.raises(redis_lib.OutOfMemoryError):
        redis.set("probe", "x")  # Redis is full
    watcher = threading.Thread(target=watch)
    watcher.start()
    runner = threading.Thread(target=run)
    runner.start()

    # a direct Publish: UNAVAILABLE (retried by clients), naming the cause
    fleet.write_version(2)
    with pytest.raises(grpc.RpcError) as err:
        fleet.sync_client(max_attempts=1).call(Sync, "Publish", sync_pb2.PublishRequest(
            adapter=common_pb2.AdapterRef(run=fleet.run, version=2)))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
    assert "full" in err.value.details() and "maxmemory" in err.value.details()

    # the learner's publisher keeps retrying until Redis has room
    publisher = AdapterPublisher(fleet.root, fleet.run, "tiny", fleet.sync_service())
    published: list = []
    caplog.set_level(logging.WARNING, logger="rlfleet_learner.publisher")
    files = lora_files(fleet.model_dir, 3)
    announcer = threading.Thread(target=lambda: published.append(
        publisher.publish(files, step=3, version=publisher.next_version(3))))
    announcer.start()
    wait_until("the publisher to retry", lambda: publisher.announce_retries >= 2,
               timeout_s=120)
    wait_until("two heartbeat TTLs with Redis full",
               lambda: time.monotonic() - full_at > 2 * HEARTBEAT_TTL_S, timeout_s=60)
    assert not published and announcer.is_alive()
    unavailable = metric_value(fleet.sync.extra["metrics_port"], "rlfleet_grpc_requests_total",
                               'grpc_code="UNAVAILABLE",grpc_method="Publish",'
                               'grpc_service="rlfleet.v1.SyncService"')
    assert unavailable >= 3

    # room again: delete the junk (DEL is allowed while full) and lift the cap
    for start in range(0, junk, 500):
        redis.delete(*[f"junk:{i}" for i in range(start, min(junk, start + 500))])
    redis.config_set("maxmemory", 0)
    announcer.join(120)
    assert not announcer.is_alive() and published and published[0].version == 3
    assert sorted(fleet.wait_replicas(3, 2)) == ["ra", "rb"]
    runner.join(300)
    stop.set()
    watcher.join()
    assert not errors, errors
    trajectories = assert_exactly_once(requests, results)
    # the replicas were listed at every sample while Redis was full
    assert seen and all(s == {"ra", "rb"} for s in seen), [s for s in seen if s != {"ra", "rb"}]
    retried = [r for r in caplog.records if "cannot record the adapter version" in r.message]
    assert retried and all("full" in getattr(r, "details", "") for r in retried)
    sync_log = fleet.sync.log_path.read_text()
    assert "Traceback" not in sync_log and "INTERNAL" not in sync_log
    assert ra.alive and rb.alive and fleet.sync.alive
    print(f"redis full ({junk} junk keys): Publish UNAVAILABLE x{unavailable:.0f} naming the "
          f"cause, the publisher retried {publisher.announce_retries}x then announced v3, "
          f"served by both; replicas listed in {len(seen)} of {len(seen)} samples; "
          f"{len(results)} groups / {trajectories} trajectories exactly once")
    pool.close()


@pytest.mark.slow
def test_wrong_redis_password_on_the_learner_fails_once_and_clearly(fleet: Fleet,
                                                                    tmp_path: Path) -> None:
    password = "pw-" + secrets.token_hex(12)
    fleet.start_redis(password=password)
    url = f"redis://127.0.0.1:{fleet.redis_port}/0"
    wrong = {"REDIS_PASSWORD": "wrong-" + password[::-1]}
    # the pool itself: one clear error at construction
    with pytest.raises(FleetAuthError, match="Redis refused the credentials"):
        RolloutPool(redis_url=f"redis://:wrong@127.0.0.1:{fleet.redis_port}/0", run="x")
    config = tmp_path / "learner.yaml"
    config.write_text(yaml.safe_dump({
        "run": "badpw", "steps": 1,
        "fleet": {"redis_url": url, "sync_address": f"127.0.0.1:{free_port()}",
                  "runs_root": str(fleet.root.root)},
        "ray": {"object_store_mb": 128}}))
    proc = popen([sys.executable, "-m", "rlfleet.cli", "learner", "run", "--config",
                  str(config)], env={**os.environ, **wrong})
    out, _ = proc.communicate(timeout=scaled(300))
    assert proc.returncode == 2, out
    assert out.count("Redis refused the credentials") == 1, out
    assert "REDIS_PASSWORD" in out
    assert "fleet store unreachable" not in out and "no live rollout replica" not in out
    assert "Traceback" not in out, out
    assert password not in out and password[::-1] not in out
    print("wrong REDIS_PASSWORD on the learner: exit 2 with 1 error line "
          f"({[line for line in out.splitlines() if 'refused' in line][0][:120]}...)")


@pytest.mark.slow
def test_replica_started_while_redis_is_down_registers_when_it_returns(fleet: Fleet) -> None:
    fleet.redis_port = free_port()  # nothing listens there yet
    fleet.redis_url = f"redis://127.0.0.1:{fleet.redis_port}/0"
    fleet.start_env()
    (rc,) = fleet.start_replicas(["rc"], wait=False)
    wait_until("rc up, NOT_SERVING", lambda: check(rc.address or "") == "NOT_SERVING",
               timeout_s=300, period_s=0.2)
    wait_until("rc to say why", lambda: "cannot register in the fleet store"
               in rc.log_path.read_text(), timeout_s=60)
    # it waits (does not exit, does not claim to be ready) for longer than its TTL
    time.sleep(HEARTBEAT_TTL_S)
    assert rc.alive and check(rc.address or "") == "NOT_SERVING"

    fleet.start_redis()  # Redis comes back, on the address the replica was given
    wait_until("rc SERVING", lambda: check(rc.address or "") == "SERVING", timeout_s=120)
    store = ReplicaDirectory(connect(fleet.redis_url))
    wait_until("rc registered", lambda: [r.replica_id for r in store.live()] == ["rc"],
               timeout_s=30)
    pool = RolloutPool(redis_url=fleet.redis_url, run=fleet.run)
    requests = [group(seed=1_001_600 + i) for i in range(2)]
    trajectories = assert_exactly_once(requests, list(pool.run_groups(requests)))
    pool.close()
    log = rc.log_path.read_text()
    assert "Traceback" not in log
    warned = log.count("cannot register in the fleet store")
    print(f"replica started with Redis down: NOT_SERVING (alive) until Redis came back "
          f"({warned} warning), then registered and SERVING; {len(requests)} groups / "
          f"{trajectories} trajectories exactly once")
