"""A learner that waits says what for, every few seconds, instead of silence: replicas to
come up (a real learner process with none), rollouts to come back (its group feed), and
which replicas serve (acknowledged) a version."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from rlfleet.clients.rollout_pool import RolloutPool
from rlfleet.fleet import ReplicaDirectory, ReplicaInfo, connect
from rlfleet.local.forkserver import popen
from rlfleet.logs import COMMON_KEYS
from rlfleet.v1 import common_pb2, rollout_pb2
from rlfleet_learner.feed import GroupFeed
from rlfleet_learner.reporting import replica_state
from tests.factories import REPO, SFT, TEST_RECIPE
from tests.waits import scaled

RUN = "waits"


def test_a_learner_with_no_replica_logs_what_it_waits_for(
        procs, redis_url: str, start_ckptsync, tmp_path: Path) -> None:  # noqa: ANN001
    runs_root = tmp_path / "runs"
    sync = start_ckptsync(redis_url, runs_root)
    cfg = yaml.safe_load((REPO / TEST_RECIPE).read_text())
    cfg.update(run=RUN, steps=1, calibrate_step=0)
    cfg["model"].update(path=str(SFT))
    cfg["fleet"].update(redis_url=redis_url, sync_address=sync.address,
                        runs_root=str(runs_root), min_replicas=1, sync_timeout_s=15)
    cfg["ray"].update(num_workers=1)
    path = tmp_path / "learner.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = popen([sys.executable, "-m", "rlfleet.cli", "learner", "run", "--config",
                  str(path)])
    out, _ = proc.communicate(timeout=scaled(600))
    # no replica ever came: the capacity check fails, with one clear line
    assert proc.returncode == 2, out[-3000:]
    lines = [line for line in out.splitlines() if line.strip()]
    docs = []
    for line in lines:
        try:
            docs.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"not a JSON line in the learner's output: {line!r}")
    assert all(set(COMMON_KEYS) <= set(d) and d["service"] == "learner" for d in docs)
    waits = [d for d in docs if d["msg"] == "waiting for 1 live rollout replica(s)"]
    assert waits, [d["msg"] for d in docs]
    assert all(w["run"] == RUN and w["replicas_wanted"] == 1 and w["replicas_seen"] == []
               and w["elapsed_s"] > 0 for w in waits)
    (error,) = [d for d in docs if d["level"] == "error"]
    assert error["error"] == "InsufficientCapacity" and "no live rollout replica" in error["msg"]


def wait_for_record(caplog: pytest.LogCaptureFixture, msg: str, timeout_s: float = 60
                    ) -> logging.LogRecord:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [r for r in caplog.records if r.getMessage() == msg]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no {msg!r} logged in {timeout_s}s")


def test_waiting_for_rollouts_is_reported_with_the_groups_and_replicas(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rlfleet_learner")
    pool = RolloutPool(redis_url=redis_url, run=RUN)  # no replica heartbeats
    request = rollout_pb2.GroupRequest(group_size=2, idempotency_key=f"{RUN}/0",
                                       task=common_pb2.TaskSpec(task="maze_2d", seed=1000))
    feed = GroupFeed(pool, [request], max_in_flight=1, report_s=0.5)
    stop = threading.Event()
    taken: list = []
    taker = threading.Thread(target=lambda: taken.append(feed.take(1, stop)))
    taker.start()
    try:
        record = wait_for_record(caplog, "waiting for 1 rollout group(s)")
    finally:
        stop.set()
        taker.join(30)
        feed.close()
        pool.close()
    assert taken == [None]  # stopped while waiting: nothing taken
    assert (record.groups_wanted, record.groups_received) == (1, 0)
    assert (record.run, record.replicas_seen) == (RUN, [])
    assert record.elapsed_s > 0


def test_replica_state_names_the_replicas_seen_and_those_serving_the_version(
        redis_url: str) -> None:
    directory = ReplicaDirectory(connect(redis_url))
    directory.heartbeat(ReplicaInfo("r1", "127.0.0.1:1", run=RUN, adapter_version=2), 30)
    directory.heartbeat(ReplicaInfo("r2", "127.0.0.1:2", run=RUN, adapter_version=1), 30)
    directory.heartbeat(ReplicaInfo("x", "127.0.0.1:3", run="another", adapter_version=9), 30)
    pool = RolloutPool(redis_url=redis_url, run=RUN)
    try:
        assert replica_state(pool, 2, version=2) == {
            "run": RUN, "replicas_wanted": 2, "version": 2, "replicas_seen": ["r1", "r2"],
            "replicas_acknowledged": ["r1"]}
        assert replica_state(pool) == {"run": RUN, "replicas_seen": ["r1", "r2"]}
    finally:
        pool.close()
