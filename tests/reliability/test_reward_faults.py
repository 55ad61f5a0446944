"""A reward function that breaks its contract is refused at the reward
service's boundary, clearly and once.

A user's reward service (`rlfleet.reward.main`, its own process) whose function, by the
episode's seed, returns a reward outside its declared range, NaN, inf, None, or raises
ZeroDivisionError: every answer is FAILED_PRECONDITION naming the reward, the episode and
the value (or the exception's type and message), sent once (no channel retry). Through a
real replica the group ends INVALID_ARGUMENT with the same words and the pool does not
re-send it. A reward that declares no bound and pays 1e300 passes the service; the learner
refuses the group before advantages instead of training on all-zero advantages.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from rlfleet.clients.reward import RewardClient
from rlfleet.clients.rollout_pool import RolloutPool
from rlfleet.grpo import GRPOConfig, NonFiniteRewards
from rlfleet.local.procs import Proc, free_port
from rlfleet.rpc.errors import FailedPrecondition, InvalidArgument
from rlfleet.v1 import common_pb2, reward_pb2
from rlfleet_learner.samples import build_rows
from tests.reliability.conftest import Fleet, group, metric_value

JUDGE = textwrap.dedent('''
    """A reward function with bugs, by the episode's seed (seed % 10)."""
    import math
    import os

    from rlfleet.reward import RewardFunction, Score, main


    class Judge(RewardFunction):
        name = "flaky-judge"
        version = "0.3.0"
        components = ("task",)
        reward_range = ((-math.inf, math.inf) if os.environ.get("JUDGE_WIDE")
                        else (0.0, 1.0))
        calls = 0

        def score(self, episode):
            code = episode.spec.seed % 10
            if code == 1:
                return Score(1.5, {"task": 1.5})
            if code == 2:
                return Score(math.nan)
            if code == 3:
                return Score(math.inf)
            if code == 4:
                return None
            if code == 5:
                return Score(1 / (code - 5))
            if code == 6:  # huge, alternating within a batch: a group with variance
                Judge.calls += 1
                return Score(1e300 if Judge.calls % 2 else 0.0)
            return Score(0.5, {"task": 0.5})


    if __name__ == "__main__":
        raise SystemExit(main(Judge()))
''')

SCORE = ('grpc_code="FAILED_PRECONDITION",grpc_method="Score",'
         'grpc_service="rlfleet.v1.RewardService"')


def start_judge(fleet: Fleet, tmp_path: Path, name: str, wide: bool = False) -> Proc:
    (tmp_path / "judge.py").write_text(JUDGE)
    port, metrics = free_port(), free_port()
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    if wide:
        env["JUDGE_WIDE"] = "1"
    proc = fleet.procs.start_service(
        name, [sys.executable, "-m", "judge", "--port", str(port), "--metrics-port",
               str(metrics)], f"127.0.0.1:{port}", env=env)
    proc.extra["metrics_port"] = metrics
    return proc


def record(seed: int) -> reward_pb2.EpisodeRecord:
    return reward_pb2.EpisodeRecord(
        task=common_pb2.TaskSpec(task="maze_2d", seed=seed, size=7, max_turns=3),
        actions=["hmm"])


@pytest.mark.slow
def test_a_broken_reward_is_refused_once_with_its_reason(fleet: Fleet, tmp_path: Path
                                                         ) -> None:
    judge = start_judge(fleet, tmp_path, "judge")
    client = RewardClient(judge.address or "", timeout_s=30)
    assert client.score([record(1_000_000)]).scores[0].reward == 0.5
    expected = {
        1: "reward 1.5 is outside the declared range [0, 1]",
        2: "reward must be a finite number, got nan",
        3: "reward must be a finite number, got inf",
        4: "returned None, not an rlfleet.reward.Score",
        5: "raised ZeroDivisionError: division by zero",
    }
    for code, words in expected.items():
        seed = 1_000_000 + code
        with pytest.raises(FailedPrecondition) as err:
            client.score([record(1_000_000), record(seed)])
        message = err.value.message
        assert "reward 'flaky-judge' 0.3.0 on episode 1" in message, message
        assert f"seed {seed}" in message and words in message, message
    # each refused call reached the service exactly once: nothing was retried
    assert metric_value(judge.extra["metrics_port"], "rlfleet_grpc_requests_total",
                        SCORE) == len(expected)

    # through a replica and the pool: INVALID_ARGUMENT with the reason, never re-sent
    fleet.start_env("env")
    (replica,) = fleet.start_replicas(["r1"], "--reward-address", judge.address or "",
                                      fleet_store=False)
    pool = RolloutPool(addresses=[replica.address], run=fleet.run, stream_timeout_s=120)
    try:
        for code in (1, 5):
            with pytest.raises(InvalidArgument) as err:
                pool.run_group(group(seed=1_000_100 + code, g=2, turns=1))
            assert "flaky-judge" in err.value.message, err.value.message
            assert expected[code] in err.value.message, err.value.message
        assert pool.retries == {}
        assert metric_value(judge.extra["metrics_port"], "rlfleet_grpc_requests_total",
                            SCORE) == len(expected) + 2
        good = pool.run_group(group(seed=1_000_100, g=2, turns=1))
        assert [t.reward for t in good] == [0.5, 0.5]
    finally:
        pool.close()
    assert "Traceback" not in replica.log_path.read_text()
    assert "Traceback" not in judge.log_path.read_text()


@pytest.mark.slow
def test_the_learner_refuses_rewards_that_overflow_advantages(fleet: Fleet, tmp_path: Path
                                                              ) -> None:
    judge = start_judge(fleet, tmp_path, "judge-wide", wide=True)
    fleet.start_env("env")
    (replica,) = fleet.start_replicas(["r1"], "--reward-address", judge.address or "",
                                      fleet_store=False)
    pool = RolloutPool(addresses=[replica.address], run=fleet.run, stream_timeout_s=120)
    try:
        request = group(seed=1_000_206, g=2, turns=1)
        trajectories = pool.run_group(request)
    finally:
        pool.close()
    assert sorted(t.reward for t in trajectories) == [0.0, 1e300]
    with pytest.raises(NonFiniteRewards, match="overflow the group normalisation"):
        build_rows([(request.idempotency_key, trajectories)], 0, GRPOConfig())
