"""Attacks on the running fleet, each reproduced on real processes.

- 7: unauthenticated clients cannot freeze a service. Streams that send headers and never
  a body are refused at the headers (UNAUTHENTICATED, no worker held), authenticated and
  health calls that never send their body are cut off by the server's request bound, and
  meanwhile health and authenticated calls are answered; 60 MiB unauthenticated bodies
  are refused without being read (the server's RSS does not grow).
- 8: an empty token (RLFLEET_AUTH_TOKEN="" or a token file holding only a newline), or no
  token at all, refuses to start every service; `--insecure-no-auth` turns auth off.
- 9: Redis access is not enough: a forged heartbeat pointing at an attacker's server
  (which records the token it receives) gets no group and no token; forged heartbeats do
  not satisfy WaitForReplicas(version=999999, min_replicas=5); a forged `latest` of 2**40
  neither blocks later publishes nor survives ckpt-sync's reconciliation.
- 10: mTLS end to end: every service and every outgoing client (replica -> env/reward and
  ckpt-sync, learner -> replicas and ckpt-sync) uses the fleet's certificates.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from concurrent import futures
from concurrent.futures import Future
from pathlib import Path

import grpc
import pytest
import yaml

from rlfleet.clients.rollout_pool import RolloutPool
from rlfleet.fleet import AdapterDirectory, ReplicaDirectory, connect, fleet_signing_key, keys
from rlfleet.fleet.identity import sign_document
from rlfleet.local.procs import Proc, free_port, rlfleet_argv
from rlfleet.rpc import RpcClient
from rlfleet.rpc.client import open_channel
from rlfleet.rpc.health import check
from rlfleet.v1 import (
    common_pb2,
    env_pb2,
    env_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
    sync_pb2,
)
from tests.reliability.conftest import (
    Fleet,
    Sync,
    assert_exactly_once,
    group,
    metric_value,
    wait_until,
)
from tests.reliability.test_security import _tls_files

SC = grpc.StatusCode
REQUEST_TIMEOUT_S = 3.0
STREAMS = 96  # of each kind; the default worker pool used to be 64 threads
MIB = 1 << 20


# -- 7: header-only streams and large unauthenticated bodies -------------------------------


class HeaderOnly:
    """Calls that send their headers and never a body (the request iterator blocks), on
    real gRPC channels; `codes()` waits for each call's final status."""

    def __init__(self, address: str, method: str, n: int, metadata: tuple = ()) -> None:
        self._release = threading.Event()
        self.channels = [grpc.insecure_channel(address) for _ in range(max(1, n // 32))]
        self.calls: list[Future] = []
        for i in range(n):
            channel = self.channels[i % len(self.channels)]
            rpc = channel.stream_unary(method, request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)
            self.calls.append(rpc.future(self._never(), metadata=metadata or None))

    def _never(self) -> Iterator[bytes]:
        self._release.wait()
        return
        yield b""  # a generator that yields nothing until released

    def codes(self, timeout_s: float = 120) -> list[SC]:
        out = []
        for call in self.calls:
            try:
                call.result(timeout=timeout_s)
                out.append(SC.OK)
            except grpc.RpcError as err:
                out.append(err.code())
        return out

    def details(self) -> set[str]:
        return {c.exception().details() for c in self.calls if c.exception() is not None}

    def close(self) -> None:
        self._release.set()
        for call in self.calls:
            call.cancel()
        for channel in self.channels:
            channel.close()


def rss_bytes(proc: Proc) -> int:
    for line in Path(f"/proc/{proc.popen.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_unauthenticated_clients_cannot_freeze_a_service(fleet: Fleet) -> None:
    token = "tok-" + secrets.token_hex(16)
    env = {"RLFLEET_AUTH_TOKEN": token, "RLFLEET_REQUEST_TIMEOUT_S": str(REQUEST_TIMEOUT_S)}
    fleet.start_redis()
    fleet.start_env(env=env)
    fleet.start_sync(env=env)
    bearer = (("authorization", f"Bearer {token}"),)
    targets = {"env": (fleet.env, "/rlfleet.v1.EnvService/Step"),
               "ckpt-sync": (fleet.sync, "/rlfleet.v1.SyncService/Publish")}
    summary = {}
    for name, (proc, method) in targets.items():
        address = proc.address or ""
        # header-only streams without a token: refused at the headers, body never read
        unauth = HeaderOnly(address, method, STREAMS)
        assert unauth.codes(timeout_s=60) == [SC.UNAUTHENTICATED] * STREAMS, name
        unauth.close()
        # header-only streams that hold on: authenticated ones, and health checks
        held = HeaderOnly(address, method, STREAMS, metadata=bearer)
        probes = HeaderOnly(address, "/grpc.health.v1.Health/Check", STREAMS)
        more = HeaderOnly(address, method, STREAMS)  # and more unauthenticated ones
        try:
            # the service still answers, while all of those are open
            assert check(address, timeout_s=10) == "SERVING", name
            with open_channel(address, token=token) as channel:
                if name == "env":
                    reply = env_pb2_grpc.EnvServiceStub(channel).ListTasks(
                        env_pb2.ListTasksRequest(), timeout=10)
                    assert reply.tasks
                else:
                    with pytest.raises(grpc.RpcError) as err:  # answered, not hung
                        Sync(channel).GetLatest(sync_pb2.GetLatestRequest(run=fleet.run),
                                                timeout=10)
                    assert err.value.code() == SC.NOT_FOUND
            # the server cuts the held calls off (the clients set no deadline)
            held_codes, probe_codes = held.codes(), probes.codes()
            assert held_codes == [SC.DEADLINE_EXCEEDED] * STREAMS, name
            assert probe_codes == [SC.DEADLINE_EXCEEDED] * STREAMS, name
            assert any("did not arrive within" in d for d in held.details())
            assert more.codes(timeout_s=60) == [SC.UNAUTHENTICATED] * STREAMS, name
        finally:
            for calls in (held, probes, more):
                calls.close()
        # 60 MiB unauthenticated bodies: refused without being read or parsed
        body = b"\x0a" + b"\xff" * (60 * MIB)
        before = rss_bytes(proc)
        with grpc.insecure_channel(address, options=[
                ("grpc.max_send_message_length", 128 * MIB)]) as channel:
            raw = channel.unary_unary(method, request_serializer=lambda b: b,
                                      response_deserializer=lambda b: b)
            for _ in range(6):
                with pytest.raises(grpc.RpcError) as err:
                    raw(body, timeout=60)
                assert err.value.code() == SC.UNAUTHENTICATED, name
        grown = rss_bytes(proc) - before
        assert grown < 100 * MIB, f"{name}: RSS grew by {grown / MIB:.0f} MiB"
        assert check(address) == "SERVING" and proc.alive
        summary[name] = round(grown / MIB, 1)
        log = proc.log_path.read_text()
        assert "Traceback" not in log and "unhandled error" not in log, name
    print(f"per service: {STREAMS} + {STREAMS} header-only unauthenticated streams "
          f"UNAUTHENTICATED, {STREAMS} authenticated + {STREAMS} health header-only streams "
          f"cut off with DEADLINE_EXCEEDED after {REQUEST_TIMEOUT_S:g}s, health and calls "
          f"answered meanwhile; RSS growth after 6 x 60 MiB unauthenticated bodies (MiB): "
          f"{summary}")


# -- 8: an empty token refuses to start every service ------------------------------------


def _exited_with(proc: Proc, wanted: str) -> str:
    wait_until(f"{proc.name} to exit", lambda: not proc.alive, timeout_s=300)
    log = proc.log_path.read_text()
    assert proc.popen.returncode not in (0, None), log
    assert wanted in log, log
    assert "Traceback" not in log, log
    return log


@pytest.mark.slow
def test_empty_or_missing_token_refuses_to_start(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start_redis()
    newline = tmp_path / "token"
    newline.write_text("\n")
    services = {
        "env": rlfleet_argv("env", "serve", "--port", str(free_port()), "--metrics-port",
                            str(free_port())),
        "ckptsync": rlfleet_argv("ckptsync", "serve", "--port", str(free_port()),
                                 "--metrics-port", str(free_port()), "--redis-url",
                                 fleet.redis_url, "--runs-root", str(fleet.root.root)),
        "rollout": rlfleet_argv("rollout", "serve", "--port", str(free_port()),
                                "--metrics-port", str(free_port()), "--model",
                                str(fleet.model_dir), "--redis-url", fleet.redis_url,
                                "--runs-root", str(fleet.root.root)),
    }
    # even with RLFLEET_AUTH=none an empty token is refused: it is a mistake, not a choice
    cases = {
        "empty variable": ({"RLFLEET_AUTH_TOKEN": "", "RLFLEET_AUTH": "none"},
                           "RLFLEET_AUTH_TOKEN is set but empty"),
        "newline file": ({"RLFLEET_AUTH_TOKEN_FILE": str(newline), "RLFLEET_AUTH": "none"},
                         "is empty"),
        "no token": ({"RLFLEET_AUTH": "token"}, "no auth token"),
    }
    started = [(fleet.procs.start(f"{service}-{case.replace(' ', '-')}", argv, env=env),
                wanted)
               for service, argv in services.items()
               for case, (env, wanted) in cases.items()]  # all at once: they only start
    refused = 0
    for proc, wanted in started:
        log = _exited_with(proc, wanted)
        assert "--insecure-no-auth" in log  # the message says how to turn auth off
        refused += 1
    # turning auth off takes the explicit flag
    port = free_port()
    proc = fleet.procs.start_service("env-insecure", rlfleet_argv(
        "env", "serve", "--port", str(port), "--metrics-port", str(free_port()),
        "--insecure-no-auth"), f"127.0.0.1:{port}", env={"RLFLEET_AUTH": "token"})
    assert "auth is off" in proc.log_path.read_text()
    assert RpcClient(proc.address or "").call(env_pb2_grpc.EnvServiceStub, "ListTasks",
                                              env_pb2.ListTasksRequest()).tasks
    print(f"empty/missing token: {refused} of {len(services) * len(cases)} service starts "
          "refused with a clear message; --insecure-no-auth starts")


# -- 9: forged fleet store entries -------------------------------------------------------


class Attacker(rollout_pb2_grpc.RolloutServiceServicer):
    """A rollout server that records every authorization header it receives and answers
    with forged rewards."""

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.calls = 0

    def _record(self, context: grpc.ServicerContext) -> None:
        self.calls += 1
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                self.tokens.append(value)

    def RolloutGroup(self, request, context):  # noqa: N802, ANN001, ANN201
        self._record(context)
        for i in range(request.group_size):
            yield rollout_pb2.Trajectory(idempotency_key=request.idempotency_key, index=i,
                                         reward=10.0, replica_id="attacker")

    def GetStatus(self, request, context):  # noqa: N802, ANN001, ANN201
        self._record(context)
        return rollout_pb2.ReplicaStatus(replica_id="attacker", max_groups=64,
                                         max_episodes=1024)


@pytest.mark.slow
def test_redis_access_cannot_steal_the_token_or_forge_replicas(fleet: Fleet) -> None:
    token = "tok-" + secrets.token_hex(16)
    env = {"RLFLEET_AUTH_TOKEN": token}
    fleet.token = token
    fleet.start_redis()
    fleet.start_env(env=env)
    fleet.start_sync(env=env)
    ra, rb = fleet.start_replicas(["ra", "rb"], env=env)
    redis = connect(fleet.redis_url)
    attacker = Attacker()
    server = grpc.server(futures.ThreadPoolExecutor(8))
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(attacker, server)
    evil = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()

    # what an attacker with Redis access writes: heartbeats pointing at its server
    real = json.loads(redis.get(keys.replica("ra")))
    assert real.get("mac")  # the replica's heartbeat is signed
    bait = {"run": fleet.run, "address": evil, "adapter_version": 999_999,
            "active_episodes": 0, "max_groups": 64, "max_episodes": 1024}
    forged = {
        "evil-unsigned": {**real, **bait, "replica_id": "evil-unsigned", "mac": ""},
        "evil-moved": {**real, "address": evil, "adapter_version": 999_999},  # ra's, edited
        "evil-renamed": {**real, **bait, "replica_id": "evil-renamed"},
        "evil-random-mac": {**real, **bait, "replica_id": "evil-random-mac",
                            "mac": secrets.token_hex(32)},
        "evil-guessed-key": sign_document(fleet_signing_key("not-the-token"), {
            **{k: v for k, v in real.items() if k != "mac"}, **bait,
            "replica_id": "evil-guessed-key"}, ttl_s=600),
    }

    def plant() -> None:
        for name, doc in forged.items():
            redis.set(keys.replica(name), json.dumps(doc), px=600_000)

    plant()
    assert len(ReplicaDirectory(redis).live()) == 2 + len(forged)  # Redis alone lists them

    # the learner's pool (with the fleet's token) sees only the replicas that prove it
    pool = RolloutPool(redis_url=fleet.redis_url, run=fleet.run, token=token)
    assert {r.address for r in pool.replicas()} == {ra.address, rb.address}
    requests = [group(seed=1_001_300 + i) for i in range(4)]
    results = list(pool.run_groups(requests, max_in_flight=4))
    assert assert_exactly_once(requests, results) == 8
    assert {t.replica_id for _, ts in results for t in ts} <= {"ra", "rb"}
    assert all(t.reward <= 1.0 for _, ts in results for t in ts)  # no forged 10.0
    assert attacker.calls == 0 and attacker.tokens == []  # the token never went there
    pool.close()

    # forged heartbeats claiming version 999999 do not satisfy WaitForReplicas
    sync = fleet.sync_client()
    with pytest.raises(grpc.RpcError) as err:
        sync.call(Sync, "WaitForReplicas", sync_pb2.WaitForReplicasRequest(
            run=fleet.run, version=999_999, min_replicas=5, timeout_s=3), timeout_s=20)
    assert err.value.code() == SC.DEADLINE_EXCEEDED
    assert "0 of 5" in err.value.details()

    # a forged latest of 2**40 blocks no publish ...
    huge = 2**40
    fake_latest = json.dumps({"run": fleet.run, "version": huge, "sha256": "0" * 64,
                              "path": f"{fleet.run}/adapters/v{huge}", "step": 0,
                              "published_at": 0.0})
    redis.set(keys.latest(fleet.run), fake_latest)
    fleet.write_version(1)
    reply = sync.call(Sync, "Publish", sync_pb2.PublishRequest(
        adapter=common_pb2.AdapterRef(run=fleet.run, version=1)))
    assert reply.adapter.version == 1
    adapters = AdapterDirectory(redis)
    assert adapters.latest(fleet.run).version == 1
    assert sorted(fleet.wait_replicas(1, 2)) == ["ra", "rb"]
    # ... and does not survive the reconciler, which rebuilds latest from /shared
    redis.set(keys.latest(fleet.run), fake_latest)
    wait_until("ckpt-sync to replace the forged latest",
               lambda: adapters.latest(fleet.run).version == 1, timeout_s=30)
    redis.set(keys.latest(fleet.run), fake_latest)
    fleet.publish(2)
    assert sorted(fleet.wait_replicas(2, 2)) == ["ra", "rb"]
    replaced = metric_value(fleet.sync.extra["metrics_port"],
                            "rlfleet_sync_unbacked_latest_replaced_total")
    assert replaced >= 3
    assert {fleet.status(p).adapter.version for p in (ra, rb)} == {2}
    # the attacker never got a call, the forged keys are still in Redis, still ignored
    plant()
    assert len(ReplicaDirectory(redis, fleet_signing_key(token)).live()) == 2
    assert attacker.calls == 0 and attacker.tokens == []
    server.stop(0)
    print(f"forged registry: {len(forged)} forged heartbeats ignored by the pool and "
          f"ckpt-sync; 4 groups / 8 trajectories exactly once on ra/rb, 0 calls and 0 tokens "
          f"at the attacker; WaitForReplicas(999999, 5) DEADLINE_EXCEEDED (0 of 5); forged "
          f"latest 2**40 replaced {replaced:.0f} times, publishes v1, v2 served by both")


@pytest.mark.slow
def test_a_replica_port_taken_over_gets_no_token_and_has_nothing_accepted(fleet: Fleet
                                                                          ) -> None:
    """As reproduced: a replica is SIGKILLed and another server binds its
    port while its heartbeat is still valid. The learner's pool (with the token) calls it:
    the server learns no token (only per-call proofs, each good for one method and one
    minute), cannot prove its answers, and every group is trained on the live replica."""
    token = "tok-" + secrets.token_hex(16)
    env = {"RLFLEET_AUTH_TOKEN": token}
    fleet.token = token
    fleet.start_redis()
    fleet.start_env(env=env)
    fleet.start_sync(env=env)
    # a long heartbeat TTL: the dead replica stays listed while the attacker holds its port
    ra, rb = fleet.start_replicas(["ra", "rb"], "--heartbeat-ttl-s", "60", env=env)
    pool = RolloutPool(redis_url=fleet.redis_url, run=fleet.run, token=token,
                       stream_timeout_s=120)
    assert {r.address for r in pool.replicas()} == {ra.address, rb.address}

    fleet.procs.kill(ra)  # SIGKILL: its heartbeat stays in the fleet store until its TTL
    attacker = Attacker()
    server = grpc.server(futures.ThreadPoolExecutor(8))
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(attacker, server)
    wait_until("the attacker to bind the dead replica's port",
               lambda: server.add_insecure_port(ra.address or "") != 0, timeout_s=10)
    server.start()
    try:
        assert ra.address in {r.address for r in pool.replicas()}  # still listed
        requests = [group(seed=1_001_400 + i) for i in range(6)]
        results = list(pool.run_groups(requests, max_in_flight=6))
        assert assert_exactly_once(requests, results) == 12
        assert {t.replica_id for _, ts in results for t in ts} == {"rb"}
        assert all(t.reward <= 1.0 for _, ts in results for t in ts)  # no forged 10.0
        assert attacker.calls > 0  # it was called: the port was really taken over ...
        assert attacker.tokens and all(token not in v and not v.startswith("Bearer")
                                       for v in attacker.tokens)  # ... and got no token
    finally:
        pool.close()
        server.stop(0)
    print(f"port takeover: {attacker.calls} calls reached the server on ra's port, 0 tokens "
          f"({len(attacker.tokens)} one-call proofs), 0 of its answers accepted; 6 groups / "
          "12 trajectories exactly once on rb")


# -- 10: mTLS end to end ---------------------------------------------------------------


@pytest.mark.slow
def test_mutual_tls_fleet_end_to_end(fleet: Fleet, tmp_path: Path) -> None:
    files = _tls_files(tmp_path)
    ca = Path(f"{files['ca']}.crt")
    cert, key = Path(f"{files['fleet']}.crt"), Path(f"{files['fleet']}.key")
    config = tmp_path / "tls.yaml"
    config.write_text(yaml.safe_dump({"tls_cert": str(cert), "tls_key": str(key),
                                      "tls_client_ca": str(ca)}))
    tls = {"ca_file": ca, "cert_file": cert, "key_file": key}
    token = "tok-" + secrets.token_hex(16)
    env = {"RLFLEET_AUTH_TOKEN": token}
    fleet.token, fleet.tls = token, tls
    fleet.start_redis()
    fleet.start_env("env", None, "--config", str(config), env=env, tls=tls)
    fleet.start_sync("ckptsync", "--config", str(config), env=env, tls=tls)
    (ra,) = fleet.start_replicas(["ra"], "--config", str(config), env=env, tls=tls)

    # plaintext and a rogue certificate are refused by every service
    rogue = {"ca_file": ca, "cert_file": Path(f"{files['rogue']}.crt"),
             "key_file": Path(f"{files['rogue']}.key")}
    for proc in (fleet.env, fleet.sync, ra):
        assert check(proc.address or "") != "SERVING"  # plaintext
        assert check(proc.address or "", tls=rogue) != "SERVING"
        assert check(proc.address or "", tls=tls) == "SERVING"

    # learner -> ckpt-sync (TLS), replica -> ckpt-sync (its acknowledgement, TLS)
    fleet.publish(1)
    assert fleet.wait_replicas(1, 1) == ["ra"]
    acks = AdapterDirectory(connect(fleet.redis_url), fleet_signing_key(token)).acks(fleet.run, 1)
    assert "ra" in acks  # ckpt-sync recorded the replica's signed acknowledgement
    # learner -> replica (TLS), replica -> env/reward (TLS)
    pool = RolloutPool(redis_url=fleet.redis_url, run=fleet.run, token=token, tls=tls)
    requests = [group(seed=1_001_400 + i, min_version=1) for i in range(2)]
    results = list(pool.run_groups(requests))
    assert assert_exactly_once(requests, results) == 4
    assert {t.adapter.version for _, ts in results for t in ts} == {1}
    pool.close()
    # a pool without the client certificate cannot reach the replica
    plain = RolloutPool(addresses=[ra.address or ""], run=fleet.run, token=token,
                        max_attempts=1, wait_for_replicas_s=1)
    with pytest.raises(RuntimeError, match="UNAVAILABLE"):  # its one attempt fails
        list(plain.run_groups([group(seed=1_001_410)]))
    plain.close()
    print("mTLS fleet: env, ckpt-sync and a replica on TLS with client certificates; "
          "plaintext and rogue clients refused by all 3; publish, acknowledgement and "
          "2 groups / 4 trajectories exactly once over TLS")
