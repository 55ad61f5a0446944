"""Live rollout replicas: each one refreshes a key with a TTL; a replica that stops
heartbeating disappears by itself.

A heartbeat carries the replica's load and its capacity (`max_groups`, `max_episodes`:
what it admits at once, 0 = not advertised by an older replica). Readers ignore fields
they do not know, so replicas and learners of different versions share one fleet store.

Identity: with the fleet's signing key (derived from the shared token, see
`rlfleet.fleet.identity`) heartbeats are signed, and readers list only those that
verify: a key written into Redis by anyone else (an attacker's address, a copied
heartbeat edited to another address or version, an old one replayed) is not a replica.

A full Redis (maxmemory with noeviction refuses every write that may grow memory) must
not empty the fleet store: a heartbeat overwrites one small key in place, so it is written
by a script that may run while Redis is out of memory (Redis >= 7 `allow-oom`); the
replicas stay listed while the rest of the fleet store refuses writes.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field, fields

import redis
from prometheus_client import Counter

from rlfleet.fleet import keys
from rlfleet.fleet.identity import sign_document, verify_document

log = logging.getLogger(__name__)

UNVERIFIED = Counter("rlfleet_fleet_unverified_heartbeats_total",
                     "replica heartbeats ignored because their signature does not verify",
                     ["reason"])

# SET with PX, allowed while Redis is out of memory (a heartbeat replaces its own key).
_HEARTBEAT = """#!lua flags=allow-oom
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""


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
    # Written by every heartbeat: its TTL; by a signed one: when it was signed.
    signed_at: float = 0.0
    ttl_s: float = 0.0

    @property
    def load(self) -> int:
        return self.active_episodes


_FIELDS = frozenset(f.name for f in fields(ReplicaInfo))


def admits(groups: int, episodes: int, group_size: int, max_groups: int,
           max_episodes: int) -> bool:
    """The admission rule of a replica that plays `groups` groups of `episodes` episodes in
    all: both limits hold after admitting a group of `group_size`; an idle replica admits
    any one group, so a group larger than max_episodes is never starved. The replica
    applies it to what it plays, the learner's pool to what it has sent there."""
    if groups == 0:
        return True
    return groups < max_groups and episodes + group_size <= max_episodes


class ReplicaDirectory:
    """`key`: the fleet's signing key (None: auth is off, nothing is signed or checked)."""

    def __init__(self, client: redis.Redis, key: bytes | None = None) -> None:
        self.redis = client
        self.key = key
        self._script = client.register_script(_HEARTBEAT)
        self._script_ok = True
        self._warned: set[str] = set()
        self.ignored = 0  # heartbeats the last `live()` ignored (did not verify)

    def heartbeat(self, info: ReplicaInfo, ttl_s: float = 10.0) -> None:
        doc = {**asdict(info), "ttl_s": float(ttl_s)}  # readers time its expiry by it
        if self.key is not None:
            doc = sign_document(self.key, doc, ttl_s)
        raw, name, px = json.dumps(doc), keys.replica(info.replica_id), int(ttl_s * 1000)
        if self._script_ok:
            try:
                self._script(keys=[name], args=[raw, px])
                return
            except redis.ResponseError as exc:
                if "Error compiling script" not in str(exc):
                    raise  # full without allow-oom, read-only, ...: the heartbeat failed
                # a Redis older than 7 reads the shebang as Lua: plain SET from now on
                self._script_ok = False
                log.info("Redis runs no flagged scripts; heartbeats use SET",
                         extra={"error": str(exc)})
        self.redis.set(name, raw, px=px)

    def remove(self, replica_id: str) -> None:
        self.redis.delete(keys.replica(replica_id))

    def live(self) -> list[ReplicaInfo]:
        """Replicas with a live heartbeat (with a key: only those whose signature
        verifies)."""
        found = []
        ignored = 0
        names = sorted(self.redis.scan_iter(match=keys.replica_pattern(), count=1000))
        for name, raw in zip(names, self.redis.mget(names) if names else [], strict=True):
            if raw is None:  # expired between SCAN and MGET
                continue
            try:
                doc = json.loads(raw)
                if not isinstance(doc, dict):
                    continue
                if self.key is not None:
                    why = verify_document(self.key, doc)
                    if why is not None:
                        self._ignore(name, why)
                        ignored += 1
                        continue
                found.append(ReplicaInfo(**{k: v for k, v in doc.items() if k in _FIELDS}))
            except (TypeError, ValueError, AttributeError):
                continue  # a foreign or corrupt value must not break the fleet
        self.ignored = ignored
        return found

    def _ignore(self, name: str, why: str) -> None:
        UNVERIFIED.labels(why.split(" (")[0]).inc()
        if name not in self._warned and len(self._warned) < 1000:
            self._warned.add(name)
            log.warning("ignoring a replica heartbeat that does not verify (forged, stale, "
                        "or signed with another token)", extra={"key": name, "reason": why})
