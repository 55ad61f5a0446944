"""The fleet as real processes for fault-injection tests: Redis, env/reward service(s),
ckpt-sync and rollout replicas on loopback, with fixed ports so that a killed process can
come back at the same address (as a Kubernetes Service keeps its address)."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from rlfleet.clients.sync import SyncClient
from rlfleet.local.procs import Proc, ProcessGroup, free_port, rlfleet_argv
from rlfleet.local.redis import start_redis
from rlfleet.local.stack import LocalStack, start_stack
from rlfleet.rpc import RpcClient
from rlfleet.rpc.health import check
from rlfleet.storage import AdapterManifest, RunsRoot, list_checkpoints, publish_adapter_dir
from rlfleet.v1 import (
    common_pb2,
    env_pb2,
    env_pb2_grpc,
    reward_pb2,
    reward_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
    sync_pb2,
    sync_pb2_grpc,
)
from tests.factories import SFT
from tests.waits import scaled, wait_until  # noqa: F401 - re-exported to the tests

Rollout = rollout_pb2_grpc.RolloutServiceStub
Sync = sync_pb2_grpc.SyncServiceStub

# (service stub, method, request type, server streaming)
METHODS = {
    "EnvService/Open": (env_pb2_grpc.EnvServiceStub, env_pb2.OpenRequest, False),
    "EnvService/Step": (env_pb2_grpc.EnvServiceStub, env_pb2.StepRequest, False),
    "EnvService/Close": (env_pb2_grpc.EnvServiceStub, env_pb2.CloseRequest, False),
    "EnvService/ListTasks": (env_pb2_grpc.EnvServiceStub, env_pb2.ListTasksRequest, False),
    "RewardService/Score": (reward_pb2_grpc.RewardServiceStub, reward_pb2.ScoreRequest, False),
    "RewardService/Info": (reward_pb2_grpc.RewardServiceStub, reward_pb2.RewardInfoRequest,
                           False),
    "RolloutService/RolloutGroup": (rollout_pb2_grpc.RolloutServiceStub,
                                    rollout_pb2.GroupRequest, True),
    "RolloutService/GetStatus": (rollout_pb2_grpc.RolloutServiceStub, rollout_pb2.StatusRequest,
                                 False),
    "SyncService/Publish": (sync_pb2_grpc.SyncServiceStub, sync_pb2.PublishRequest, False),
    "SyncService/GetLatest": (sync_pb2_grpc.SyncServiceStub, sync_pb2.GetLatestRequest, False),
    "SyncService/WaitForReplicas": (sync_pb2_grpc.SyncServiceStub,
                                    sync_pb2.WaitForReplicasRequest, False),
    "SyncService/Acknowledge": (sync_pb2_grpc.SyncServiceStub, sync_pb2.AcknowledgeRequest,
                                False),
}

_LORA_CACHE: dict[tuple[str, int], dict[str, bytes]] = {}


def lora_files(model_dir: Path, seed: int) -> dict[str, bytes]:
    """A real LoRA adapter for the tiny policy (built once per seed per session)."""
    from tests.factories import tiny_lora_files

    key = (str(model_dir), seed)
    if key not in _LORA_CACHE:
        _LORA_CACHE[key] = tiny_lora_files(model_dir, seed)
    return _LORA_CACHE[key]


def group(seed: int = 1_000_001, g: int = 2, turns: int = 3, key: str | None = None,
          min_version: int = 0, max_new_tokens: int = 3) -> rollout_pb2.GroupRequest:
    return rollout_pb2.GroupRequest(
        task=common_pb2.TaskSpec(task="maze_2d", seed=seed, size=7, max_turns=turns),
        group_size=g,
        sampling=rollout_pb2.SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens),
        idempotency_key=key or uuid.uuid4().hex, min_adapter_version=min_version)


def assert_exactly_once(requests: Iterable[rollout_pb2.GroupRequest],
                        results: Iterable[tuple[rollout_pb2.GroupRequest,
                                                list[rollout_pb2.Trajectory]]]) -> int:
    """Every request came back once, with every index once; returns the trajectory count."""
    wanted = {r.idempotency_key: r.group_size for r in requests}
    got: dict[str, list[int]] = {}
    for request, trajectories in results:
        assert request.idempotency_key not in got, "a group came back twice"
        assert {t.idempotency_key for t in trajectories} == {request.idempotency_key}
        # the order a group's episodes finish in is not the contract; each index once is
        got[request.idempotency_key] = sorted(t.index for t in trajectories)
    assert set(got) == set(wanted), "a group is missing"
    for key, indices in got.items():
        assert indices == list(range(wanted[key])), f"group {key}: indices {indices}"
    return sum(len(v) for v in got.values())


def metric_total(name: str) -> float:
    """Sum of a counter in this (the test's) process, e.g. the pool's retries."""
    from prometheus_client import REGISTRY

    return sum(sample.value for metric in REGISTRY.collect() if metric.name == name
               for sample in metric.samples if sample.name.endswith("_total"))


@dataclass
class Fleet:
    procs: ProcessGroup
    root: RunsRoot
    run: str
    model_dir: Path
    redis_url: str = ""
    redis: Proc | None = None
    redis_port: int = 0
    envs: dict[str, Proc] = field(default_factory=dict)
    sync: Proc | None = None
    sync_port: int = 0
    replicas: dict[str, Proc] = field(default_factory=dict)
    # what the test's own clients (sync_client, status) use: the fleet's token and TLS
    token: str | None = None
    tls: dict | None = None

    # -- processes -------------------------------------------------------------------

    def start_redis(self, name: str = "redis", password: str | None = None) -> Proc:
        self.redis_port = self.redis_port or free_port()
        self.redis, self.redis_url = start_redis(self.procs, port=self.redis_port, name=name,
                                                 password=password)
        return self.redis

    def start_env(self, name: str = "env", port: int | None = None, *extra: str,
                  env: dict[str, str] | None = None, tls: dict | None = None) -> Proc:
        """`tls`: the client TLS options the readiness check needs (a TLS service)."""
        port = port or free_port()
        metrics = free_port()
        address = f"127.0.0.1:{port}"
        proc = self.procs.start_service(
            name, rlfleet_argv("env", "serve", "--port", str(port), "--metrics-port",
                               str(metrics), *extra), address, env=env,
            ready=(lambda: check(address, tls=tls) == "SERVING") if tls else None)
        proc.extra["port"], proc.extra["metrics_port"] = port, metrics
        self.envs[name] = proc
        return proc

    @property
    def env(self) -> Proc:
        return next(iter(self.envs.values()))

    def start_sync(self, name: str = "ckptsync", *extra: str,
                   env: dict[str, str] | None = None, tls: dict | None = None) -> Proc:
        self.sync_port = self.sync_port or free_port()
        metrics = free_port()
        address = f"127.0.0.1:{self.sync_port}"
        self.sync = self.procs.start_service(
            name, rlfleet_argv("ckptsync", "serve", "--port", str(self.sync_port),
                               "--metrics-port", str(metrics), "--redis-url", self.redis_url,
                               "--runs-root", str(self.root.root), *extra),
            address, env=env,
            ready=(lambda: check(address, tls=tls) == "SERVING") if tls else None)
        self.sync.extra["metrics_port"] = metrics
        return self.sync

    def start_replicas(self, names: Iterable[str], *extra: str, env_address: str = "",
                       env: dict[str, str] | None = None, fleet_store: bool = True,
                       env_addresses: dict[str, str] | None = None,
                       timeout_s: float = 240.0, tls: dict | None = None,
                       wait: bool = True) -> list[Proc]:
        """Starts several replicas at once (they load the model in parallel) and waits
        until every one is SERVING (`wait`). `env_addresses` gives some replicas their own
        env; `tls`: the client TLS options the readiness check needs."""
        started = []
        for name in names:
            port, metrics = free_port(), free_port()
            argv = rlfleet_argv(
                "rollout", "serve", "--port", str(port), "--metrics-port", str(metrics),
                "--model", str(self.model_dir),
                "--env-address",
                (env_addresses or {}).get(name) or env_address or self.env.address,
                "--run", self.run, "--replica-id", name, "--runs-root", str(self.root.root),
                "--heartbeat-s", "0.5", "--heartbeat-ttl-s", "3",
                *(["--redis-url", self.redis_url] if fleet_store and self.redis_url else []),
                *(["--sync-address", self.sync.address] if self.sync else []), *extra)
            proc = self.procs.start(name, argv, env=env, address=f"127.0.0.1:{port}")
            proc.extra["metrics_port"] = metrics
            started.append(proc)
        if not wait:
            for proc in started:
                self.replicas[proc.name] = proc
            return started
        deadline = time.monotonic() + scaled(timeout_s)
        for proc in started:
            while check(proc.address or "", timeout_s=1.0, tls=tls) != "SERVING":
                if not proc.alive or time.monotonic() > deadline:
                    raise RuntimeError(f"{proc.name} did not start:\n{proc.log_tail()}")
                time.sleep(0.2)
            self.replicas[proc.name] = proc
        return started

    def close(self) -> None:
        """Stops clients of Redis before Redis (a replica's last heartbeat removal would
        otherwise wait out the Redis client's retries), then everything else."""
        for proc in [*self.replicas.values(), *([self.sync] if self.sync else []),
                     *self.envs.values()]:
            self.procs.stop(proc, grace_s=5)
        self.procs.stop_all(grace_s=5)

    # -- calls -----------------------------------------------------------------------

    def sync_client(self, **kwargs: object) -> RpcClient:
        assert self.sync is not None
        return RpcClient(self.sync.address, **{"timeout_s": 30, "token": self.token,
                                               "tls": self.tls, **kwargs})

    def sync_service(self) -> SyncClient:
        """ckpt-sync's typed client (what the learner's publisher takes)."""
        assert self.sync is not None
        return SyncClient(self.sync.address, timeout_s=30, token=self.token, tls=self.tls)

    def write_version(self, version: int, seed: int | None = None) -> AdapterManifest:
        """Writes a real adapter version to /shared (what the learner does)."""
        return publish_adapter_dir(self.root, self.run, version,
                                   lora_files(self.model_dir, seed if seed is not None
                                              else version), base_model="tiny", step=version)

    def publish(self, version: int, seed: int | None = None) -> AdapterManifest:
        """Writes a version and announces it through ckpt-sync."""
        manifest = self.write_version(version, seed)
        self.sync_client().call(Sync, "Publish", sync_pb2.PublishRequest(
            adapter=common_pb2.AdapterRef(run=self.run, version=version)))
        return manifest

    def wait_replicas(self, version: int, n: int, timeout_s: float = 60) -> list[str]:
        reply = self.sync_client().call(Sync, "WaitForReplicas", sync_pb2.WaitForReplicasRequest(
            run=self.run, version=version, min_replicas=n, timeout_s=timeout_s),
            timeout_s=timeout_s + 10)
        return list(reply.replica_ids)

    def status(self, proc: Proc) -> rollout_pb2.ReplicaStatus:
        return RpcClient(proc.address or "", timeout_s=5, token=self.token, tls=self.tls).call(
            Rollout, "GetStatus", rollout_pb2.StatusRequest())


@pytest.fixture
def fleet(procs: ProcessGroup, tmp_path: Path, tiny_model_dir: Path) -> Iterator[Fleet]:
    root = RunsRoot(tmp_path / "runs")
    root.root.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(procs, root, "rel", tiny_model_dir)
    yield fleet
    fleet.close()


def metrics_text(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def metric_value(port: int, name: str, labels: str = "") -> float:
    """One sample of a process's /metrics, e.g. ("rlfleet_x_total", 'outcome="refused"');
    0 when the sample is not exported (yet)."""
    for line in metrics_text(port).splitlines():
        if line.startswith(f"{name}{{{labels}}} " if labels else f"{name} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def stream_code(address: str, request: rollout_pb2.GroupRequest, timeout_s: float = 120,
                got: list[rollout_pb2.Trajectory] | None = None,
                ) -> tuple[grpc.StatusCode, list[rollout_pb2.Trajectory], str]:
    """Runs one group on one replica; (final code, trajectories received, details).
    `got`, when given, receives the trajectories as they arrive."""
    got = [] if got is None else got
    try:
        for t in RpcClient(address, timeout_s=timeout_s).stream(Rollout, "RolloutGroup",
                                                                request):
            got.append(t)
    except grpc.RpcError as err:
        return err.code(), got, err.details() or ""
    return grpc.StatusCode.OK, got, ""


def stopped_cleanly_after_step_1(config: Path, root: RunsRoot, run: str,
                                 fault: Callable[[], object]) -> tuple[str, str]:
    """Starts the learner on `config`, causes `fault()` once step 1 of `run` is
    checkpointed, and checks the learner then stops cleanly: exit 3, one
    "rlfleet learner: stopped: ..." line, no traceback. Returns (its output, that line)."""
    from tests.factories import learner_process

    proc = learner_process(config)
    try:
        wait_until("step 1 checkpointed", lambda: proc.poll() is None
                   and 1 in list_checkpoints(root, run), timeout_s=600)
        fault()
        out, _ = proc.communicate(timeout=scaled(600))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 3, out
    assert "Traceback" not in out, out
    stops = [line for line in out.splitlines() if "rlfleet learner: stopped:" in line]
    assert len(stops) == 1, out
    return out, stops[0]


@pytest.fixture
def stack(request: pytest.FixtureRequest, tmp_path: Path, procs: ProcessGroup
          ) -> Iterator[LocalStack]:
    """The learner tests' fleet: one replica of the shipped SFT policy, the format+task
    reward, for the test module's run (its `RUN`). A module that needs another fleet
    defines its own `stack`."""
    s = start_stack(tmp_path, runs_root=tmp_path / "runs", run=request.module.RUN,
                    model_dir=SFT, replicas=1, reward="format+task", group=procs)
    yield s
    s.close()
