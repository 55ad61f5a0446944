"""Every service writes pure JSON lines (start, serving, a failed call, drain), and a failed
call is logged once, server side, with its method and code."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from rlfleet.local.procs import Proc, ProcessGroup
from rlfleet.logs import COMMON_KEYS
from rlfleet.v1 import (
    common_pb2,
    env_pb2,
    env_pb2_grpc,
    reward_pb2,
    reward_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
    sync_pb2,
    sync_pb2_grpc,
)


def log_lines(proc: Proc) -> list[dict]:
    """Every line of the process's log (stdout and stderr) as JSON; fails on any other."""
    docs = []
    for n, line in enumerate(proc.log_path.read_text().splitlines(), 1):
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"{proc.name} log line {n} is not JSON: {line!r}")
        assert isinstance(doc, dict) and set(COMMON_KEYS) <= set(doc), (proc.name, doc)
        docs.append(doc)
    return docs


def fail_once(address: str, call: Callable[[grpc.Channel], object]) -> grpc.StatusCode:
    with grpc.insecure_channel(address) as channel:
        with pytest.raises(grpc.RpcError) as err:
            result = call(channel)
            if hasattr(result, "__next__"):
                list(result)  # a stream fails when read
        return err.value.code()


def check_one_failure(procs: ProcessGroup, proc: Proc, method: str, code: grpc.StatusCode,
                      service: str) -> list[dict]:
    assert procs.stop(proc) == 0  # a clean drain, its lines in the log
    docs = log_lines(proc)
    assert all(d["service"] == service for d in docs)
    failed = [d for d in docs if "grpc_code" in d]
    assert [(d["grpc_method"], d["grpc_code"]) for d in failed] == [(method, code.name)]
    assert failed[0]["details"] and failed[0]["level"] == "warning"
    assert any("listening" in d["msg"] for d in docs)
    return docs


def test_env_and_reward_services_log_json_and_each_failed_call_once(
        procs: ProcessGroup, start_env) -> None:  # noqa: ANN001
    env = start_env("--role", "env", name="env")
    code = fail_once(env.address, lambda ch: env_pb2_grpc.EnvServiceStub(ch).Step(
        env_pb2.StepRequest(actions=[env_pb2.Action(episode_id="no-such-episode",
                                                    text="up")]), timeout=10))
    check_one_failure(procs, env, "Step", code, "env")

    reward = start_env("--role", "reward", name="reward")
    code = fail_once(reward.address, lambda ch: reward_pb2_grpc.RewardServiceStub(ch).Score(
        reward_pb2.ScoreRequest(episodes=[reward_pb2.EpisodeRecord(
            task=common_pb2.TaskSpec(task="no-such-task"))]), timeout=10))
    check_one_failure(procs, reward, "Score", code, "env")


def test_ckptsync_logs_json_and_each_failed_call_once(procs: ProcessGroup, redis_url: str,
                                                      start_ckptsync, tmp_path: Path
                                                      ) -> None:  # noqa: ANN001
    sync = start_ckptsync(redis_url, tmp_path / "runs")
    code = fail_once(sync.address, lambda ch: sync_pb2_grpc.SyncServiceStub(ch).GetLatest(
        sync_pb2.GetLatestRequest(run="never-published"), timeout=10))
    assert code == grpc.StatusCode.NOT_FOUND
    check_one_failure(procs, sync, "GetLatest", code, "ckptsync")


def test_rollout_replica_logs_json_and_each_failed_call_once(procs: ProcessGroup, start_env,
                                                             start_rollout) -> None:  # noqa: ANN001
    env = start_env()
    replica = start_rollout(env.address)  # the transformers engine, the tiny model
    code = fail_once(replica.address,
                     lambda ch: rollout_pb2_grpc.RolloutServiceStub(ch).RolloutGroup(
                         rollout_pb2.GroupRequest(), timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    # loading the model drew transformers' progress bar here before: none in a log file
    check_one_failure(procs, replica, "RolloutGroup", code, "rollout")


def test_warnings_library_loggers_and_uncaught_errors_are_json_lines() -> None:
    script = """
import logging, warnings
from rlfleet.logs import setup_logging
setup_logging("probe")
warnings.warn("a deprecated thing")
from transformers.utils import logging as hf_logging
hf_logging.get_logger("transformers.probe").warning("from transformers")
logging.getLogger("grpc._probe").warning("from grpc")
import threading
t = threading.Thread(target=lambda: 1 / 0, name="worker"); t.start(); t.join()
raise RuntimeError("the end")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    docs = [json.loads(line) for line in proc.stderr.splitlines()]
    assert all(set(COMMON_KEYS) <= set(d) and d["service"] == "probe" for d in docs)
    by_msg = {d["msg"].split("\n")[0]: d for d in docs}
    assert by_msg["from transformers"]["logger"] == "transformers.probe"
    assert by_msg["from grpc"]["logger"] == "grpc._probe"
    assert any(d["logger"] == "py.warnings" and "a deprecated thing" in d["msg"] for d in docs)
    uncaught = [d for d in docs if d["logger"] == "rlfleet.uncaught"]
    assert [d["level"] for d in uncaught] == ["critical", "critical"]
    assert "ZeroDivisionError" in uncaught[0]["exc"] and "the end" in uncaught[1]["msg"]
