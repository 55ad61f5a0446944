"""A rollout replica: the policy engine, the adapter manager, the group player, and its
place in the fleet (heartbeats, adapter events, acknowledgements)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import redis as redis_errors
from PIL import Image

from rlfleet.clients.env import EnvClient
from rlfleet.clients.reward import RewardClient
from rlfleet.clients.sync import SyncClient
from rlfleet.config import ConfigError
from rlfleet.engines import ENGINES, Engine, EngineDead
from rlfleet.fleet import (
    AdapterDirectory,
    ReplicaDirectory,
    ReplicaInfo,
    connect,
    fleet_signing_key,
    verify_credentials,
)
from rlfleet.policy.chat import ChatCodec
from rlfleet.policy.fingerprint import model_fingerprint
from rlfleet.policy.loading import PolicyProcessor, load_processor
from rlfleet.policy.observation import profile_marks
from rlfleet.policy.profiles import resolve_model_dir, serving_profile
from rlfleet.rpc.errors import RpcError
from rlfleet.rpc.server import GrpcServer
from rlfleet.storage import RunsRoot
from rlfleet.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from rlfleet_rollout.batcher import DirectGeneration, GenerationBatcher
from rlfleet_rollout.engine_health import EngineWatch
from rlfleet_rollout.episodes import GroupPlayer
from rlfleet_rollout.idempotency import GroupCache
from rlfleet_rollout.loaded_adapters import AdapterManager, LiveAdapter
from rlfleet_rollout.registration import AdapterWatcher, Heartbeat
from rlfleet_rollout.servicer import RolloutServicer
from rlfleet_rollout.settings import RolloutSettings

ROLLOUT_SERVICE = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name
log = logging.getLogger(__name__)


def make_engine(settings: RolloutSettings, model_dir: str, processor: PolicyProcessor
                ) -> Engine:
    """The replica's engine. vLLM's arguments come from the profile (max_model_len,
    max_lora_rank, max_loras, images per prompt, dtype, GPU memory), then --engine-args;
    a max_model_len that cannot hold the profile's episode fails here, naming the numbers."""
    engine_class = ENGINES.get(settings.engine)  # vllm: only inside the vLLM environment
    if settings.engine == "vllm":
        profile = serving_profile(settings.profile)
        kwargs = {**profile.vllm_kwargs(settings.max_staleness), **settings.engine_args}
        frame = Image.new("RGB", (profile.frame_px, profile.frame_px))
        try:
            replace(profile, max_model_len=int(kwargs["max_model_len"])).check_fits(
                processor.image_token_count(frame))
        except ValueError as exc:
            raise ConfigError(f"profile {settings.profile!r}: {exc}") from None
        return engine_class(model_dir, **kwargs)
    return engine_class(model_dir, device=settings.device, num_threads=settings.torch_threads,
                        **settings.engine_args)


@dataclass
class Replica:
    settings: RolloutSettings
    server: GrpcServer
    player: GroupPlayer
    batcher: GenerationBatcher | DirectGeneration
    adapters: AdapterManager
    heartbeat: Heartbeat | None
    watcher: AdapterWatcher | None
    health: EngineWatch

    @property
    def engine_dead(self) -> str | None:
        """Why the engine died (the replica then exits non-zero); None: it did not."""
        return self.health.dead

    def until_ready(self) -> None:
        """Registers in the fleet store and loads the run's latest adapter (if any)
        before reporting SERVING. A Redis that is down (or full) at start keeps the replica
        NOT_SERVING, retrying, until its first heartbeat is written."""
        self.health.start()
        if self.heartbeat is not None:
            if not self.heartbeat.register():
                return  # stopped while waiting for Redis
            self.heartbeat.start()
        if self.watcher is not None:
            try:
                self.watcher.catch_up()
            except redis_errors.RedisError as exc:  # the watcher's loop catches up later
                log.warning("cannot read the latest adapter yet", extra={"error": repr(exc)})
            except EngineDead as exc:  # the way out is under way (engine_died)
                self.health.died(str(exc))
                return
            self.watcher.start()

    def stop(self) -> None:
        for part in (self.health, self.watcher, self.heartbeat):
            if part is not None:
                part.stop()

    def engine_died(self, reason: str) -> None:
        """The engine serves nothing again: health NOT_SERVING, out of the fleet store (no
        beat, the entry removed), no adapter loads, groups waiting for a version answered
        now (UNAVAILABLE, re-sent elsewhere by the pool); then the server drains, and
        the process exits non-zero (`engine_dead`) so that its Deployment restarts it."""
        # NOT_SERVING for good: a later set_serving (start-up finishing) changes nothing
        self.server.health.enter_graceful_shutdown()
        self.stop()
        self.adapters.end_waits()
        self.server.stop()

    def close(self) -> None:
        self.stop()
        self.batcher.close()
        self.adapters.close()
        self.batcher.engine.close()


def build_replica(settings: RolloutSettings) -> Replica:
    model_dir = str(resolve_model_dir(settings.profile, settings.model, settings.model_cache))
    # an unknown profile name in the checkpoint's marks fails here, at start
    marks = profile_marks(model_dir)
    processor = load_processor(model_dir)
    engine = make_engine(settings, model_dir, processor)
    codec = ChatCodec(processor, image_bounds=settings.image_bounds())
    # An engine that batches continuously (vLLM) takes every group's turn as it comes;
    # one that runs a batch at a time (hf) gets the turns merged by our batcher.
    batcher: GenerationBatcher | DirectGeneration = (
        DirectGeneration(engine) if getattr(engine, "concurrent", False)
        else GenerationBatcher(engine, max_batch=settings.max_batch))
    config = settings.server_config()
    # The replica calls the env/reward service and ckpt-sync with the fleet's shared token
    # (the same one its own server requires) and its TLS settings (its certificate as the
    # client certificate, the fleet CA to check theirs), like every client in the fleet.
    token = config.auth_token
    tls = settings.client_tls()
    sync = (SyncClient(settings.sync_address, token=token, timeout_s=10, tls=tls)
            if settings.sync_address else None)
    redis = connect(settings.redis_url) if settings.redis_url else None
    if redis is not None:
        # a wrong password fails here, clearly (ConfigError); a Redis that is down does
        # not: the replica starts NOT_SERVING and registers when Redis is back
        verify_credentials(redis)
    # heartbeats signed with the key derived from the token: the learner and ckpt-sync
    # count only replicas that prove they hold it
    replica_fleet = (ReplicaDirectory(redis, fleet_signing_key(token)) if redis is not None
                        else None)
    holder: dict[str, Heartbeat] = {}

    def on_live(adapter: LiveAdapter) -> None:
        if "hb" in holder:
            holder["hb"].try_beat()  # a failure is logged; the loop retries
        if sync is not None:
            try:
                sync.acknowledge(settings.replica_id, common_pb2.AdapterRef(
                    run=adapter.run, version=adapter.version, sha256=adapter.sha256))
            except RpcError as err:  # the heartbeat still tells the truth
                log.warning("acknowledge failed", extra={"code": err.code.name})

    adapters = AdapterManager(batcher, RunsRoot(settings.runs_root), settings.run,
                              settings.replica_id, on_live=on_live,
                              max_staleness=settings.max_staleness,
                              base_sha256=model_fingerprint(model_dir))
    reward_address = settings.reward_address or settings.env_address
    player = GroupPlayer(
        batcher, codec,
        env=EnvClient(settings.env_address, token=token, timeout_s=settings.env_timeout_s,
                      tls=tls),
        reward=RewardClient(reward_address, token=token, timeout_s=settings.env_timeout_s,
                            tls=tls),
        replica_id=settings.replica_id, cell_px=settings.render_cell_px(),
        model_dir=model_dir, profile_marks=marks, engine=settings.engine)
    health = EngineWatch(batcher.check_health)
    servicer = RolloutServicer(
        player, adapters, max_groups=settings.max_groups, max_episodes=settings.max_episodes,
        adapter_wait_s=settings.adapter_wait_s, cache=GroupCache(settings.idempotency_cache),
        address="", engine=settings.engine, model=model_dir, health=health)
    if isinstance(batcher, GenerationBatcher):
        batcher.expected = lambda: servicer.active_groups  # wait for every group's turn
    server = GrpcServer("rollout", config, [
        lambda s: rollout_pb2_grpc.add_RolloutServiceServicer_to_server(servicer, s)
        or ROLLOUT_SERVICE])
    # The bound port is known only now (port 0 picks one).
    address = settings.advertise_address or f"{settings.host}:{server.port}"
    servicer.address = address

    heartbeat = watcher = None
    if replica_fleet is not None:
        def info() -> ReplicaInfo:
            a = adapters.current
            return ReplicaInfo(
                replica_id=settings.replica_id, address=address, run=settings.run,
                adapter_version=a.version, adapter_sha256=a.sha256,
                active_groups=servicer.active_groups,
                active_episodes=servicer.active_episodes, engine=settings.engine,
                max_groups=servicer.max_groups, max_episodes=servicer.max_episodes)

        heartbeat = Heartbeat(replica_fleet, info, settings.heartbeat_s,
                              settings.heartbeat_ttl_s)
        holder["hb"] = heartbeat
        watcher = AdapterWatcher(AdapterDirectory(redis), adapters)
    replica = Replica(settings, server, player, batcher, adapters, heartbeat, watcher, health)
    health.on_dead = replica.engine_died
    return replica
