"""The fleet's registry in Redis: live rollout replicas (heartbeat keys with a TTL), the
latest adapter version per run (never going backwards), its history, acknowledgements,
and "new version" events over pub/sub.

Nothing lives only here: adapter versions are rebuilt from /shared by ckpt-sync and
replicas re-register on their next heartbeat, so a flushed or restarted Redis heals.
"""

from rlfleet.registry.adapters import AdapterRecord, AdapterRegistry
from rlfleet.registry.connection import connect, verify_credentials
from rlfleet.registry.replicas import ReplicaInfo, ReplicaRegistry

__all__ = ["AdapterRecord", "AdapterRegistry", "ReplicaInfo", "ReplicaRegistry", "connect",
           "verify_credentials"]
