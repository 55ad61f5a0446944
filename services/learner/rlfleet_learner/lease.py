"""The learner's hold on its run, taken before Ray starts and before anything is written:
the run's lease (rlfleet.storage.lease: one learner per run) and the check that a
resume continues what its checkpoint trained (rlfleet_learner.identity)."""

from __future__ import annotations

import logging

from rlfleet import defaults
from rlfleet.learner_config import LearnerConfig
from rlfleet.policy.profiles import resolve_model_dir
from rlfleet.storage import RunsRoot
from rlfleet.storage.lease import LeaseHeld, LeaseLost, RunLease
from rlfleet_learner.faults import EXIT_FLEET_FAILURE
from rlfleet_learner.identity import check_before_start

log = logging.getLogger(__name__)

# A run another learner holds, or a learner cut off from its run: the same code as a
# failed fleet ("nothing lost; rerun later"): a deployment's retry takes the run over
# once the holder is gone.
EXIT_RUN_HELD = EXIT_FLEET_FAILURE

__all__ = ["EXIT_RUN_HELD", "LeaseHeld", "LeaseLost", "hold_run"]


def hold_run(cfg: LearnerConfig, resume: str) -> RunLease:
    """Takes the run's lease (LeaseHeld when a live learner holds it; a dead holder's
    lease is taken over once expired) and checks the resume against its checkpoint
    (ResumeRefused); the lease is given back when the check refuses."""
    lease = RunLease(RunsRoot(cfg.fleet.runs_root), cfg.run, cfg.lease_s)
    record = lease.acquire()
    try:
        model_dir = resolve_model_dir(cfg.model.profile, cfg.model.path, defaults.cache_dir())
        check_before_start(cfg, resume, model_dir)
    except BaseException:
        lease.release()
        raise
    if lease.taken_over is not None:
        log.warning("took the run over from a learner that stopped renewing its lease",
                    extra={"run": cfg.run, "generation": record.generation,
                           "previous": lease.taken_over.describe()})
    return lease
