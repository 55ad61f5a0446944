"""The learner's view of the rollout replicas: spread groups over live replicas, least
loaded first, never more than a replica can hold; survive replicas dying mid-request; pick
up replicas that join mid-run.

Capacity. Every replica advertises what it admits at once (`max_groups` groups and
`max_episodes` episodes, in its heartbeat in the fleet store; for static addresses from GetStatus,
else a conservative default). The pool counts the groups and episodes it has in flight on
each replica and sends a group only where it fits by the replica's own admission rule
(`rlfleet.fleet.replicas.admits`: fewer than max_groups groups, episodes + group_size <=
max_episodes; an idle replica takes any one group, so a group larger than max_episodes is
never starved). When no live replica has room, the group WAITS (a condition variable
woken when any of the pool's groups finishes or the replica list changes; the fleet store
is re-read every `fleet_refresh_s` while waiting). Waiting groups are served first come,
first served; a re-sent group goes to the front.

A retry is a fault, not the scheduling method: RESOURCE_EXHAUSTED can still come (another
learner shares the replica), and a replica can fail; then the group is re-sent, counted in
`rlfleet_pool_group_retries_total`, logged once per group, and the replica is avoided by
every group of this pool for a short, growing back-off (reset by its next success).

Exactly-once delivery: a group is identified by its idempotency key and each trajectory
by its index. If a replica fails mid-stream, the group is sent to another replica under
the same key; trajectories already received are kept, and any index that arrives twice
is dropped, so every index is delivered once.

A hung replica (SIGSTOP, a wedged host: its sockets stay open, nothing arrives) loses its
groups to another replica: a watchdog cancels every stream to a replica whose heartbeat
has expired (absent from the fleet store for half its TTL more, so that a restarted,
flushed Redis that the replicas re-fill within a heartbeat cancels nothing), and any
stream that delivers no trajectory for `idle_timeout_s` (the only check for static
addresses). Cancelled groups are re-sent like any failed group.

Identity: with the fleet's token the pool lists only replicas whose heartbeat is signed
with the key derived from it (`rlfleet.fleet.identity`), so neither groups nor the
token ever go to an address that someone merely wrote into Redis. Without a token (auth
explicitly off) every heartbeat is trusted. TLS options (`tls`) apply to every replica.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import NamedTuple

import grpc
import redis
from prometheus_client import Counter, Gauge

from rlfleet.clients.rollout import RolloutClient, TrajectoryStream
from rlfleet.fleet import (
    ReplicaDirectory,
    connect,
    fleet_signing_key,
    verify_credentials,
)
from rlfleet.fleet.connection import credentials_error
from rlfleet.fleet.replicas import admits
from rlfleet.rpc.errors import (
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    ResourceExhausted,
    RpcError,
    Unauthenticated,
    Unavailable,
    Unknown,
)
from rlfleet.v1 import rollout_pb2

log = logging.getLogger(__name__)

GROUP_RETRIES = Counter("rlfleet_pool_group_retries_total", "groups re-sent to another replica",
                        ["grpc_code"])
DUPLICATES = Counter("rlfleet_pool_duplicate_trajectories_total",
                     "trajectories dropped because their index already arrived")
WAITING = Gauge("rlfleet_pool_waiting_groups",
                "groups waiting for a free slot on a replica (every live replica is full)")
CANCELLED = Counter("rlfleet_pool_streams_cancelled_total",
                    "streams the pool cancelled (hung replica): heartbeat expired, or idle",
                    ["reason"])

# The replica (or the way to it) failed: try another. Anything else is the answer.
# (Re-sending a group to another replica is this pool's job, not a channel retry
# policy's: a service config retries on the one replica it is bound to.)
RETRYABLE = (
    Unavailable,
    Cancelled,
    ResourceExhausted,
    DeadlineExceeded,
    Internal,
    Unknown,
    FailedPrecondition,  # replica has not loaded the adapter yet
    # A peer at a replica's address that does not prove it belongs to the fleet (its port
    # taken over, rlfleet.rpc.callproof): its answer is refused and the group goes to
    # another replica; a token wrong everywhere ends at max_attempts.
    Unauthenticated,
)


class Capacity(NamedTuple):
    """What replicas admit at once: groups and episodes."""

    groups: int
    episodes: int


# For a replica that does not advertise its capacity (an older replica, or a static
# address whose GetStatus does not answer): below the replica defaults (16 groups, 64
# episodes), so that the pool does not overrun it.
DEFAULT_CAPACITY = Capacity(groups=4, episodes=16)


class NoReplicas(RuntimeError):
    """No live replica appeared before the deadline."""


class InsufficientCapacity(RuntimeError):
    """The live replicas cannot hold what a recipe keeps in flight."""


def groups_that_fit(group_size: int, capacity: Capacity) -> int:
    """How many groups of `group_size` one replica of `capacity` plays at once."""
    if group_size > capacity.episodes:
        return 1
    return max(1, min(capacity.groups, capacity.episodes // max(1, group_size)))


DEFAULT_TTL_S = 10.0  # a heartbeat's TTL when it does not say (unsigned, older replica)


@dataclass
class Replica:
    replica_id: str
    address: str
    load: int  # episodes the replica reports + episodes this pool has sent it
    max_groups: int = DEFAULT_CAPACITY.groups
    max_episodes: int = DEFAULT_CAPACITY.episodes
    ttl_s: float = DEFAULT_TTL_S

    @property
    def capacity(self) -> Capacity:
        return Capacity(self.max_groups, self.max_episodes)


class _Stream:
    """One group's stream to one replica, watched for hangs."""

    def __init__(self, call: TrajectoryStream, address: str) -> None:
        self.call = call
        self.address = address
        self.last_message = time.monotonic()
        self.reason: str | None = None  # set when the watchdog cancels it


@dataclass
class _Sent:
    """What this pool has in flight on one replica."""

    groups: int = 0
    episodes: int = 0


def _backoff(strikes: int, cap_s: float, first: float = 0.5) -> float:
    """first, 2 first, 4 first, ... up to cap_s, with jitter."""
    return min(cap_s, first * 2 ** (strikes - 1)) * (0.75 + random.random() / 2)


def _capacity(groups: object, episodes: object) -> Capacity:
    """An advertised capacity, or the default where it is missing or nonsense."""
    try:
        g, e = int(groups), int(episodes)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return DEFAULT_CAPACITY
    if g < 1 or e < 1:
        return DEFAULT_CAPACITY
    return Capacity(g, e)


class RolloutPool:
    def __init__(
        self,
        *,
        redis_url: str | None = None,
        addresses: Iterable[str] = (),
        run: str | None = None,
        token: str | None = None,
        stream_timeout_s: float = 1800.0,
        idle_timeout_s: float = 600.0,
        max_attempts: int = 8,
        wait_for_replicas_s: float = 120.0,
        fleet_refresh_s: float = 1.0,
        status_timeout_s: float = 2.0,
        tls: dict | None = None,
    ) -> None:
        self.fleet = None
        if redis_url:
            client = connect(redis_url)
            verify_credentials(client)  # a wrong password: FleetAuthError, now, once
            self.fleet = ReplicaDirectory(client, fleet_signing_key(token))
        self.static = list(addresses)
        if self.fleet is None and not self.static:
            raise ValueError("RolloutPool needs a redis_url or replica addresses")
        if self.fleet is not None and self.fleet.key is None:
            log.warning("no fleet token: the rollout pool trusts every replica heartbeat "
                        "in Redis (auth is off)")
        self.run = run
        self.token = token
        self.tls = tls
        self.stream_timeout_s = stream_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.max_attempts = max_attempts  # failures of one group (refusals counted apart)
        self.max_refusals = 20 * max_attempts  # RESOURCE_EXHAUSTED answers to one group
        self.wait_for_replicas_s = wait_for_replicas_s
        self.fleet_refresh_s = fleet_refresh_s
        self.status_timeout_s = status_timeout_s
        self._clients: dict[str, RolloutClient] = {}
        self._last_live: list[Replica] = []  # the fleet store's last answer (Redis outages)
        self._lock = threading.Lock()
        self.retries: dict[str, int] = {}  # groups re-sent, by status code (this pool)
        self._cond = threading.Condition(self._lock)
        self._sent: dict[str, _Sent] = {}  # address -> this pool's groups in flight there
        self._avoid_until: dict[str, float] = {}  # address -> back-off after a refusal
        self._suspect: dict[str, float] = {}  # address -> when to probe it (GetStatus)
        self._strikes: dict[str, int] = {}  # address -> failures since its last success
        self._queue: deque[object] = deque()  # groups waiting for a slot, in order
        self._live: list[Replica] | None = None  # cached replica list
        self._live_at = 0.0
        self._live_key: frozenset = frozenset()
        self._refreshing = threading.Lock()
        self._fleet_down = False
        self._static_caps: dict[str, tuple[Capacity, str]] = {}  # address -> (cap, id)
        self._static_next_ask: dict[str, float] = {}
        self._streams: set[_Stream] = set()  # streams in flight, watched for hangs
        self._absent_since: dict[str, float] = {}  # address -> first read it was missing
        self._ttls: dict[str, float] = {}  # address -> heartbeat TTL it last advertised
        self.cancelled: dict[str, int] = {}  # streams the watchdog cancelled, by reason
        self._closed = threading.Event()
        self._watchdog: threading.Thread | None = None

    # -- replicas --------------------------------------------------------------------

    def replicas(self) -> list[Replica]:
        """Live replicas (read now), least loaded first (ties in random order)."""
        live = [Replica(r.replica_id, r.address, r.load, r.max_groups, r.max_episodes)
                for r in self._refresh()]
        with self._lock:
            for r in live:
                r.load = max(r.load, self._sent.get(r.address, _Sent()).episodes)
        random.shuffle(live)
        return sorted(live, key=lambda r: r.load)

    def capacity(self, wait_s: float = 0.0) -> Capacity:
        """Groups and episodes the live replicas admit at once, summed (waiting up to
        `wait_s` for a first replica to appear); (0, 0) when there is none."""
        live = self._wait_for_live(wait_s)
        return Capacity(sum(r.max_groups for r in live), sum(r.max_episodes for r in live))

    def groups_that_fit(self, group_size: int, wait_s: float = 0.0) -> int:
        """How many groups of `group_size` the live replicas play at once."""
        return sum(groups_that_fit(group_size, r.capacity) for r in self._wait_for_live(wait_s))

    def check_fits(self, group_size: int, groups_in_flight: int, wait_s: float = 0.0) -> None:
        """Fails fast (InsufficientCapacity, with what to change) when the live replicas
        cannot play `groups_in_flight` groups of `group_size` episodes at once."""
        live = self._wait_for_live(wait_s)
        where = f" for run {self.run!r}" if self.run else ""
        if not live:
            raise InsufficientCapacity(f"no live rollout replica{where} after {wait_s:g}s")
        fit = sum(groups_that_fit(group_size, r.capacity) for r in live)
        if fit < groups_in_flight:
            total = Capacity(sum(r.max_groups for r in live), sum(r.max_episodes for r in live))
            raise InsufficientCapacity(
                f"the recipe keeps {groups_in_flight} groups of {group_size} episodes in "
                f"flight, but the {len(live)} live rollout replica(s){where} play only {fit} "
                f"such groups at once (together {total.groups} groups, {total.episodes} "
                "episodes); add replicas, raise their max_groups / max_episodes, or lower "
                "fleet.max_groups_in_flight")

    def _wait_for_live(self, wait_s: float) -> list[Replica]:
        deadline = time.monotonic() + wait_s
        while True:
            live = self._refresh()
            if live or time.monotonic() >= deadline:
                return live
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def _cached(self) -> list[Replica]:
        """The replica list, re-read when older than fleet_refresh_s; while one thread
        re-reads it, the others use the previous list instead of waiting on Redis."""
        if self._live is not None and time.monotonic() - self._live_at < self.fleet_refresh_s:
            return self._live
        if self._live is None:
            with self._refreshing:
                if self._live is None:
                    return self._read_locked()
            return self._live
        if self._refreshing.acquire(blocking=False):
            try:
                return self._read_locked()
            finally:
                self._refreshing.release()
        return self._live

    def _refresh(self) -> list[Replica]:
        with self._refreshing:
            return self._read_locked()

    def _read_locked(self) -> list[Replica]:
        live = self._read_fleet() if self.fleet is not None else self._read_static()
        seen: dict[str, Replica] = {}
        for r in live:  # one entry per address (a restarted replica's old key lingers)
            seen.setdefault(r.address, r)
        live = list(seen.values())
        self._probe_suspects(live)
        key = frozenset((r.address, r.max_groups, r.max_episodes) for r in live)
        with self._cond:
            self._live, self._live_at = live, time.monotonic()
            if key != self._live_key:
                self._live_key = key
                self._cond.notify_all()  # a replica came, went or changed its capacity
        return live

    def _status(self, address: str) -> rollout_pb2.ReplicaStatus:
        """One GetStatus, no retries, a short deadline (raises RpcError)."""
        return self._client(address).status(timeout_s=self.status_timeout_s)

    def _probe_suspects(self, live: list[Replica]) -> None:
        """A replica that failed a group gets no group until it answers GetStatus (after a
        back-off growing with its failures in a row): a dead replica whose heartbeat has
        not expired yet costs probes, not group retries."""
        listed = {r.address for r in live}
        now = time.monotonic()
        with self._cond:
            for address in [a for a in self._suspect if a not in listed]:
                del self._suspect[address]  # gone from the fleet store; fresh if it returns
            due = [a for a, t in self._suspect.items() if t <= now]
        for address in due:
            try:
                self._status(address)
                alive = True
            except RpcError:
                alive = False
            with self._cond:
                if address not in self._suspect:
                    continue
                if alive:
                    del self._suspect[address]
                    self._cond.notify_all()
                else:
                    strikes = self._strikes.get(address, 0) + 1
                    self._strikes[address] = strikes
                    self._suspect[address] = time.monotonic() + _backoff(strikes, 8.0)

    def _read_fleet(self) -> list[Replica]:
        assert self.fleet is not None
        try:
            live = [Replica(r.replica_id, r.address, r.active_episodes,
                            *_capacity(r.max_groups, r.max_episodes),
                            ttl_s=r.ttl_s if r.ttl_s > 0 else DEFAULT_TTL_S)
                    for r in self.fleet.live() if self.run is None or r.run == self.run]
        except redis.AuthenticationError as exc:
            # the password changed under us: a configuration error, not an outage
            raise credentials_error(exc) from None
        except redis.RedisError as exc:
            # The fleet store is down (restarting), not the replicas: keep sending work to
            # the replicas it last listed; one that died meanwhile fails and is retried.
            if not self._fleet_down:
                log.warning("fleet store unreachable; using the last known replicas",
                            extra={"error": repr(exc), "replicas": len(self._last_live)})
            self._fleet_down = True
            return [Replica(r.replica_id, r.address, r.load, r.max_groups, r.max_episodes,
                            r.ttl_s) for r in self._last_live]
        if self._fleet_down:
            log.info("fleet store reachable again", extra={"replicas": len(live)})
            self._fleet_down = False
        self._last_live = live
        if len(self._ttls) > 10_000:
            self._ttls.clear()
        self._ttls.update((r.address, r.ttl_s) for r in live)
        return live

    def _read_static(self) -> list[Replica]:
        """Static addresses are always listed; their capacity comes from GetStatus (asked
        again every 30 s, every 5 s while it does not answer), else the default."""
        now = time.monotonic()
        out = []
        for address in self.static:
            if now >= self._static_next_ask.get(address, 0.0):
                try:
                    status = self._status(address)
                    self._static_caps[address] = (
                        _capacity(status.max_groups, status.max_episodes),
                        status.replica_id or address)
                    self._static_next_ask[address] = now + 30.0
                except RpcError as err:
                    self._static_next_ask[address] = now + 5.0
                    log.debug("replica status unavailable; assuming its capacity",
                              extra={"address": address, "code": err.code.name})
            cap, replica_id = self._static_caps.get(address, (DEFAULT_CAPACITY, address))
            out.append(Replica(replica_id, address, 0, cap.groups, cap.episodes))
        return out

    def _client(self, address: str) -> RolloutClient:
        """The replica's client: no channel retries (a failed group goes to another
        replica; a status probe that fails only postpones the next one)."""
        with self._lock:
            if address not in self._clients:
                self._clients[address] = RolloutClient(address, token=self.token,
                                                       timeout_s=self.stream_timeout_s,
                                                       tls=self.tls, max_attempts=1)
            return self._clients[address]

    # -- slots -----------------------------------------------------------------------

    def _choose(self, live: list[Replica], size: int, failed: set[str]) -> Replica | None:
        """The best replica with room for a group of `size` (caller holds the lock):
        one this group has not failed on, least used relative to its capacity."""
        now = time.monotonic()
        best: tuple[tuple, Replica] | None = None
        for r in live:
            if r.address in self._suspect or self._avoid_until.get(r.address, 0.0) > now:
                continue
            sent = self._sent.get(r.address, _Sent())
            if not admits(sent.groups, sent.episodes, size, r.capacity.groups,
                          r.capacity.episodes):
                continue
            used = max((sent.groups + 1) / r.max_groups, (sent.episodes + size) / r.max_episodes)
            rank = (r.address in failed, used, max(r.load, sent.episodes), random.random())
            if best is None or rank < best[0]:
                best = (rank, r)
        return best[1] if best else None

    def _wait_s(self) -> float:
        """How long a waiting group sleeps at most: until the next fleet store read, or the
        end of the nearest back-off (caller holds the lock)."""
        now = time.monotonic()
        ends = [t - now for t in [*self._avoid_until.values(), *self._suspect.values()]
                if t > now]
        return max(0.01, min([self.fleet_refresh_s, *ends]))

    def _acquire(self, request: rollout_pb2.GroupRequest, failed: set[str],
                 resend: bool) -> Replica:
        """Reserves a slot for the group on a replica with room, waiting while there is
        none (first come, first served; a re-sent group goes first)."""
        size = request.group_size
        ticket = object()
        no_replicas_since: float | None = None
        with self._cond:
            (self._queue.appendleft if resend else self._queue.append)(ticket)
            WAITING.inc()
        try:
            while True:
                live = self._cached()
                with self._cond:
                    if self._queue[0] is ticket:
                        replica = self._choose(live, size, failed)
                        if replica is not None:
                            self._queue.popleft()
                            WAITING.dec()
                            sent = self._sent.setdefault(replica.address, _Sent())
                            sent.groups += 1
                            sent.episodes += size
                            self._cond.notify_all()  # the next in line may fit elsewhere
                            return replica
                    if any(r.address not in self._suspect for r in live):
                        no_replicas_since = None
                    else:  # none listed, or every one failed and does not answer since
                        no_replicas_since = no_replicas_since or time.monotonic()
                        if time.monotonic() - no_replicas_since > self.wait_for_replicas_s:
                            ignored = self.fleet.ignored if self.fleet else 0
                            unverified = (f"; {ignored} heartbeat(s) in Redis ignored: their "
                                          "signature does not verify (forged, or replicas "
                                          "with another token)" if ignored else "")
                            raise NoReplicas(
                                f"no live rollout replica after {self.wait_for_replicas_s}s"
                                f" ({len(live)} listed, none answering{unverified})")
                    self._cond.wait(self._wait_s())
        finally:
            with self._cond:
                if ticket in self._queue:
                    self._queue.remove(ticket)
                    WAITING.dec()
                    self._cond.notify_all()

    def _release(self, replica: Replica, size: int) -> None:
        with self._cond:
            sent = self._sent[replica.address]
            sent.groups -= 1
            sent.episodes -= size
            if sent.groups <= 0:
                del self._sent[replica.address]
            self._cond.notify_all()

    def _succeeded(self, replica: Replica) -> None:
        with self._cond:
            if self._strikes.pop(replica.address, None) is not None:
                self._avoid_until.pop(replica.address, None)
                self._suspect.pop(replica.address, None)
                self._cond.notify_all()

    def _failed(self, replica: Replica, code: grpc.StatusCode) -> None:
        """Every group of this pool avoids a replica that refused or failed. A refusal
        (full: shared with another client) backs off for a while; a failure makes the
        replica a suspect that gets groups again once it answers GetStatus. Both back-offs
        grow with its failures in a row; groups failing together count once."""
        with self._cond:
            address = replica.address
            now = time.monotonic()
            if self._avoid_until.get(address, 0.0) > now or address in self._suspect:
                return  # groups sent before the back-off began, failing together: one event
            strikes = self._strikes.get(address, 0) + 1
            self._strikes[address] = strikes
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                self._avoid_until[address] = now + _backoff(strikes, 4.0, first=0.25)
            else:
                self._suspect[address] = now + _backoff(strikes, 8.0)

    # -- groups ----------------------------------------------------------------------

    def run_group(self, request: rollout_pb2.GroupRequest) -> list[rollout_pb2.Trajectory]:
        """All `group_size` trajectories of the group, each index exactly once."""
        received: dict[int, rollout_pb2.Trajectory] = {}
        failed: set[str] = set()
        failures = refusals = 0
        logged = False
        while True:
            replica = self._acquire(request, failed, resend=failures + refusals > 0)
            watched: _Stream | None = None
            try:
                stream = self._client(replica.address).stream(request)
                watched = self._watch(stream, replica.address)
                for trajectory in stream:
                    watched.last_message = time.monotonic()
                    if trajectory.index in received or not (
                            0 <= trajectory.index < request.group_size):
                        DUPLICATES.inc()
                        continue
                    received[trajectory.index] = trajectory
                if len(received) == request.group_size:
                    self._succeeded(replica)
                    return [received[i] for i in range(request.group_size)]
                code = grpc.StatusCode.UNKNOWN  # stream ended early: treat as a failure
                detail = f"stream ended after {len(received)} of {request.group_size}"
            except RpcError as err:
                code, detail = err.code, err.message
                if watched is not None and watched.reason is not None:
                    code, detail = grpc.StatusCode.CANCELLED, watched.reason
                elif not isinstance(err, RETRYABLE):
                    raise
            finally:
                if watched is not None:
                    self._unwatch(watched)
                self._release(replica, request.group_size)
            GROUP_RETRIES.labels(code.name).inc()
            with self._lock:
                self.retries[code.name] = self.retries.get(code.name, 0) + 1
            self._failed(replica, code)
            refused = code == grpc.StatusCode.RESOURCE_EXHAUSTED
            if refused:
                refusals += 1  # the replica is full (shared with another client)
            else:
                failures += 1
                failed.add(replica.address)
            extra = {"replica": replica.replica_id, "code": code.name, "detail": detail,
                     "key": request.idempotency_key, "received": len(received),
                     "attempt": failures + refusals}
            if failures >= self.max_attempts or refusals >= self.max_refusals:
                raise RuntimeError(
                    f"group {request.idempotency_key} failed on {failures} attempts and was "
                    f"refused {refusals} times ({len(received)} of {request.group_size} "
                    f"received; last: {code.name}: {detail})")
            if not logged:  # once per group; the retries metric counts every one
                logged = True
                if refused:
                    log.info("replica full (shared with another client?); backing off and "
                             "re-sending the group", extra=extra)
                else:
                    log.warning("group failed on a replica; re-sending it", extra=extra)
            else:
                log.debug("group re-sent again", extra=extra)
            attempt = failures + refusals - 1
            time.sleep(min(2.0, 0.1 * 2 ** attempt) * (0.5 + random.random() / 2))

    def run_groups(self, requests: Iterable[rollout_pb2.GroupRequest], max_in_flight: int = 4
                   ) -> Iterator[tuple[rollout_pb2.GroupRequest, list[rollout_pb2.Trajectory]]]:
        """Runs groups concurrently; yields (request, trajectories) as each completes.

        At most `max_in_flight` groups are under way; those the replicas have no room for
        wait in the pool (never sent to a full replica)."""
        pending = iter(requests)
        with ThreadPoolExecutor(max(1, max_in_flight), thread_name_prefix="group") as pool:
            running: dict[Future, rollout_pb2.GroupRequest] = {}
            for request in pending:
                running[pool.submit(self.run_group, request)] = request
                if len(running) >= max_in_flight:
                    break
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    request = running.pop(future)
                    yield request, future.result()
                    nxt = next(pending, None)
                    if nxt is not None:
                        running[pool.submit(self.run_group, nxt)] = nxt

    # -- hung replicas ---------------------------------------------------------------

    def _watch(self, call: TrajectoryStream, address: str) -> _Stream:
        stream = _Stream(call, address)
        with self._cond:
            self._streams.add(stream)
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._watch_loop,
                                                  name="pool-watchdog", daemon=True)
                self._watchdog.start()
            self._cond.notify_all()
        return stream

    def _unwatch(self, stream: _Stream) -> None:
        with self._cond:
            self._streams.discard(stream)

    def _watch_period_s(self) -> float:
        return max(0.05, min(1.0, self.fleet_refresh_s, self.idle_timeout_s / 4))

    def _watch_loop(self) -> None:
        while not self._closed.is_set():
            with self._cond:
                while not self._streams and not self._closed.is_set():
                    self._cond.wait(5.0)
            if self._closed.wait(self._watch_period_s()):
                return
            try:
                self.check_streams()
            except Exception as exc:  # noqa: BLE001 - the watchdog must not die
                log.warning("stream watchdog check failed", extra={"error": repr(exc)})

    def check_streams(self) -> int:
        """Cancels streams to replicas whose heartbeat expired and streams idle for
        `idle_timeout_s`; returns how many it cancelled (the watchdog calls this)."""
        with self._cond:
            streams = list(self._streams)
        if not streams:
            return 0
        now = time.monotonic()
        doomed: list[tuple[_Stream, str, str]] = []
        for s in streams:
            idle = now - s.last_message
            if idle > self.idle_timeout_s:
                doomed.append((s, "idle", f"no trajectory for {idle:.0f}s (idle timeout "
                                          f"{self.idle_timeout_s:g}s); the replica hangs"))
        if self.fleet is not None:
            live = self._refresh()
            if not self._fleet_down:  # the fleet store answered: absence means expiry
                listed = {r.address: r for r in live}
                for address in list(self._absent_since):
                    if address in listed:
                        del self._absent_since[address]
                for s in streams:
                    if s.address in listed:
                        continue
                    first = self._absent_since.setdefault(s.address, now)
                    grace = self._ttls.get(s.address, DEFAULT_TTL_S) / 2
                    if now - first >= grace:
                        doomed.append((s, "heartbeat_expired",
                                       f"the replica's heartbeat expired ({now - first:.1f}s "
                                       "absent from the fleet store); it is gone or hung"))
        cancelled = 0
        for s, reason, detail in doomed:
            if s.reason is not None:
                continue
            s.reason = detail
            s.call.cancel()
            cancelled += 1
            CANCELLED.labels(reason).inc()
            with self._lock:
                self.cancelled[reason] = self.cancelled.get(reason, 0) + 1
            log.warning("cancelled a stream to a hung replica; its group is re-sent",
                        extra={"address": s.address, "reason": reason, "detail": detail})
        return cancelled

    def close(self) -> None:
        self._closed.set()
        with self._cond:
            self._cond.notify_all()
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()
