"""Live rollout replicas: each one refreshes a hash with a TTL; a replica that stops
heartbeating disappears by itself.

A heartbeat carries the replica's load and its capacity (`max_groups`, `max_episodes`:
what it admits at once, 0 = not advertised by an older replica). Readers ignore fields
they do not know, so replicas and learners of different versions share one registry."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

import redis

from rlfleet.registry import keys


@dataclass
class ReplicaInfo:
    replica_id: str
    address: str
    run: str = ""
    adapter_version: int = 0
    adapter_sha256: str = ""
    active_groups: int = 0
    active_episodes: int = 0
    engine: str = ""
    started_at: float = 0.0
    extra: dict = field(default_factory=dict)
    # Capacity: the replica admits a group while it plays < max_groups groups and
    # active_episodes + group_size <= max_episodes (an idle replica admits any one group).
    # 0 = not advertised.
    max_groups: int = 0
    max_episodes: int = 0

    @property
    def load(self) -> int:
        return self.active_episodes


_FIELDS = frozenset(f.name for f in fields(ReplicaInfo))


class ReplicaRegistry:
    def __init__(self, client: redis.Redis) -> None:
        self.redis = client

    def heartbeat(self, info: ReplicaInfo, ttl_s: float = 10.0) -> None:
        self.redis.set(keys.replica(info.replica_id), json.dumps(asdict(info)),
                       px=int(ttl_s * 1000))

    def remove(self, replica_id: str) -> None:
        self.redis.delete(keys.replica(replica_id))

    def live(self) -> list[ReplicaInfo]:
        found = []
        names = sorted(self.redis.scan_iter(match=keys.replica_pattern(), count=1000))
        for raw in self.redis.mget(names) if names else []:
            if raw is None:  # expired between SCAN and MGET
                continue
            try:
                doc = json.loads(raw)
                found.append(ReplicaInfo(**{k: v for k, v in doc.items() if k in _FIELDS}))
            except (TypeError, ValueError, AttributeError):
                continue  # a foreign or corrupt value must not break the fleet
        return found
