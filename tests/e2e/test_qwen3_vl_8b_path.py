"""The whole 8B code path on the CPU, on Qwen3-VL-8B's configuration scaled down in width
and depth (tests/scaled_8b.py): the production learner config
(configs/qwen3-vl-8b-hyperpod.yaml, cut to two small steps on the CPU), a vLLM replica
serving the qwen3-vl-8b profile (vLLM's AsyncLLM, its arguments from the profile), the
checkpoint's model class and chat template, GRPO updates and an adapter hot swap per
step."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

from rlfleet.engines.vllm import default_venv_python
from rlfleet.local.forkserver import popen
from rlfleet.local.metrics_jsonl import read_events
from rlfleet.local.stack import start_stack
from rlfleet.rpc import RpcClient
from rlfleet.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from tests import factories
from tests.factories import NO_EVAL
from tests.scaled_8b import build_scaled_8b
from tests.waits import scaled

# Its own time-out: a vLLM engine and a learner start here, often beside the cluster
# test's image builds; under that load the engine took 296 s to serve and the learner 214
# s to start (a suite of 2026-12-05), past the default 600 s.
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
RUN = "scaled-8b"


def learner_config(tmp_path: Path, model: Path, stack) -> Path:  # noqa: ANN001
    # the CPU: fp32, one thread, no GPUs asked of Ray; everything else is the 8B's
    return factories.learner_config(
        stack, tmp_path, RUN, model, base="configs/qwen3-vl-8b-hyperpod.yaml", steps=2, mode="sync",
        model={"device": "cpu", "dtype": "float32", "torch_threads": 1},
        data={"groups_per_step": 2, "group_size": 8, "max_turns": 2, "max_new_tokens": 4},
        grpo={"micro_batch_size": 8}, eval=NO_EVAL, checkpoint={"every": 1000},
        ray={"num_workers": 1, "num_gpus_per_worker": 0}, fleet={"max_groups_in_flight": 2})


def test_the_8b_path_rolls_out_on_vllm_trains_and_hot_swaps(tmp_path: Path, procs) -> None:
    python = default_venv_python()
    assert python.exists(), f"the vLLM venv is missing at {python}: scripts/setup_vllm_venv.sh"
    model = build_scaled_8b(tmp_path / "scaled-8b", acting_head=True)
    # the SFT recipe's reward: format credit differs between episodes of a random policy
    stack = start_stack(tmp_path, runs_root=tmp_path / "runs", run=RUN, model_dir=model,
                        replicas=0, reward="format+task", group=procs, log=lambda *_: None)
    # the 8B serving profile; on the CPU only the dtype and the KV cache size differ
    replica = stack.add_replica(
        "vllm-8b", "--engine", "vllm", "--profile", "qwen3-vl-8b", "--engine-args",
        json.dumps({"dtype": "float32", "kv_cache_memory_bytes": 128 << 20}),
        python=str(python))
    learner = popen([sys.executable, "-m", "rlfleet.cli", "learner", "run", "--config",
                     str(learner_config(tmp_path, model, stack))],
                    env={**os.environ, **stack.service_env}, cwd=REPO)
    out, _ = learner.communicate(timeout=scaled(2400))
    assert learner.returncode == 0, out[-6000:]

    steps = [e for e in read_events(stack.runs_root / RUN / "metrics.jsonl")
             if e["event"] == "step"]
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert s["trajectories"] == 16
    # the update ran on the groups whose rewards differ (GRPO drops the others)
    trained = [s for s in steps if s["rows"] > 0]
    assert trained, steps
    assert all(math.isfinite(s["grad_norm"]) and s["grad_norm"] > 0 for s in trained)
    # each step published a new version and the vLLM replica went live on it
    assert steps[1]["version"] == steps[0]["version"] + 1
    status = RpcClient(replica.address, timeout_s=30).call(
        rollout_pb2_grpc.RolloutServiceStub, "GetStatus", rollout_pb2.StatusRequest())
    assert status.engine_kind == common_pb2.ENGINE_VLLM and status.model == str(model)
    assert status.adapter.version == steps[1]["version"]
