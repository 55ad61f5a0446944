"""At the publisher: the learner's `AdapterPublisher` against a real
ckpt-sync, Redis and rollout replicas, with real signals.

- ckpt-sync SIGSTOPped during a publish (it holds its socket and never answers: every call
  ends DEADLINE_EXCEEDED): the publisher re-sends the idempotent Publish within its total
  bound, and the version is announced once ckpt-sync is back. Held past the bound, the
  publish (and a wait for replicas) ends with `PublishFailed`, a `FleetFailure` naming
  ckpt-sync, the version and the last code: what the learner checkpoints and stops on.
- replicas lost at a sync wait: a SIGSTOPped replica is not waited for once its heartbeat
  expires (the wait ends short, with the replica that serves the version); with no replica
  serving it the publisher waits for a replacement up to its bound (a replica resumed in
  that time is taken), else `ReplicasLost`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator

import pytest

from rlfleet.clients.rollout_pool import RolloutPool
from rlfleet.clients.sync import SyncClient
from rlfleet.local.procs import Proc
from rlfleet_learner.faults import FleetFailure, PublishFailed, ReplicasLost
from rlfleet_learner.publisher import AdapterPublisher
from tests.reliability.conftest import Fleet, lora_files, scaled, wait_until
from tests.waits import hang_process_group

CALL_S = 2.0  # one call's deadline: a hung ckpt-sync costs this per attempt


@contextlib.contextmanager
def stopped(*procs: Proc) -> Iterator[None]:
    for proc in procs:
        hang_process_group(proc.popen.pid)
    try:
        yield
    finally:
        for proc in procs:
            os.killpg(proc.popen.pid, signal.SIGCONT)


def publisher(fleet: Fleet, bound_s: float) -> AdapterPublisher:
    assert fleet.sync is not None
    return AdapterPublisher(fleet.root, fleet.run, "tiny",
                            SyncClient(fleet.sync.address, timeout_s=CALL_S),
                            announce_retry_s=bound_s, max_backoff_s=1.0,
                            call_timeout_s=CALL_S)


@pytest.mark.slow
def test_a_hung_ckptsync_is_retried_within_a_bound_then_fails_cleanly(
        fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    fleet.start_redis()
    sync = fleet.start_sync()
    files = lora_files(fleet.model_dir, 1)
    patient = publisher(fleet, scaled(300))
    assert patient.publish(files, step=1, version=1).version == 1

    # hung for several call deadlines: retried, then announced
    caplog.set_level(logging.WARNING, logger="rlfleet_learner.publisher")
    result: list = []
    with stopped(sync):
        worker = threading.Thread(target=lambda: result.append(
            patient.publish(files, step=2, version=2)))
        worker.start()
        wait_until("the publisher to re-send Publish to the hung ckpt-sync",
                   lambda: patient.announce_retries >= 2, timeout_s=120)
    worker.join(scaled(120))
    assert not worker.is_alive() and result[0].version == 2
    assert fleet.sync_service().latest(fleet.run).version == 2
    codes = {getattr(r, "code", None) for r in caplog.records}
    assert "DEADLINE_EXCEEDED" in codes, codes

    # hung past the bound: PublishFailed, a FleetFailure with the reason; nothing raised
    # but that
    brief = publisher(fleet, 3 * CALL_S)
    with stopped(sync):
        with pytest.raises(PublishFailed) as err:
            brief.publish(files, step=3, version=3)
        assert isinstance(err.value, FleetFailure)
        assert "did not answer announcing adapter version 3" in str(err.value)
        assert "DEADLINE_EXCEEDED" in str(err.value)
        with pytest.raises(PublishFailed, match="waiting for replicas to serve adapter "
                                                "version 2"):
            brief.wait_live(2, 1, timeout_s=1.0)
    # ckpt-sync back: the same version is announced (the publish is idempotent)
    assert patient.publish(files, step=3, version=3).version in (3, 4)
    assert "Traceback" not in sync.log_path.read_text()


@pytest.mark.slow
def test_a_sync_wait_goes_on_without_lost_replicas_or_stops_cleanly(fleet: Fleet) -> None:
    fleet.start_redis()
    fleet.start_sync()
    fleet.start_env()
    a, b = fleet.start_replicas(["a", "b"])
    pool = RolloutPool(redis_url=fleet.redis_url, run=fleet.run)

    def live_ids() -> set[str]:
        return {r.replica_id for r in pool.replicas()}

    pub = publisher(fleet, scaled(120))
    files = lora_files(fleet.model_dir, 1)
    try:
        pub.publish(files, step=1, version=1)
        # no live_ids here: on a starved machine a running replica's 3 s heartbeat can lapse
        # for a moment, which would (correctly) make this wait go on without it
        full = pub.wait_live(1, 2, timeout_s=scaled(120))
        assert sorted(full.replica_ids) == ["a", "b"] and not full.short

        # b stalls: dropped from the wait once its heartbeat expires (TTL 3 s), long
        # before the wait's own bound
        with stopped(b):
            pub.publish(lora_files(fleet.model_dir, 2), step=2, version=2)
            short = pub.wait_live(2, 2, timeout_s=scaled(600), live_ids=live_ids)
            assert short.short and short.replica_ids == ["a"]
            assert "b" not in live_ids()

        # nobody serves the next version: a replica back within the replacement bound is
        # taken; none back in time is ReplicasLost
        wait_until("b heartbeats again", lambda: "b" in live_ids(), timeout_s=60)
        with stopped(a, b):
            pub.publish(lora_files(fleet.model_dir, 3), step=3, version=3)
            with pytest.raises(ReplicasLost, match="no replica serves adapter version 3"):
                pub.wait_live(3, 2, timeout_s=1.0, live_ids=live_ids, replacement_wait_s=2.0)
        with stopped(a, b):
            pub.publish(lora_files(fleet.model_dir, 4), step=4, version=4)
            got: list = []
            waiter = threading.Thread(target=lambda: got.append(pub.wait_live(
                4, 2, timeout_s=1.0, live_ids=live_ids, replacement_wait_s=scaled(300))))
            waiter.start()
            wait_until("the wait for a replacement", lambda: not live_ids(), timeout_s=60)
            os.killpg(a.popen.pid, signal.SIGCONT)  # a replacement comes
            waiter.join(scaled(300))
        assert not waiter.is_alive()
        assert "a" in got[0].replica_ids
    finally:
        pool.close()
