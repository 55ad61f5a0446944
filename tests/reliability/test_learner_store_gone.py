"""A learner whose fleet store (Redis) is gone stops with one clear line
and exit code 3 once ckpt-sync has not recorded its publish for `fleet.publish_retry_s`, its
trained steps checkpointed; with Redis back (empty) the deployed command resumes the run.

The learner is a real process under local Ray (sync mode, checkpoint every step) on the
real local stack; Redis is SIGKILLed after the step 1 checkpoint. Meanwhile the pool
plays the next step's groups on the replicas it last knew (the fleet store is a hint), so
the step is trained; its publish cannot be recorded.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import pytest

from rlfleet.local.metrics_jsonl import lineage_steps, read_events
from rlfleet.local.redis import start_redis
from rlfleet.local.stack import LocalStack
from rlfleet.storage import RunsRoot, list_checkpoints
from tests import factories
from tests.factories import HOT_SHORT_EPISODES, NO_EVAL, learner_process
from tests.reliability.conftest import stopped_cleanly_after_step_1
from tests.waits import scaled

RUN = "store-gone"
STEPS = 3


@pytest.mark.slow
def test_a_learner_whose_store_is_gone_stops_cleanly_and_resumes(
        stack: LocalStack, tmp_path: Path) -> None:
    config = factories.learner_config(
        stack, tmp_path, RUN, steps=STEPS, mode="sync",
        data=HOT_SHORT_EPISODES,
        eval=NO_EVAL, checkpoint={"every": 1, "keep_last": 3}, ray={"num_workers": 1},
        fleet={"max_groups_in_flight": 2, "publish_retry_s": 8})
    root = RunsRoot(stack.runs_root)
    (redis,) = [p for p in stack.group.procs if p.name == "redis"]
    # SIGKILL of Redis: the fleet's store is gone
    out, stop = stopped_cleanly_after_step_1(config, root, RUN, lambda: stack.group.kill(redis))
    # ckpt-sync answers UNAVAILABLE once its Redis client gives up (~9 s); a call cut
    # short by the bound ends DEADLINE_EXCEEDED: both are transient, retried until then
    assert "did not answer announcing adapter version" in stop \
        and ("UNAVAILABLE" in stop or "DEADLINE_EXCEEDED" in stop), out
    events = read_events(root.metrics_path(RUN))
    (failed,) = [e for e in events if e["event"] == "failed"]
    assert failed["error"] == "PublishFailed"
    assert failed["saved_step"] == failed["step"] == 2  # step 2 trained, not lost
    assert list_checkpoints(root, RUN)[-1] == 2

    start_redis(stack.group, port=urlparse(stack.redis_url).port, name="redis-back")
    proc = learner_process(config)
    out, _ = proc.communicate(timeout=scaled(900))
    assert proc.returncode == 0 and "Traceback" not in out, out
    events = read_events(root.metrics_path(RUN))
    assert [s["step"] for s in lineage_steps(events)] == list(range(1, STEPS + 1))
