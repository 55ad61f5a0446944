"""A replica whose engine died is taken out: it turns NOT_SERVING, leaves the fleet store
(its entry removed, not left to expire), answers its groups UNAVAILABLE (the pool re-sends
them elsewhere at once and never clears it on a GetStatus), and exits non-zero so that
its Deployment restarts it.

1. An hf replica (in this process, real gRPC and Redis) whose engine is closed under it.
2. The vLLM tier: the engine core process of a real vLLM replica SIGKILLed beside an hf
   replica, under a running sync learner: the run finishes on the hf replica, and the
   vLLM replica's only failed groups are those it held when it died.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.engines.vllm import default_venv_python
from rlfleet.fleet import ReplicaDirectory, connect
from rlfleet.local.metrics_jsonl import lineage_steps, read_events
from rlfleet.local.stack import LocalStack, start_stack
from rlfleet.rpc import RpcClient
from rlfleet.rpc.client import open_channel
from rlfleet.rpc.health import check
from rlfleet.storage import RunsRoot
from rlfleet.v1 import common_pb2, rollout_pb2
from tests import factories
from tests.factories import NO_EVAL, learner_process
from tests.reliability.conftest import Rollout, metrics_text
from tests.waits import scaled, wait_until


class HealthWatch:
    """Every status a server's health Watch stream sends, until the stream ends."""

    def __init__(self, address: str) -> None:
        self.statuses: list[str] = []
        self._channel = open_channel(address)
        self._call = health_pb2_grpc.HealthStub(self._channel).Watch(
            health_pb2.HealthCheckRequest(service=""))
        self.ended = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for reply in self._call:
                self.statuses.append(health_pb2.HealthCheckResponse.ServingStatus.Name(
                    reply.status))
        except grpc.RpcError:
            pass  # the server went away: the stream ends
        finally:
            self.ended.set()

    def close(self) -> None:
        self._call.cancel()
        self._channel.close()


def active_groups(address: str) -> int:
    return RpcClient(address, timeout_s=5).call(Rollout, "GetStatus",
                                                rollout_pb2.StatusRequest()).active_groups


def wait_for_a_far_version(address: str) -> tuple[threading.Thread, dict]:
    """A group admitted and waiting for a version that never comes (in flight when the
    engine dies); the thread puts its (code, trajectories, details) under "result"."""
    waiting: dict = {}
    far = rollout_pb2.GroupRequest(
        task=common_pb2.TaskSpec(task="maze_2d", seed=1, size=7, max_turns=2), group_size=1,
        sampling=rollout_pb2.SamplingParams(temperature=1.0, max_new_tokens=2),
        idempotency_key=uuid.uuid4().hex, min_adapter_version=10**6)

    def run() -> None:
        # one attempt, as the pool's client makes (a channel retry is not the replica's)
        client = RpcClient(address, timeout_s=scaled(900), max_attempts=1)
        try:
            waiting["result"] = (grpc.StatusCode.OK, list(client.stream(
                Rollout, "RolloutGroup", far)), "")
        except grpc.RpcError as err:
            waiting["result"] = (err.code(), [], err.details() or "")
        finally:
            client.close()

    waiter = threading.Thread(target=run, daemon=True)
    waiter.start()
    wait_until("the waiting group admitted", lambda: active_groups(address) == 1)
    return waiter, waiting


def listed(redis_url: str) -> set[str]:
    return {r.replica_id for r in ReplicaDirectory(connect(redis_url)).live()}


def test_an_hf_replica_whose_engine_died_takes_itself_out(
        redis_url: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    from rlfleet_rollout.server import build_replica
    from rlfleet_rollout.settings import RolloutSettings

    settings = RolloutSettings(
        env_address="127.0.0.1:1", model=tiny_model_dir, redis_url=redis_url,
        runs_root=tmp_path, run="dead", replica_id="hf-dead", port=0, metrics_port=None,
        auth="none", grace_s=1, adapter_wait_s=600,
        heartbeat_s=0.2, heartbeat_ttl_s=600)  # gone from Redis means removed, not expired
    replica = build_replica(settings)
    watch = None
    try:
        replica.server.start(serving=False)
        replica.until_ready()
        replica.server.set_serving(True)
        address = f"127.0.0.1:{replica.server.port}"
        assert replica.engine_dead is None
        assert "hf-dead" in listed(redis_url)
        watch = HealthWatch(address)
        wait_until("the watch to see SERVING", lambda: "SERVING" in watch.statuses)
        waiter, waiting = wait_for_a_far_version(address)

        replica.batcher.engine.close()  # the engine dies under a running replica

        wait_until("the replica to stop serving", watch.ended.is_set, timeout_s=60)
        waiter.join(timeout=scaled(60))
        code, _, details = waiting["result"]
        assert code == grpc.StatusCode.UNAVAILABLE and "engine is dead" in details, details
        assert watch.statuses[0] == "SERVING" and watch.statuses[-1] == "NOT_SERVING"
        assert "engine is closed" in (replica.engine_dead or "")
        assert "hf-dead" not in listed(redis_url)  # removed, with 600 s of TTL left
        assert check(address, timeout_s=2) == "UNAVAILABLE"  # the server is gone
    finally:
        if watch is not None:
            watch.close()
        replica.stop()
        replica.server.stop(grace_s=0)
        replica.close()


RUN = "dead-engine"
STEPS = 4
GROUPS_PER_STEP = 2


def engine_cores(pid: int) -> list[psutil.Process]:
    """vLLM's engine core processes under the replica process `pid`."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def metric_sum(proc_metrics_url: str, name: str) -> float:
    """A counter of a process's /metrics, summed over its labels."""
    port = int(proc_metrics_url.rsplit(":", 1)[1].split("/")[0])
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics_text(port).splitlines()
               if line.startswith(f"{name}{{") or line.startswith(f"{name} "))


def pool_failures(output: str, replica: str) -> list[dict]:
    """The pool's "group failed on a replica" lines (one per group) naming `replica`."""
    out = []
    for line in output.splitlines():
        try:
            doc = json.loads(line) if line.startswith("{") else None
        except json.JSONDecodeError:
            continue
        if doc and doc.get("replica") == replica and "re-sending" in doc.get("msg", ""):
            out.append(doc)
    return out


@pytest.fixture
def stack(tmp_path: Path, procs, tiny_model_dir: Path):  # noqa: ANN201
    python = default_venv_python()
    assert python.exists(), (
        f"the vLLM venv is missing at {python}: run scripts/setup_vllm_venv.sh (make test "
        "builds it); vllm tests never skip")
    s = start_stack(tmp_path, runs_root=tmp_path / "runs", run=RUN, model_dir=tiny_model_dir,
                    replicas=0, reward="task", group=procs)
    s.add_replica("rollout-hf", "--heartbeat-ttl-s", "3")
    s.add_replica("rollout-vllm", "--heartbeat-ttl-s", "600", "--adapter-wait-s", "600",
                  "--engine", "vllm", "--engine-args", '{"dtype": "float32"}',
                  python=str(python))
    yield s
    s.close()


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm")
@pytest.mark.slow
def test_a_vllm_replica_whose_engine_core_is_killed_leaves_and_the_run_finishes(
        stack: LocalStack, tmp_path: Path, tiny_model_dir: Path) -> None:
    hf, vllm = stack.replicas
    assert {"rollout-hf", "rollout-vllm"} <= listed(stack.redis_url)
    (core,) = engine_cores(vllm.popen.pid)
    watch = HealthWatch(vllm.address or "")
    waiter, waiting = wait_for_a_far_version(vllm.address or "")

    config = factories.learner_config(
        stack, tmp_path, RUN, model_dir=tiny_model_dir, steps=STEPS, mode="sync",
        data={"groups_per_step": GROUPS_PER_STEP, "group_size": 2, "max_turns": 3},
        eval=NO_EVAL, checkpoint={"every": 0}, ray={"num_workers": 1},
        fleet={"max_groups_in_flight": GROUPS_PER_STEP, "min_replicas": 1})
    metrics = RunsRoot(stack.runs_root).metrics_path(RUN)
    proc = learner_process(config)
    try:
        # the vLLM replica is in use: it has streamed a trajectory of the run
        wait_until("a trajectory from the vLLM replica", lambda: proc.poll() is None and
                   metric_sum(vllm.extra["metrics_url"],
                              "rlfleet_rollout_trajectories_total") > 0, timeout_s=900)
        killed_at = time.time()
        os.kill(core.pid, signal.SIGKILL)

        wait_until("the vLLM replica to exit", lambda: not vllm.alive, timeout_s=300)
        out, _ = proc.communicate(timeout=scaled(900))
    finally:
        watch.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # the replica took itself out: NOT_SERVING, out of Redis (600 s of TTL were left),
    # exit non-zero naming the cause
    assert vllm.popen.returncode not in (0, None)
    assert watch.statuses[:1] == ["SERVING"] and "NOT_SERVING" in watch.statuses
    assert "rollout-vllm" not in listed(stack.redis_url)
    assert "the engine died" in vllm.log_tail(50)
    # the group waiting on it was answered at once, UNAVAILABLE (re-sendable), not after
    # its 600 s wait nor with FAILED_PRECONDITION
    waiter.join(timeout=scaled(60))
    code, _, details = waiting["result"]
    assert code == grpc.StatusCode.UNAVAILABLE and "engine is dead" in details, details
    # the run finished on the hf replica: every step once, every seed once
    assert proc.returncode == 0, out
    steps = lineage_steps(read_events(metrics))
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert any(s["time"] > killed_at for s in steps)  # steps were played after the kill
    seeds = [seed for s in steps for seed in s["seeds"]]
    assert len(seeds) == len(set(seeds)) == STEPS * GROUPS_PER_STEP
    # the dead replica failed only groups it held when it died (never re-sent to it,
    # never cleared by a GetStatus), each re-sendable
    failures = pool_failures(out, "rollout-vllm")
    assert len(failures) <= GROUPS_PER_STEP, failures
    assert all(f["code"] in ("UNAVAILABLE", "CANCELLED") for f in failures), failures
    assert hf.alive and check(hf.address or "") == "SERVING"
    assert "Traceback" not in out, out
