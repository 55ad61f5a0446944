"""One learner per run: the run's lease on /shared and its generation as a fencing token.

- learners racing for a run at the same instant (real processes): exactly one wins,
  each other one is refused naming the holder;
- a holder that stops renewing (SIGSTOP: a node cut off) is taken over once its lease
  expired, and when it wakes it finds itself fenced off; a killed holder (SIGKILL) is
  taken over;
- ckpt-sync refuses to announce a version written under an older generation than the
  run's;
- two real learners on one run (the local fleet): the second exits 3 with one line
  naming the holder and writes nothing; the holder cut off (SIGSTOP) is taken over by a
  third learner once its lease expired, which resumes from its checkpoint; woken, the
  cut-off one stops (exit 3) without a record or an announced version; the run's
  lineage has every step once and its announced versions never go back a generation.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from rlfleet.fleet import AdapterDirectory, connect
from rlfleet.local.metrics_jsonl import lineage_steps, read_events
from rlfleet.local.stack import LocalStack
from rlfleet.storage import RunsRoot, list_versions, publish_adapter_dir, read_manifest
from rlfleet.storage.lease import RunLease, current_lease
from rlfleet.v1 import common_pb2, sync_pb2
from tests import factories
from tests.factories import NO_EVAL, learner_process
from tests.reliability.conftest import Fleet, Sync, lora_files
from tests.waits import scaled, wait_until

RUN = "leased"
OPEN_ENDED = 10_000

# A process that takes the run's lease at `start` (wall clock), says WON <generation>
# (or the refusal), then checks it holds the lease every 50 ms until stdin closes, and
# once more after: LOST <reason> and exit 3 the moment it does not.
HOLDER = r"""
import sys, time
from rlfleet.storage import RunsRoot
from rlfleet.storage.lease import LeaseHeld, LeaseLost, RunLease
root, run, ttl, start = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
while time.time() < start:
    pass
lease = RunLease(RunsRoot(root), run, ttl)
try:
    record = lease.acquire()
except LeaseHeld as exc:
    print("HELD", exc, flush=True)
    sys.exit(3)
print("WON", record.generation, flush=True)
import threading
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
try:
    while not done.wait(0.05):
        lease.ensure_held()
    # as a learner's last write: a holder woken from a stop with its stdin already
    # closed checks once more before it releases
    lease.ensure_held()
except LeaseLost as exc:
    print("LOST", exc, flush=True)
    sys.exit(3)
lease.release()
print("RELEASED", flush=True)
"""


@pytest.fixture
def holders() -> Iterator[Callable[..., subprocess.Popen]]:
    """Starts HOLDER processes; any still running at the end is killed."""
    started: list[subprocess.Popen] = []

    def start(root: Path, ttl_s: float, at: float | None = None) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(root), RUN, str(ttl_s),
             str(at if at is not None else 0)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.communicate(timeout=scaled(30))


def first_line(proc: subprocess.Popen) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def test_racing_learners_one_wins_a_cut_off_one_is_fenced_a_killed_one_taken_over(
        tmp_path: Path, holders: Callable[..., subprocess.Popen]) -> None:
    root = tmp_path / "runs"
    ttl = scaled(4)
    # four at the same instant: one generation 1, three refused naming it
    start = time.time() + scaled(2)
    racers = [holders(root, ttl, start) for _ in range(4)]
    lines = [first_line(p) for p in racers]
    winners = [p for p, line in zip(racers, lines, strict=True) if line.startswith("WON")]
    assert [line for line in lines if line.startswith("WON")] == ["WON 1"], lines
    winner = winners[0]
    for p, line in zip(racers, lines, strict=True):
        if p is not winner:
            assert p.wait(timeout=scaled(30)) == 3
            assert line.startswith("HELD run 'leased' is held by another learner: "
                                   f"pid {winner.pid} on host "), line
    # the winner cut off (SIGSTOP: it cannot renew): taken over once its lease expired
    os.kill(winner.pid, signal.SIGSTOP)
    try:
        taker = holders(root, ttl)
        assert first_line(taker) == "WON 2"
        lease = current_lease(RunsRoot(root), RUN)
        assert lease is not None and lease.pid == taker.pid and lease.generation == 2
    finally:
        os.kill(winner.pid, signal.SIGCONT)
    # woken, it finds it lost the run: it stops, nothing more written under its lease
    out, _ = winner.communicate(timeout=scaled(30))
    assert winner.returncode == 3, out
    lost = [line for line in out.splitlines() if line.startswith("LOST")]
    assert len(lost) == 1, out
    assert lost[0].startswith("LOST the lease on run 'leased' (generation 1) was taken over "
                              f"by pid {taker.pid} on host "), out
    # a killed holder's lease: taken over (its process is gone)
    taker.kill()
    taker.communicate(timeout=scaled(30))
    third = holders(root, ttl)
    assert first_line(third) == "WON 3"
    out, _ = third.communicate("", timeout=scaled(30))  # stdin closed: it releases
    assert third.returncode == 0 and "RELEASED" in out, out
    released = current_lease(RunsRoot(root), RUN)
    assert released is not None and released.released and released.generation == 3


def test_ckptsync_refuses_a_version_of_an_older_generation(fleet: Fleet) -> None:
    fleet.start_redis()
    fleet.start_sync()
    first = RunLease(fleet.root, fleet.run, scaled(30))
    assert first.acquire().generation == 1

    def write(version: int, generation: int) -> None:
        publish_adapter_dir(fleet.root, fleet.run, version,
                            lora_files(fleet.model_dir, version), base_model="tiny",
                            step=version, generation=generation)

    def announce(version: int) -> sync_pb2.PublishResponse:
        return fleet.sync_client().call(Sync, "Publish", sync_pb2.PublishRequest(
            adapter=common_pb2.AdapterRef(run=fleet.run, version=version)))

    write(1, 1)
    assert announce(1).adapter.version == 1
    first.release()
    second = RunLease(fleet.root, fleet.run, scaled(30))
    assert second.acquire().generation == 2
    try:
        write(2, 1)  # the first learner, still writing after the run was taken over
        with pytest.raises(grpc.RpcError) as refused:
            announce(2)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "written by a learner whose lease was taken over (its generation 1, the " \
               "run's 2)" in (refused.value.details() or "")
        latest = fleet.sync_client().call(Sync, "GetLatest",
                                          sync_pb2.GetLatestRequest(run=fleet.run))
        assert latest.version == 1
        write(3, 2)
        assert announce(3).adapter.version == 3
    finally:
        second.release()


def wait_for(metrics: Path, proc: subprocess.Popen, what: str, predicate, after: int = 0
             ) -> None:  # noqa: ANN001
    """Until a record of `metrics` past index `after` satisfies `predicate`; the
    learner's output if it exits first."""
    def seen() -> bool:
        return proc.poll() is not None or (metrics.exists() and any(
            predicate(e) for e in read_events(metrics)[after:]))

    wait_until(what, seen, timeout_s=600, period_s=0.05)
    if proc.poll() is not None:
        raise AssertionError(f"the learner exited early:\n{proc.communicate()[0]}")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_second_learner_refused_cut_off_learner_taken_over_and_fenced(
        stack: LocalStack, tmp_path: Path) -> None:
    lease_s = scaled(8)
    config = factories.learner_config(
        stack, tmp_path, RUN, steps=4, data=factories.HOT_SHORT_EPISODES, eval=NO_EVAL,
        checkpoint={"every": 1, "keep_last": 3}, ray={"num_workers": 1},
        fleet={"max_groups_in_flight": 2}, lease_s=lease_s)
    root = RunsRoot(stack.runs_root)
    metrics = root.metrics_path(RUN)
    first = learner_process(config, steps=OPEN_ENDED)
    try:
        wait_for(metrics, first, "the first learner's step 1 checkpointed",
                 lambda e: e["event"] == "step" and e["step"] >= 1)
        # a second learner on the run: refused, naming the holder; nothing written
        second = learner_process(config)
        out, _ = second.communicate(timeout=scaled(300))
        assert second.returncode == 3, out
        refusals = [line for line in out.splitlines() if "held by another learner" in line]
        assert len(refusals) == 1 and "Traceback" not in out, out
        assert f"pid {first.pid} on host " in refusals[0] and " since " in refusals[0], out
        assert [e["event"] for e in read_events(metrics)].count("start") == 1

        # the first cut off (its driver stopped: it renews nothing) once it checkpointed
        wait_until("a checkpoint", lambda: root.checkpoints_root(RUN).exists()
                   and any(n.startswith("step_") for n in os.listdir(
                       root.checkpoints_root(RUN))), timeout_s=300)
        os.kill(first.pid, signal.SIGSTOP)
        stopped_at = len(read_events(metrics))
        third = learner_process(config, steps=6)
        try:
            wait_for(metrics, third, "the third learner's start",
                     lambda e: e["event"] == "start", after=stopped_at)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        # woken, the first learner finds the run taken over: one line, exit 3
        out, _ = first.communicate(timeout=scaled(300))
        assert first.returncode == 3, out
        assert "Traceback" not in out, out
        fenced = [line for line in out.splitlines() if "was taken over by" in line]
        assert len(fenced) == 1 and f"by pid {third.pid} on host " in fenced[0], out
        out, _ = third.communicate(timeout=scaled(900))
        assert third.returncode == 0, out
    finally:
        for proc in (first,):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate(timeout=scaled(60))

    events = read_events(metrics)
    starts = [e for e in events if e["event"] == "start"]
    assert [s["lease_generation"] for s in starts] == [1, 2], starts
    assert f"pid {first.pid} on host " in starts[1]["took_over_from"]
    # after the third learner's start, nothing from the first: one lineage, steps once each
    assert events[-1]["event"] == "end" and events[-1]["step"] == 6
    assert [s["step"] for s in lineage_steps(events)] == list(range(1, 7))
    taken = events.index(starts[1])
    assert all(e["event"] != "stopped" and e["event"] != "failed" for e in events[taken:])
    # announced versions never go back a generation; the first's last ones never announced
    history = AdapterDirectory(connect(stack.redis_url)).history(RUN)
    generations = [read_manifest(root.adapter_dir(RUN, r.version)).generation
                   for r in sorted(history, key=lambda r: r.version)
                   if r.version in set(list_versions(root, RUN))]
    assert generations == sorted(generations) and generations[-1] == 2, generations
    print(f"run lease: second learner refused ({refusals[0]}); the first, cut off, fenced "
          f"({fenced[0]}); generations of announced versions {generations}; "
          f"{json.dumps(starts[1]['took_over_from'])}")
