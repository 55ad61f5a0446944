"""A Ray start that times out is retried, and the half-started node of the failed attempt
is killed first (rlfleet_learner.ray_start.start_with_retry, which the learner's local Ray
and the suite's Ray starts use).

The failure is real: the first attempt's raylet is given a port another socket holds, so it
cannot start, never registers with the GCS, and Ray's own fixed 30 s wait runs out with
"The current node timed out during startup", as on a machine too busy for it. The GCS
server and the other processes that attempt started are still running then, and
`Cluster.shutdown()` knows nothing of a node whose start raised."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
import ray
from ray.cluster_utils import Cluster

from rlfleet.local import marks
from rlfleet_learner.ray_start import ATTEMPT_ENV, start_with_retry
from tests.waits import scaled

pytestmark = pytest.mark.slow  # Ray's own 30 s wait runs out once

NODE = {"num_cpus": 1, "object_store_memory": 80 * 1024 * 1024, "include_dashboard": False}


def test_a_timed_out_start_is_retried_after_its_half_started_node_is_killed() -> None:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    attempts: list[str] = []
    first: list[marks.Process] = []
    seen = threading.Event()

    def watch_the_first_attempt() -> None:
        deadline = time.monotonic() + scaled(120)
        while time.monotonic() < deadline and not seen.is_set():
            found = marks.marked(ATTEMPT_ENV, attempts[0])
            if any("gcs_server" in p.cmd for p in found):
                first.extend(found)
                seen.set()
            time.sleep(0.2)

    def start() -> Cluster:
        attempts.append(os.environ[ATTEMPT_ENV])
        if len(attempts) == 1:
            threading.Thread(target=watch_the_first_attempt, daemon=True).start()
        else:  # the retry begins once the first attempt's processes are gone
            assert seen.is_set() and not marks.marked(ATTEMPT_ENV, attempts[0])
        cluster = Cluster()
        try:
            port = {"node_manager_port": held.getsockname()[1]} if len(attempts) == 1 else {}
            cluster.add_node(**NODE, **port)
            ray.init(address=cluster.address, configure_logging=False, log_to_driver=False)
        except BaseException:
            cluster.shutdown()
            raise
        return cluster

    try:
        cluster = start_with_retry(start, attempts=2)
    finally:
        held.close()
    try:
        assert len(attempts) == 2 and attempts[0] != attempts[1]
        assert ray.cluster_resources().get("CPU") == 1  # the retry's Ray works
        assert any("gcs_server" in p.cmd for p in first)  # half-started: a GCS, no node
        assert not marks.marked(ATTEMPT_ENV, attempts[0])
        assert os.environ.get(ATTEMPT_ENV) is None  # later processes carry no attempt's mark
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_another_failure_is_raised_at_once_and_its_processes_are_killed() -> None:
    attempts: list[str] = []

    def start() -> None:
        attempts.append(os.environ[ATTEMPT_ENV])
        ray.init(address="local", configure_logging=False, log_to_driver=False, **NODE)
        assert marks.marked(ATTEMPT_ENV, attempts[-1])  # the node's processes carry it
        raise ValueError("not Ray's start-up time-out")

    with pytest.raises(ValueError, match="not Ray's start-up time-out"):
        start_with_retry(start, attempts=3)
    assert len(attempts) == 1
    assert not ray.is_initialized()
    assert not marks.marked(ATTEMPT_ENV, attempts[0])
