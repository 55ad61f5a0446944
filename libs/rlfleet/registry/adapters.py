"""Adapter versions per run: latest (monotonic), history, acknowledgements, events."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import redis

from rlfleet.registry import keys

# Sets latest only if the new version is higher: versions never go backwards, even when
# two publishers race or an old publisher replays.
_SET_IF_NEWER = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local v = cjson.decode(cur)['version']
  if tonumber(v) >= tonumber(ARGV[2]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""


@dataclass(frozen=True)
class AdapterRecord:
    run: str
    version: int
    path: str  # relative to the runs root
    sha256: str  # of MANIFEST.json
    step: int = 0
    published_at: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str) -> AdapterRecord:
        return cls(**json.loads(raw))


class AdapterRegistry:
    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._set_if_newer = client.register_script(_SET_IF_NEWER)

    def publish(self, record: AdapterRecord) -> bool:
        """Records `record` as latest if newer, adds it to the history and announces it.
        Returns False (and announces nothing) if an equal or newer version is latest."""
        if not record.published_at:
            record = AdapterRecord(**{**asdict(record), "published_at": time.time()})
        updated = bool(self._set_if_newer(keys=[keys.latest(record.run)],
                                          args=[record.to_json(), record.version]))
        self.redis.zadd(keys.history(record.run), {record.to_json(): record.version})
        if updated:
            self.redis.publish(keys.events(record.run), record.to_json())
        return updated

    def latest(self, run: str) -> AdapterRecord | None:
        raw = self.redis.get(keys.latest(run))
        return AdapterRecord.from_json(raw) if raw else None

    def history(self, run: str) -> list[AdapterRecord]:
        return [AdapterRecord.from_json(r) for r in self.redis.zrange(keys.history(run), 0, -1)]

    def acknowledge(self, run: str, version: int, replica_id: str) -> None:
        self.redis.hset(keys.acks(run, version), replica_id, time.time())

    def acks(self, run: str, version: int) -> dict[str, float]:
        return {k: float(v) for k, v in self.redis.hgetall(keys.acks(run, version)).items()}

    def forget(self, run: str, version: int) -> None:
        """Drops a removed version's history entry and acks."""
        for raw in self.redis.zrangebyscore(keys.history(run), version, version):
            self.redis.zrem(keys.history(run), raw)
        self.redis.delete(keys.acks(run, version))

    def events(self, run: str, *, poll_s: float = 1.0) -> Iterator[AdapterRecord | None]:
        """New-version events; yields None every `poll_s` without one (so the caller can
        check for shutdown), and reconnects by itself if Redis goes away."""
        while True:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(keys.events(run))
                while True:
                    message = pubsub.get_message(timeout=poll_s)
                    if message is None:
                        yield None
                        continue
                    try:
                        yield AdapterRecord.from_json(message["data"])
                    except (TypeError, ValueError, KeyError):
                        continue
            except (redis.ConnectionError, redis.TimeoutError):
                yield None
                time.sleep(poll_s)
            finally:
                pubsub.close()
