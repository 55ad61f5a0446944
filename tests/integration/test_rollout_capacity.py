"""The rollout pool respects each replica's capacity: real gRPC servers on loopback running
the real RolloutServicer (admission, idempotency cache, metrics interceptor) with a
stand-in player (no model), registered in a real Redis by the replica's own Heartbeat.

Assertions are about behaviour (what was refused, retried, delivered, the most a replica
ever played at once), never about how long anything took."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
import pytest
from prometheus_client import REGISTRY

from rlfleet.clients.rollout_pool import (
    DEFAULT_CAPACITY,
    Capacity,
    InsufficientCapacity,
    RolloutPool,
)
from rlfleet.fleet import ReplicaDirectory, ReplicaInfo, connect
from rlfleet.fleet.replicas import admits
from rlfleet.rpc import RpcClient
from rlfleet.rpc.server import GrpcServer, ServerConfig
from rlfleet.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from rlfleet_rollout.idempotency import GroupCache
from rlfleet_rollout.loaded_adapters import LiveAdapter
from rlfleet_rollout.registration import Heartbeat
from rlfleet_rollout.servicer import RolloutServicer

RUN = "cap"
SERVICE = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name


def total(name: str, **labels: str) -> float:
    """A counter of this process (servers and pool run here), summed over its samples."""
    return sum(s.value for m in REGISTRY.collect() if m.name == name for s in m.samples
               if s.name.endswith("_total")
               and all(s.labels.get(k) == v for k, v in labels.items()))


def refusals() -> float:
    """RESOURCE_EXHAUSTED answers to RolloutGroup, as the servers' interceptor counts them."""
    return total("rlfleet_grpc_requests", grpc_method="RolloutGroup",
                 grpc_code="RESOURCE_EXHAUSTED")


def retries() -> float:
    return total("rlfleet_pool_group_retries")


class _Adapters:
    """The base model, always live (what a replica without a run's adapter serves)."""

    current = LiveAdapter(RUN, 0)
    max_staleness = None  # no staleness bound: nothing is ever evicted

    def is_evicted(self, adapter: LiveAdapter) -> bool:
        return False

    def wait_for(self, version: int, timeout_s: float) -> LiveAdapter | None:
        return self.current if version <= 0 else None

    def acquire(self) -> LiveAdapter:
        return self.current

    def release(self, adapter: LiveAdapter) -> None:
        pass


@dataclass
class _Player:
    """Plays each episode for `episode_s`; records what the replica was playing at every
    admission. A group whose key is in `hold` waits until that event is set."""

    replica_id: str
    episode_s: float
    servicer: RolloutServicer | None = None
    admitted: list[tuple[int, int, int]] = field(default_factory=list)  # groups, eps, size
    hold: dict[str, threading.Event] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)

    def play(self, request, adapter, is_active, queued_s: float = 0.0
             ) -> Iterator[rollout_pb2.Trajectory]:  # noqa: ANN001
        assert self.servicer is not None
        self.admitted.append((self.servicer.active_groups, self.servicer.active_episodes,
                              request.group_size))
        self.keys.append(request.idempotency_key)
        if request.idempotency_key in self.hold:
            self.hold[request.idempotency_key].wait(60)
        for i in range(request.group_size):
            time.sleep(self.episode_s)
            if not is_active():
                return
            yield rollout_pb2.Trajectory(idempotency_key=request.idempotency_key, index=i,
                                         replica_id=self.replica_id, reward_name="task")


@dataclass
class FakeReplica:
    replica_id: str
    servicer: RolloutServicer
    player: _Player
    server: GrpcServer
    heartbeat: Heartbeat | None

    @property
    def address(self) -> str:
        return self.server.address

    def kill(self) -> None:
        """Dies: streams cut, heartbeats stop, its fleet store entry lingers until the TTL."""
        if self.heartbeat is not None:
            self.heartbeat._stop.set()  # noqa: SLF001 - no clean removal: a crash
        self.server.stop(0)

    def stop(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self.server.stop(0)


@pytest.fixture
def replicas(procs) -> Iterator[Callable[..., FakeReplica]]:  # noqa: ANN001 - torn down before Redis
    started: list[FakeReplica] = []

    def start(replica_id: str, *, max_groups: int, max_episodes: int, redis_url: str = "",
              episode_s: float = 0.02) -> FakeReplica:
        player = _Player(replica_id, episode_s)
        servicer = RolloutServicer(player, _Adapters(), max_groups=max_groups,  # type: ignore[arg-type]
                                   max_episodes=max_episodes, adapter_wait_s=0,
                                   cache=GroupCache(4096), address="", engine="hf",
                                   model="none")
        player.servicer = servicer
        server = GrpcServer(f"fake-{replica_id}", ServerConfig(port=0), [
            lambda s: rollout_pb2_grpc.add_RolloutServiceServicer_to_server(servicer, s)
            or SERVICE])
        servicer.address = server.address
        heartbeat = None
        if redis_url:
            def info() -> ReplicaInfo:  # what the replica's heartbeat says (server.py)
                return ReplicaInfo(replica_id=replica_id, address=server.address, run=RUN,
                                   active_groups=servicer.active_groups,
                                   active_episodes=servicer.active_episodes, engine="fake",
                                   max_groups=servicer.max_groups,
                                   max_episodes=servicer.max_episodes)

            heartbeat = Heartbeat(ReplicaDirectory(connect(redis_url)), info, period_s=0.2,
                                  ttl_s=1.5)
        server.start()
        if heartbeat is not None:
            heartbeat.beat()
            heartbeat.start()
        replica = FakeReplica(replica_id, servicer, player, server, heartbeat)
        started.append(replica)
        return replica

    yield start
    for replica in started:
        replica.stop()


def group(g: int = 1, key: str | None = None) -> rollout_pb2.GroupRequest:
    return rollout_pb2.GroupRequest(
        task=common_pb2.TaskSpec(task="maze_2d", seed=1, size=7, max_turns=2), group_size=g,
        sampling=rollout_pb2.SamplingParams(temperature=0.0, max_new_tokens=3),
        idempotency_key=key or uuid.uuid4().hex)


def delivered_once(requests: list[rollout_pb2.GroupRequest], results: list) -> None:
    got = {}
    for request, trajectories in results:
        assert request.idempotency_key not in got, "a group came back twice"
        got[request.idempotency_key] = [t.index for t in trajectories]
    assert got == {r.idempotency_key: list(range(r.group_size)) for r in requests}


def within_limits(replica: FakeReplica) -> bool:
    """After every admission the replica was within both limits (a lone big group aside);
    `admitted` holds what it played right after each admission."""
    s = replica.servicer
    return all(groups <= s.max_groups and (episodes <= s.max_episodes or groups == 1)
               for groups, episodes, _ in replica.player.admitted)


def test_admission_rule() -> None:
    assert admits(0, 0, 64, max_groups=2, max_episodes=4)  # idle: a big group still runs
    assert admits(1, 3, 1, max_groups=2, max_episodes=4)
    assert not admits(1, 3, 2, max_groups=2, max_episodes=4)  # episodes
    assert not admits(2, 2, 1, max_groups=2, max_episodes=4)  # groups


def test_eval_burst_no_refusals_no_retries_never_over_the_limit(replicas, redis_url: str
                                                                 ) -> None:
    a = replicas("a", max_groups=2, max_episodes=3, redis_url=redis_url)
    b = replicas("b", max_groups=3, max_episodes=2, redis_url=redis_url)
    pool = RolloutPool(redis_url=redis_url, run=RUN, stream_timeout_s=60)
    assert pool.capacity() == Capacity(groups=5, episodes=5)
    assert pool.groups_that_fit(1) == 4  # a: 2 groups; b: 2 episodes
    refused, retried = refusals(), retries()
    requests = [group(1) for _ in range(120)]  # greedy eval: single-episode groups
    results = list(pool.run_groups(requests, max_in_flight=48))  # far more than fits
    delivered_once(requests, results)
    assert refusals() - refused == 0
    assert retries() - retried == 0
    assert (a.servicer.peak_groups, a.servicer.peak_episodes) == (2, 2)
    assert (b.servicer.peak_groups, b.servicer.peak_episodes) == (2, 2)
    assert within_limits(a) and within_limits(b)
    print(f"eval burst: 120 groups, {refusals() - refused:.0f} RESOURCE_EXHAUSTED, "
          f"{retries() - retried:.0f} retries; peak a {a.servicer.peak_groups}/2 groups, "
          f"b {b.servicer.peak_episodes}/2 episodes")
    pool.close()


def test_mixed_group_sizes_respect_the_episode_limit(replicas, redis_url: str) -> None:
    a = replicas("a", max_groups=3, max_episodes=4, redis_url=redis_url)
    b = replicas("b", max_groups=3, max_episodes=4, redis_url=redis_url)
    pool = RolloutPool(redis_url=redis_url, run=RUN, stream_timeout_s=60)
    refused, retried = refusals(), retries()
    sizes = [1, 2, 3, 6, 1, 1, 2, 4, 6, 3, 2, 1] * 3  # 6 > max_episodes: only on an idle one
    requests = [group(g) for g in sizes]
    results = list(pool.run_groups(requests, max_in_flight=12))
    delivered_once(requests, results)
    assert refusals() - refused == 0 and retries() - retried == 0
    assert within_limits(a) and within_limits(b)
    for r in (a, b):
        assert r.servicer.peak_groups <= 3
        # more than 4 episodes only ever as one lone big group
        assert r.servicer.peak_episodes <= 6
        assert all(groups == 1 for groups, _, size in r.player.admitted if size > 4)
    pool.close()


def test_static_addresses_read_capacity_from_get_status(replicas) -> None:
    a = replicas("a", max_groups=1, max_episodes=8)
    b = replicas("b", max_groups=2, max_episodes=2)
    status = RpcClient(a.address).call(rollout_pb2_grpc.RolloutServiceStub, "GetStatus",
                                       rollout_pb2.StatusRequest())
    assert (status.max_groups, status.max_episodes) == (1, 8)
    pool = RolloutPool(addresses=[a.address, b.address], run=RUN, stream_timeout_s=60)
    assert pool.capacity() == Capacity(3, 10)
    refused, retried = refusals(), retries()
    requests = [group(1) for _ in range(40)]
    results = list(pool.run_groups(requests, max_in_flight=16))
    delivered_once(requests, results)
    assert refusals() - refused == 0 and retries() - retried == 0
    assert a.servicer.peak_groups == 1 and b.servicer.peak_groups == 2
    assert within_limits(a) and within_limits(b)
    pool.close()
    # an address that does not answer GetStatus counts with the conservative default
    nobody = RolloutPool(addresses=["127.0.0.1:1"], status_timeout_s=0.5)
    assert nobody.capacity() == DEFAULT_CAPACITY
    nobody.close()


def test_a_shared_full_replica_is_backed_off_and_retried_quietly(replicas, redis_url: str,
                                                                 caplog) -> None:
    """Another client fills the only replica: the pool cannot know, gets
    RESOURCE_EXHAUSTED, backs off, retries (counted) and logs once per group."""
    a = replicas("a", max_groups=1, max_episodes=4, redis_url=redis_url)
    hog_key = "other-learner"
    a.player.hold[hog_key] = threading.Event()
    hog = threading.Thread(target=lambda: list(RpcClient(a.address, timeout_s=60).stream(
        rollout_pb2_grpc.RolloutServiceStub, "RolloutGroup", group(1, key=hog_key))))
    hog.start()
    while a.servicer.active_groups == 0:
        time.sleep(0.01)
    pool = RolloutPool(redis_url=redis_url, run=RUN, stream_timeout_s=60)
    refused, retried = refusals(), retries()
    requests = [group(1) for _ in range(3)]
    results: list = []
    caplog.set_level(logging.DEBUG, logger="rlfleet.clients.rollout_pool")
    runner = threading.Thread(target=lambda: results.extend(
        pool.run_groups(requests, max_in_flight=3)))
    runner.start()
    while retries() - retried < 4:  # refused, and again after the back-off
        time.sleep(0.01)
    a.player.hold[hog_key].set()
    runner.join(60)
    hog.join(60)
    assert not runner.is_alive()
    delivered_once(requests, results)
    n_refused, n_retried = refusals() - refused, retries() - retried
    assert n_refused == n_retried >= 4
    assert total("rlfleet_pool_group_retries", grpc_code="RESOURCE_EXHAUSTED") >= n_retried
    loud = [r for r in caplog.records if r.name == "rlfleet.clients.rollout_pool"
            and r.levelno >= logging.INFO and getattr(r, "code", "") == "RESOURCE_EXHAUSTED"]
    assert len(loud) <= len(requests)  # once per group, not once per refusal
    assert all(r.levelno == logging.INFO for r in loud)
    assert a.servicer.peak_groups == 1
    print(f"shared replica: {n_refused:.0f} RESOURCE_EXHAUSTED, {n_retried:.0f} retries, "
          f"{len(loud)} log lines for {len(requests)} groups")
    pool.close()


def test_waiting_groups_start_on_a_replica_that_joins(replicas, redis_url: str) -> None:
    a = replicas("a", max_groups=1, max_episodes=1, redis_url=redis_url, episode_s=0.2)
    pool = RolloutPool(redis_url=redis_url, run=RUN, stream_timeout_s=60,
                       fleet_refresh_s=0.2)
    refused, retried = refusals(), retries()
    requests = [group(1) for _ in range(30)]
    results: list = []
    runner = threading.Thread(target=lambda: results.extend(
        pool.run_groups(requests, max_in_flight=30)))
    runner.start()
    while not results:
        time.sleep(0.01)
    b = replicas("b", max_groups=4, max_episodes=4, redis_url=redis_url, episode_s=0.2)
    runner.join(120)
    assert not runner.is_alive()
    delivered_once(requests, results)
    assert b.player.keys, "the replica that joined got no work"
    assert refusals() - refused == 0 and retries() - retried == 0
    assert a.servicer.peak_groups == 1 and b.servicer.peak_groups <= 4
    pool.close()


def test_a_replica_dying_mid_run_has_its_groups_re_sent(replicas, redis_url: str) -> None:
    a = replicas("a", max_groups=2, max_episodes=4, redis_url=redis_url, episode_s=0.05)
    b = replicas("b", max_groups=2, max_episodes=4, redis_url=redis_url, episode_s=0.05)
    pool = RolloutPool(redis_url=redis_url, run=RUN, stream_timeout_s=60)
    refused, retried = refusals(), retries()
    requests = [group(2) for _ in range(24)]
    results: list = []
    runner = threading.Thread(target=lambda: results.extend(
        pool.run_groups(requests, max_in_flight=8)))
    runner.start()
    while len(results) < 4 or a.servicer.active_groups == 0:
        time.sleep(0.005)
    cut = a.servicer.active_groups
    a.kill()  # mid-group; its heartbeat lingers in Redis until the TTL
    runner.join(120)
    assert not runner.is_alive()
    delivered_once(requests, results)
    resent = retries() - retried
    assert cut >= 1 and resent >= 1  # the cut groups were re-sent
    # ... and only they: the pool never had more than max_groups there, and a replica that
    # failed gets no group until it answers GetStatus again (its heartbeat still lingers)
    assert resent <= a.servicer.max_groups
    assert refusals() - refused == 0
    print(f"replica killed mid-run: {cut} groups cut, {resent:.0f} retries")
    assert b.servicer.peak_groups <= 2 and within_limits(b) and within_limits(a)
    pool.close()


def test_capacity_check_fails_fast_with_a_clear_message(replicas, redis_url: str) -> None:
    pool = RolloutPool(redis_url=redis_url, run=RUN)
    assert pool.capacity() == Capacity(0, 0)
    with pytest.raises(InsufficientCapacity, match="no live rollout replica"):
        pool.check_fits(8, 4)
    replicas("a", max_groups=4, max_episodes=16, redis_url=redis_url)
    replicas("b", max_groups=4, max_episodes=8, redis_url=redis_url)
    assert pool.capacity() == Capacity(8, 24)
    pool.check_fits(8, 3)  # a: 2 groups of 8, b: 1
    with pytest.raises(InsufficientCapacity, match="play only 3 such groups") as err:
        pool.check_fits(8, 4)
    assert "max_groups_in_flight" in str(err.value)
    assert pool.groups_that_fit(64) == 2  # one lone big group per idle replica
    pool.close()


def test_fleet_heartbeat_carries_capacity(replicas, redis_url: str) -> None:
    replicas("a", max_groups=3, max_episodes=7, redis_url=redis_url)
    (info,) = ReplicaDirectory(connect(redis_url)).live()
    assert (info.max_groups, info.max_episodes) == (3, 7)


def test_status_code_of_a_full_replica_names_both_limits(replicas) -> None:
    a = replicas("a", max_groups=4, max_episodes=2)
    a.player.hold["big"] = threading.Event()
    t = threading.Thread(target=lambda: list(RpcClient(a.address, timeout_s=60).stream(
        rollout_pb2_grpc.RolloutServiceStub, "RolloutGroup", group(2, key="big"))))
    t.start()
    while a.servicer.active_groups == 0:
        time.sleep(0.01)
    with pytest.raises(grpc.RpcError) as err:
        list(RpcClient(a.address, timeout_s=60).stream(
            rollout_pb2_grpc.RolloutServiceStub, "RolloutGroup", group(1)))
    a.player.hold["big"].set()
    t.join(60)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "2 episodes" in err.value.details()
