"""The replicas in the fleet store, a real Redis: heartbeats carry capacity, and readers tolerate
fields they do not know (replicas and learners of different versions share a fleet store)."""

from __future__ import annotations

import json
import time

from rlfleet.fleet import ReplicaDirectory, ReplicaInfo, connect, keys


def test_heartbeat_round_trips_capacity(redis_url: str) -> None:
    store = ReplicaDirectory(connect(redis_url))
    store.heartbeat(ReplicaInfo("r1", "127.0.0.1:1", run="x", active_groups=1,
                                   active_episodes=4, max_groups=3, max_episodes=12), ttl_s=30)
    store.heartbeat(ReplicaInfo("r2", "127.0.0.1:2", run="x"), ttl_s=30)  # not advertised
    live = {r.replica_id: r for r in store.live()}
    assert (live["r1"].max_groups, live["r1"].max_episodes) == (3, 12)
    assert (live["r2"].max_groups, live["r2"].max_episodes) == (0, 0)


def test_unknown_fields_are_ignored_and_corrupt_values_skipped(redis_url: str) -> None:
    client = connect(redis_url)
    newer = {"replica_id": "new", "address": "127.0.0.1:3", "run": "x", "max_groups": 2,
             "max_episodes": 5, "a_field_from_the_future": {"x": 1}}
    client.set(keys.replica("new"), json.dumps(newer), px=30_000)
    client.set(keys.replica("bad"), "not json", px=30_000)
    client.set(keys.replica("list"), "[1, 2]", px=30_000)
    client.set(keys.replica("partial"), json.dumps({"address": "127.0.0.1:4"}), px=30_000)
    (info,) = ReplicaDirectory(client).live()
    assert (info.replica_id, info.max_groups, info.max_episodes) == ("new", 2, 5)


def test_signed_heartbeats_only_verified_ones_are_live(redis_url: str) -> None:
    from rlfleet.fleet import fleet_signing_key
    from rlfleet.fleet.identity import sign_document

    client = connect(redis_url)
    key = fleet_signing_key("fleet-token")
    ReplicaDirectory(client, key).heartbeat(ReplicaInfo("r1", "127.0.0.1:1", run="x"), 30)
    real = json.loads(client.get(keys.replica("r1")))
    assert real["mac"] and real["ttl_s"] == 30.0
    forged = {
        "moved": {**real, "address": "127.0.0.1:666"},
        "renamed": {**real, "replica_id": "evil"},
        "unsigned": {**real, "mac": ""},
        "stale": sign_document(key, {**real, "replica_id": "old"}, 30, now=time.time() - 60),
        "future": sign_document(key, {**real, "replica_id": "new"}, 30, now=time.time() + 60),
        "other-token": sign_document(fleet_signing_key("guess"), {**real, "replica_id": "g"}, 30),
    }
    for name, doc in forged.items():
        client.set(keys.replica(name), json.dumps(doc), px=30_000)
    assert [r.replica_id for r in ReplicaDirectory(client, key).live()] == ["r1"]
    assert len(ReplicaDirectory(client).live()) == 1 + len(forged)  # without a key: all
