"""The fleet's registry in Redis: live rollout replicas (heartbeat keys with a TTL), the
latest adapter version per run (never going backwards), its history, acknowledgements,
and "new version" events over pub/sub.

Nothing lives only here: adapter versions are rebuilt from /shared by ckpt-sync and
replicas re-register on their next heartbeat, so a flushed or restarted Redis heals.
Redis is a hint: with the fleet's token, heartbeats and acknowledgements are signed and
only verified ones count (see `identity`); ckpt-sync checks `latest` against /shared.
"""

from rlfleet.registry.adapters import AdapterRecord, AdapterRegistry
from rlfleet.registry.connection import (
    RegistryAuthError,
    connect,
    registry_full,
    registry_unavailable_reason,
    verify_credentials,
)
from rlfleet.registry.identity import registry_key
from rlfleet.registry.replicas import ReplicaInfo, ReplicaRegistry

__all__ = ["AdapterRecord", "AdapterRegistry", "RegistryAuthError", "ReplicaInfo",
           "ReplicaRegistry", "connect", "registry_full", "registry_key",
           "registry_unavailable_reason", "verify_credentials"]
