"""Typed clients of the fleet's services, and the learner's pool of rollout replicas.

`EnvClient`, `RewardClient`, `RolloutClient`, `SyncClient`: one per service, methods named
for what they do, typed arguments and results (the generated messages), errors as
`rlfleet.rpc.errors` classes. `RolloutPool`: the learner's view of many replicas."""

from rlfleet.lazy import lazy_exports

# each public name -> the submodule that defines it, imported on first use (the pool
# imports redis and prometheus; an env client needs neither)
_EXPORTS = {
    "EnvClient": "rlfleet.clients.env",
    "RewardClient": "rlfleet.clients.reward",
    "RolloutClient": "rlfleet.clients.rollout",
    "RolloutPool": "rlfleet.clients.rollout_pool",
    "SyncClient": "rlfleet.clients.sync",
    "TrajectoryStream": "rlfleet.clients.rollout",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
