"""Expected fatal conditions of a run: what the learner cannot train through, but can stop
on cleanly (the trained steps checkpointed, one clear line, an exit code) instead of dying
with a traceback. A deployment reruns the learner (`--resume auto`), which continues from
that checkpoint once the fleet is back."""

from __future__ import annotations

import errno

# The exit code of a stop on a FleetFailure: 2 is a refused start (config, resume), 143 a
# SIGTERM; 3 says "the fleet failed, the run is saved: rerun with --resume auto".
EXIT_FLEET_FAILURE = 3


class FleetFailure(RuntimeError):
    """The fleet cannot carry the run on now (ckpt-sync unreachable past its bound, no
    replica left, rollouts failing, rewards that cannot be trained on)."""


class PublishFailed(FleetFailure):
    """ckpt-sync did not answer (transient codes only) within the publisher's bound."""


class ReplicasLost(FleetFailure):
    """No replica serves the new version, and none came to replace them in time."""


class RolloutsFailed(FleetFailure):
    """The rollout pool gave up on a group (every replica failed it, or it was refused)."""


class BadRewards(FleetFailure):
    """A step's rewards cannot be turned into advantages (NaN, inf, overflow)."""


class DiskFailure(FleetFailure):
    """A write to the runs root failed for good: the disk (or quota) is full, the volume
    read-only or not ours, or the device failing."""


# The errors of a write that waiting a moment will not fix (the adapter writer retries
# some of them a few times first).
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES,
                         errno.EPERM, errno.EIO})


def disk_failure(exc: OSError, what: str) -> DiskFailure | None:
    """`exc` as a DiskFailure naming `what` was written and the file, or None when it is
    not a disk's failure (a bug: let it surface)."""
    if exc.errno not in DISK_ERRNOS:
        return None
    where = f" ({exc.filename})" if exc.filename else ""
    return DiskFailure(f"cannot write {what}{where}: {exc.strerror or exc}")
