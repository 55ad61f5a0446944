"""The rollout contract."""

from __future__ import annotations

import threading
import time

import grpc
from prometheus_client import Counter, Gauge

from rlfleet import limits
from rlfleet.engines.base import EngineDead, EngineError
from rlfleet.fleet.replicas import admits
from rlfleet.names import ENGINE_NAMES, to_wire
from rlfleet.rpc.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, Unavailable
from rlfleet.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from rlfleet_rollout.engine_health import EngineWatch
from rlfleet_rollout.episodes import GroupPlayer
from rlfleet_rollout.idempotency import GroupCache
from rlfleet_rollout.loaded_adapters import AdapterManager

ACTIVE_GROUPS = Gauge("rlfleet_rollout_active_groups", "groups being played")
ACTIVE_EPISODES = Gauge("rlfleet_rollout_active_episodes",
                        "episodes being played (the load the autoscaler follows)")
TRAJECTORIES = Counter("rlfleet_rollout_trajectories_total", "trajectories streamed",
                       ["reward_name"])
REFUSED = Counter("rlfleet_rollout_groups_refused_total",
                  "groups answered RESOURCE_EXHAUSTED because the replica was full", ["limit"])
PEAK_GROUPS = Gauge("rlfleet_rollout_peak_groups", "most groups played at once since start")
PEAK_EPISODES = Gauge("rlfleet_rollout_peak_episodes",
                      "most episodes played at once since start")
MAX_GROUPS = Gauge("rlfleet_rollout_max_groups", "capacity: groups played at once")
MAX_EPISODES = Gauge("rlfleet_rollout_max_episodes", "capacity: episodes played at once")


def validate(request: rollout_pb2.GroupRequest) -> None:
    if not 1 <= request.group_size <= limits.MAX_GROUP_SIZE:
        raise InvalidArgument(
            f"group_size must be in 1..{limits.MAX_GROUP_SIZE}, got {request.group_size}")
    key = request.idempotency_key
    if not key or len(key.encode()) > limits.MAX_IDEMPOTENCY_KEY_BYTES:
        raise InvalidArgument(
            f"idempotency_key must be 1..{limits.MAX_IDEMPOTENCY_KEY_BYTES} bytes")
    if request.min_adapter_version < 0:
        raise InvalidArgument("min_adapter_version must be >= 0")


class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    """Plays groups; admission is by `rlfleet.fleet.replicas.admits` on max_groups and
    max_episodes (the capacity advertised in the heartbeat and GetStatus), a full replica
    answers RESOURCE_EXHAUSTED. With a dead engine (`health`) every group and GetStatus
    answers UNAVAILABLE, which the pool re-sends elsewhere and never clears the replica on."""

    def __init__(self, player: GroupPlayer, adapters: AdapterManager, *, max_groups: int,
                 adapter_wait_s: float, cache: GroupCache, address: str, engine: str,
                 model: str, max_episodes: int = 64, health: EngineWatch | None = None
                 ) -> None:
        if max_groups < 1 or max_episodes < 1:
            raise ValueError("max_groups and max_episodes must be >= 1")
        self.player = player
        self.adapters = adapters
        self.max_groups = max_groups
        self.max_episodes = max_episodes
        self.peak_groups = 0
        self.peak_episodes = 0
        MAX_GROUPS.set(max_groups)
        MAX_EPISODES.set(max_episodes)
        self.adapter_wait_s = adapter_wait_s
        self.cache = cache
        self.address = address
        if engine not in ENGINE_NAMES:
            raise ValueError(f"engine must be one of {ENGINE_NAMES}, got {engine!r}")
        self.engine_kind = to_wire(common_pb2.Engine, engine)
        self.model = model
        self.health = health
        self.active_groups = 0
        self.active_episodes = 0
        self._lock = threading.Lock()

    def RolloutGroup(self, request: rollout_pb2.GroupRequest, context: grpc.ServicerContext):  # noqa: N802
        validate(request)
        yield from self.cache.stream(request, lambda: self._play(request, context))

    def _refuse_if_dead(self) -> None:
        reason = self.health.check() if self.health is not None else None
        if reason is not None:
            raise Unavailable(f"this replica's engine is dead ({reason}); the replica is "
                              "leaving the fleet to be restarted: use another replica")

    def _play(self, request: rollout_pb2.GroupRequest, context: grpc.ServicerContext):  # noqa: ANN202
        queued = time.perf_counter()
        self._refuse_if_dead()
        with self._lock:
            if not admits(self.active_groups, self.active_episodes, request.group_size,
                          self.max_groups, self.max_episodes):
                limit = "groups" if self.active_groups >= self.max_groups else "episodes"
                REFUSED.labels(limit).inc()
                raise ResourceExhausted(
                    f"replica is full: {self.active_groups} groups, {self.active_episodes} "
                    f"episodes (limits {self.max_groups} groups, {self.max_episodes} "
                    f"episodes; a group of {request.group_size} does not fit); retry later "
                    "or on another replica")
            self.active_groups += 1
            self.active_episodes += request.group_size
            self.peak_groups = max(self.peak_groups, self.active_groups)
            self.peak_episodes = max(self.peak_episodes, self.active_episodes)
            PEAK_GROUPS.set(self.peak_groups)
            PEAK_EPISODES.set(self.peak_episodes)
            ACTIVE_GROUPS.set(self.active_groups)
            ACTIVE_EPISODES.set(self.active_episodes)
        try:
            if self.adapters.wait_for(request.min_adapter_version, self.adapter_wait_s) is None:
                self._refuse_if_dead()  # woken by the engine's death, not the version
                raise FailedPrecondition(
                    f"live adapter version {self.adapters.current.version} is older than "
                    f"min_adapter_version {request.min_adapter_version}"
                    + self.adapters.refusal_note(request.min_adapter_version))
            adapter = self.adapters.acquire()
            try:
                # A version unloaded beyond the staleness bound stops its groups at the
                # next turn: the learner would drop what they still produce.
                def playing() -> bool:
                    return context.is_active() and not self.adapters.is_evicted(adapter)

                streamed = 0
                try:
                    for trajectory in self.player.play(request, adapter, playing,
                                                       queued_s=time.perf_counter() - queued):
                        TRAJECTORIES.labels(trajectory.reward_name).inc()
                        streamed += 1
                        yield trajectory
                except EngineDead as exc:
                    if self.health is not None:
                        self.health.died(str(exc))
                    self._refuse_if_dead()
                    raise
                except EngineError:
                    if not self.adapters.is_evicted(adapter):
                        raise
                if streamed < request.group_size and self.adapters.is_evicted(adapter):
                    raise FailedPrecondition(
                        f"adapter version {adapter.version} was unloaded mid-group: live "
                        f"version {self.adapters.current.version} puts it beyond the "
                        f"staleness bound ({self.adapters.max_staleness}); retry the group")
            finally:
                self.adapters.release(adapter)
        finally:
            with self._lock:
                self.active_groups -= 1
                self.active_episodes -= request.group_size
                ACTIVE_GROUPS.set(self.active_groups)
                ACTIVE_EPISODES.set(self.active_episodes)

    def GetStatus(self, request, context):  # noqa: N802, ANN001, ANN201
        self._refuse_if_dead()  # a pool probing a replica that failed: not cleared
        a = self.adapters.current
        return rollout_pb2.ReplicaStatus(
            replica_id=self.player.replica_id,
            address=self.address,
            adapter=common_pb2.AdapterRef(run=a.run, version=a.version, path=a.path,
                                          sha256=a.sha256),
            active_groups=self.active_groups,
            active_episodes=self.active_episodes,
            engine_kind=self.engine_kind,
            model=self.model,
            max_groups=self.max_groups,
            max_episodes=self.max_episodes,
        )
