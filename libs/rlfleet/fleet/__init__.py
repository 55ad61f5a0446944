"""The fleet store, the fleet's shared state in Redis: live rollout replicas (heartbeat
keys with a TTL), the latest adapter version per run (never going backwards), its
history, acknowledgements, and "new version" events over pub/sub. ("Registry" in
rlfleet means only `rlfleet.registries`, the named plugins.)

Nothing lives only here: adapter versions are rebuilt from /shared by ckpt-sync and
replicas re-register on their next heartbeat, so a flushed or restarted Redis heals.
Redis is a hint: with the fleet's token, heartbeats and acknowledgements are signed and
only verified ones count (see `identity`); ckpt-sync checks `latest` against /shared.
"""

from rlfleet.fleet.adapter_records import AdapterDirectory, AdapterRecord
from rlfleet.fleet.connection import (
    FleetAuthError,
    connect,
    fleet_store_full,
    fleet_unavailable_reason,
    verify_credentials,
)
from rlfleet.fleet.identity import fleet_signing_key
from rlfleet.fleet.replicas import ReplicaDirectory, ReplicaInfo

__all__ = ["AdapterRecord", "AdapterDirectory", "FleetAuthError", "ReplicaInfo",
           "ReplicaDirectory", "connect", "fleet_store_full", "fleet_signing_key",
           "fleet_unavailable_reason", "verify_credentials"]
