"""Adapter versions per run: latest (monotonic), history, acknowledgements, events.

Redis is a hint, /shared is the truth: `latest` never goes backwards through `publish`,
but ckpt-sync, which verifies every version on /shared, may `replace` a latest that
/shared does not back (a forged or corrupted key) with one it does. Acknowledgements are
signed with the fleet's signing key when there is one (see `identity`), and `acks` then
returns only those that verify."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import redis

from rlfleet.fleet import keys
from rlfleet.fleet.identity import sign_ack, verify_ack

# One round trip per publish: sets latest only if the new version is higher (versions
# never go backwards, even when two publishers race or an old publisher replays), records
# the version in the history either way, and announces it only if it became latest.
_PUBLISH = """
local cur = redis.call('GET', KEYS[1])
local updated = 1
if cur then
  local v = cjson.decode(cur)['version']
  if tonumber(v) >= tonumber(ARGV[2]) then updated = 0 end
end
if updated == 1 then redis.call('SET', KEYS[1], ARGV[1]) end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
if updated == 1 then redis.call('PUBLISH', KEYS[3], ARGV[1]) end
return updated
"""


# Compare-and-set: replaces latest only if it still holds exactly what the caller checked
# (ARGV[3], "" = absent), then records and announces like _PUBLISH.
_REPLACE = """
local cur = redis.call('GET', KEYS[1])
if (cur or '') ~= ARGV[3] then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('PUBLISH', KEYS[3], ARGV[1])
return 1
"""


def pending_channel(run: str) -> str:
    """Pub/sub channel for hints that ckpt-sync has started verifying a version."""
    return f"{keys.events(run)}:pending"


def acks_channel(run: str) -> str:
    """Pub/sub channel on which every acknowledgement of `run` is announced (the version
    number as the message), so waiters wake on an ack instead of polling."""
    return f"{keys.events(run)}:acks"


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


def parse_record(raw: str) -> AdapterRecord | None:
    """An AdapterRecord from Redis, or None for a value that is not one (foreign,
    corrupt): a bad key must not break its readers."""
    try:
        record = AdapterRecord.from_json(raw)
        int(record.version)
    except (TypeError, ValueError, KeyError, AttributeError):
        return None
    return record


@dataclass(frozen=True)
class Refusal:
    """A replica's report that it would not serve a version (it did not verify)."""

    replica_id: str
    version: int
    reason: str
    attempts: int


@dataclass(frozen=True)
class PendingVersion:
    """A hint, never an announcement: ckpt-sync has started verifying `record` (its
    sha256 is the publisher's claim, possibly empty). Nothing may be served on a hint; a
    replica may only start reading and hashing the version, so that the announcement (the
    only thing that names a version to serve, with its identity) finds the bytes ready."""

    record: AdapterRecord


class AdapterDirectory:
    """`key`: the fleet's signing key, to sign and check acknowledgements (None: auth is
    off, acknowledgements are taken as written)."""

    def __init__(self, client: redis.Redis, key: bytes | None = None) -> None:
        self.redis = client
        self.key = key
        self._publish = client.register_script(_PUBLISH)
        self._replace = client.register_script(_REPLACE)

    def publish(self, record: AdapterRecord) -> bool:
        """Records `record` as latest if newer, adds it to the history and announces it
        (one atomic script, one round trip). Returns False (and announces nothing) if an
        equal or newer version is latest."""
        if not record.published_at:
            record = AdapterRecord(**{**asdict(record), "published_at": time.time()})
        raw = record.to_json()
        return bool(self._publish(
            keys=[keys.latest(record.run), keys.history(record.run), keys.events(record.run)],
            args=[raw, record.version]))

    def replace(self, record: AdapterRecord, expected_raw: str | None) -> bool:
        """Makes `record` latest (even if older) provided latest still holds
        `expected_raw` (None: no latest); records and announces it. For ckpt-sync only,
        once it has found that /shared does not back the current latest."""
        if not record.published_at:
            record = AdapterRecord(**{**asdict(record), "published_at": time.time()})
        raw = record.to_json()
        return bool(self._replace(
            keys=[keys.latest(record.run), keys.history(record.run), keys.events(record.run)],
            args=[raw, record.version, expected_raw or ""]))

    def latest_raw(self, run: str) -> str | None:
        return self.redis.get(keys.latest(run))

    def hint_pending(self, record: AdapterRecord) -> None:
        """Tells listeners that `record` is being verified (see PendingVersion)."""
        self.redis.publish(pending_channel(record.run), record.to_json())

    def latest(self, run: str) -> AdapterRecord | None:
        raw = self.redis.get(keys.latest(run))
        return parse_record(raw) if raw else None

    def history(self, run: str) -> list[AdapterRecord]:
        records = (parse_record(r) for r in self.redis.zrange(keys.history(run), 0, -1))
        return [r for r in records if r is not None]

    def acknowledge(self, run: str, version: int, replica_id: str) -> None:
        at = time.time()
        value = f"{at!r}|{sign_ack(self.key, run, version, replica_id, at)}" if self.key \
            else repr(at)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(keys.acks(run, version), replica_id, value)
        pipe.publish(acks_channel(run), str(version))
        pipe.execute()

    def refuse(self, run: str, version: int, replica_id: str, reason: str,
               attempts: int) -> None:
        """Records that `replica_id` refused `version` (`attempts` times so far, the last
        time for `reason`), so that WaitForReplicas can say who refused what; wakes the
        waiters like an acknowledgement. Unsigned: it only explains a wait, it never
        counts as serving."""
        value = json.dumps({"reason": reason[:500], "attempts": attempts, "at": time.time()})
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(keys.refusals(run, version), replica_id, value)
        pipe.publish(acks_channel(run), str(version))
        pipe.execute()

    def refusals(self, run: str, version: int) -> list[Refusal]:
        """The replicas that refused `version`, by id (unreadable entries skipped)."""
        out = []
        for replica_id, raw in sorted(self.redis.hgetall(keys.refusals(run, version)).items()):
            try:
                doc = json.loads(raw)
                out.append(Refusal(str(replica_id), version, str(doc["reason"]),
                                   int(doc["attempts"])))
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def announce_again(self, record: AdapterRecord) -> None:
        """Re-sends the "new version" event of the latest `record` (a Publish of the version
        that is latest already): replicas that refused it try it once more (bounded)."""
        self.redis.publish(keys.events(record.run), record.to_json())

    def ack_waiter(self, run: str) -> AckWaiter:
        """Subscribes to `run`'s acknowledgements; see AckWaiter."""
        return AckWaiter(self.redis, run)

    def acks(self, run: str, version: int) -> dict[str, float]:
        """Replica id -> when it acknowledged `version` (with a key: verified ones only)."""
        out = {}
        for replica_id, value in self.redis.hgetall(keys.acks(run, version)).items():
            at_text, _, mac = str(value).partition("|")
            try:
                at = float(at_text)
            except ValueError:
                continue
            if self.key is not None and not verify_ack(self.key, run, version, replica_id,
                                                       at, mac):
                continue
            out[replica_id] = at
        return out

    def forget(self, run: str, version: int) -> None:
        """Drops a removed version's history entry and acks."""
        for raw in self.redis.zrangebyscore(keys.history(run), version, version):
            self.redis.zrem(keys.history(run), raw)
        self.redis.delete(keys.acks(run, version), keys.refusals(run, version))

    def events(self, run: str, *, poll_s: float = 1.0, pending: bool = False
               ) -> Iterator[AdapterRecord | PendingVersion | None]:
        """New-version events; yields None every `poll_s` without one (so the caller can
        check for shutdown), and reconnects by itself if Redis goes away. A wait wakes as
        soon as a message arrives. With `pending`, also the PendingVersion hints."""
        hints = pending_channel(run)
        while True:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(keys.events(run), *([hints] if pending else []))
                while True:
                    message = pubsub.get_message(timeout=poll_s)
                    if message is None:
                        yield None
                        continue
                    try:
                        record = AdapterRecord.from_json(message["data"])
                    except (TypeError, ValueError, KeyError):
                        continue
                    yield PendingVersion(record) if message.get("channel") == hints else record
            except (redis.ConnectionError, redis.TimeoutError):
                yield None
                time.sleep(poll_s)
            finally:
                pubsub.close()


class AckWaiter:
    """Wakes a waiter when a replica acknowledges a version of `run`. Subscribe first,
    then check the state you wait for, then `wait` and check again: an ack that lands
    between the check and the wait is not lost (it is buffered on the subscription).
    Use as a context manager; it closes its connection."""

    def __init__(self, client: redis.Redis, run: str) -> None:
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(acks_channel(run))

    def wait(self, timeout_s: float) -> bool:
        """Blocks until an ack arrives (True) or `timeout_s` passes (False); drains any
        further acks already buffered, so one check covers them all."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            message = self._pubsub.get_message(timeout=max(0.0, deadline - time.monotonic()))
            if message is not None and message.get("type") == "message":
                while self._pubsub.get_message(timeout=0.0) is not None:
                    pass
                return True
            if time.monotonic() >= deadline:
                return False

    def close(self) -> None:
        self._pubsub.close()

    def __enter__(self) -> AckWaiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
