"""Rollout replicas as real processes: a real env service over gRPC, a real Redis, the
real tiny policy, real LoRA adapters published through ckpt-sync."""

from __future__ import annotations

import io
import threading
import time
import uuid
from pathlib import Path

import grpc
import pytest
import torch
from PIL import Image

from rlfleet.clients.rollout_pool import RolloutPool
from rlfleet.fleet import AdapterDirectory, AdapterRecord, ReplicaDirectory, connect
from rlfleet.names import CONTEXTS, to_wire
from rlfleet.policy.contexts import is_full_history
from rlfleet.rpc import RpcClient
from rlfleet.storage import RunsRoot
from rlfleet.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc, sync_pb2, sync_pb2_grpc
from tests.factories import publish_tiny_lora
from tests.waits import scaled, wait_until

Rollout = rollout_pb2_grpc.RolloutServiceStub


def group(seed: int = 1_000_001, g: int = 3, turns: int = 3, key: str | None = None,
          context: str = "full", temperature: float = 1.0, min_version: int = 0,
          sampling_seed: int = 0) -> rollout_pb2.GroupRequest:
    return rollout_pb2.GroupRequest(
        task=common_pb2.TaskSpec(task="maze_2d", seed=seed, size=7, max_turns=turns),
        group_size=g,
        sampling=rollout_pb2.SamplingParams(temperature=temperature, max_new_tokens=3,
                                            seed=sampling_seed),
        idempotency_key=key or uuid.uuid4().hex,
        include_images=True, context_mode=to_wire(common_pb2.Context, context),
        min_adapter_version=min_version)


def collect(address: str, request: rollout_pb2.GroupRequest) -> list[rollout_pb2.Trajectory]:
    return list(RpcClient(address, timeout_s=300).stream(Rollout, "RolloutGroup", request))


def code_of(fn) -> grpc.StatusCode:  # noqa: ANN001
    with pytest.raises(grpc.RpcError) as err:
        fn()
    assert err.value.details()
    return err.value.code()


@pytest.fixture
def env(start_env):  # noqa: ANN201
    return start_env()


def test_group_trajectories_are_complete(env, start_rollout) -> None:
    replica = start_rollout(env.address)
    trajectories = collect(replica.address, group(g=3, turns=3))
    assert sorted(t.index for t in trajectories) == [0, 1, 2]
    for t in trajectories:
        n = len(t.token_ids)
        assert len(t.logprobs) == len(t.loss_mask) == n
        assert 1 <= len(t.turns) <= 3
        model_positions = {i for turn in t.turns for i in range(turn.start, turn.end)}
        assert {i for i, m in enumerate(t.loss_mask) if m} == model_positions
        assert all(t.logprobs[i] < 0 for i in model_positions)
        assert all(t.logprobs[i] == 0 for i in range(n) if i not in model_positions)
        assert len(t.images) == len(t.turns) or t.final_state.done
        assert all(img.png.startswith(b"\x89PNG") and img.width == 7 * 16 for img in t.images)
        assert t.reward_name == "task" and "task" in t.reward_components
        assert t.adapter.version == 0 and t.replica_id == "rollout"
        assert t.final_state.turns == len(t.turns)
        assert t.segment_starts == [0] and t.context_mode == common_pb2.CONTEXT_FULL
        assert t.timings.total_s > 0


@pytest.mark.parametrize("context", ["full", "last_frame", "frame_only"])
def test_logprobs_equal_a_fresh_forward_pass(env, start_rollout, tiny_model_dir: Path,
                                             context: str) -> None:
    from rlfleet.policy import load_policy, sequence_logprobs

    replica = start_rollout(env.address)
    trajectories = collect(replica.address, group(g=2, turns=3, context=context,
                                                  temperature=0.8))
    model, processor = load_policy(tiny_model_dir, dtype=torch.float32)
    for t in trajectories:
        images = [Image.open(io.BytesIO(img.png)).convert("RGB") for img in t.images]
        bounds = [*t.segment_starts, len(t.token_ids)]
        image_i = 0
        for start, end in zip(bounds, bounds[1:], strict=False):
            ids = list(t.token_ids[start:end])
            n_img = sum(1 for off in t.image_token_offsets if start <= off < end)
            lp = sequence_logprobs(model, processor, ids, images[image_i:image_i + n_img],
                                   temperature=0.8)
            image_i += n_img
            for j in range(len(ids)):
                if t.loss_mask[start + j]:
                    assert lp[j].item() == pytest.approx(t.logprobs[start + j], abs=1e-4)


def test_the_enums_travel_over_the_wire(env, start_rollout) -> None:
    """Each Context value a request carries comes back in its trajectories (UNSPECIFIED as
    full, the default); a value of no Context (a newer client's) is refused, naming the
    known ones; GetStatus reports the engine as the Engine enum."""
    replica = start_rollout(env.address)
    for name in ("", *CONTEXTS):
        request = group(g=1, turns=2, context=name)
        [t] = collect(replica.address, request)
        assert t.context_mode == to_wire(common_pb2.Context, name or "full"), name
        per_turn = not is_full_history(name or "full")
        assert len(t.segment_starts) == (len(t.turns) if per_turn else 1), name
    unknown = group()
    unknown.context_mode = 99  # proto3 enums are open: the wire carries any number
    with pytest.raises(grpc.RpcError) as err:
        collect(replica.address, unknown)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown context value 99" in err.value.details()
    assert "last_frame (2)" in err.value.details()
    status = RpcClient(replica.address, timeout_s=30).call(Rollout, "GetStatus",
                                                           rollout_pb2.StatusRequest())
    assert status.engine_kind == common_pb2.ENGINE_HF


def test_idempotency_key_returns_the_same_group(env, start_rollout) -> None:
    replica = start_rollout(env.address)
    request = group(key="same-key")
    first = collect(replica.address, request)
    again = collect(replica.address, request)
    assert [t.SerializeToString() for t in first] == [t.SerializeToString() for t in again]
    other = group(key="same-key", seed=1_000_002)
    assert code_of(lambda: collect(replica.address, other)) == grpc.StatusCode.INVALID_ARGUMENT


def test_bad_requests_get_clear_statuses(env, start_rollout, procs) -> None:
    replica = start_rollout(env.address, "--adapter-wait-s", "0.2")
    a = replica.address
    bad_size = group()
    bad_size.group_size = 0
    assert code_of(lambda: collect(a, bad_size)) == grpc.StatusCode.INVALID_ARGUMENT
    bad_size.group_size = 10_000
    assert code_of(lambda: collect(a, bad_size)) == grpc.StatusCode.INVALID_ARGUMENT
    hot = group()
    hot.sampling.temperature = 50
    assert code_of(lambda: collect(a, hot)) == grpc.StatusCode.INVALID_ARGUMENT
    unknown = group()
    unknown.task.task = "no-such-task"
    assert code_of(lambda: collect(a, unknown)) == grpc.StatusCode.NOT_FOUND
    no_key = group()
    no_key.idempotency_key = ""
    assert code_of(lambda: collect(a, no_key)) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(lambda: collect(a, group(min_version=5))) == \
        grpc.StatusCode.FAILED_PRECONDITION
    # the replica's env is fixed by its settings (no request names one); a dead
    # env answers UNAVAILABLE
    procs.stop(env)
    assert code_of(lambda: collect(a, group())) == grpc.StatusCode.UNAVAILABLE
    # and the replica is still up
    status = RpcClient(a).call(Rollout, "GetStatus", rollout_pb2.StatusRequest())
    assert status.replica_id == "rollout"


def test_hot_load_verifies_and_swaps_adapters(env, start_rollout, start_ckptsync,
                                              redis_url: str, tmp_path: Path,
                                              tiny_model_dir: Path) -> None:
    root = RunsRoot(tmp_path / "runs")
    root.root.mkdir(parents=True)
    sync = start_ckptsync(redis_url, root.root)
    replica = start_rollout(env.address, "--sync-address", sync.address,
                            redis_url=redis_url, runs_root=root.root, run="hot")
    sync_client = RpcClient(sync.address, timeout_s=60)
    before = collect(replica.address, group(temperature=0, sampling_seed=1))
    assert {t.adapter.version for t in before} == {0}

    manifest = publish_tiny_lora(root, "hot", 1, tiny_model_dir)
    sync_client.call(sync_pb2_grpc.SyncServiceStub, "Publish", sync_pb2.PublishRequest(
        adapter=common_pb2.AdapterRef(run="hot", version=1)))
    reply = sync_client.call(sync_pb2_grpc.SyncServiceStub, "WaitForReplicas",
                             sync_pb2.WaitForReplicasRequest(run="hot", version=1,
                                                             min_replicas=1, timeout_s=60))
    assert list(reply.replica_ids) == ["rollout"]
    after = collect(replica.address, group(temperature=0, sampling_seed=1, min_version=1))
    assert {(t.adapter.version, t.adapter.sha256) for t in after} == \
        {(1, manifest.manifest_sha256)}
    assert [t.token_ids for t in after] != [t.token_ids for t in before]  # the adapter acts

    # A lying announcement (wrong sha256, or a path outside the runs root) is refused.
    # ckpt-sync treats /shared as the truth and may announce the genuine v2 it finds
    # there: the replica may then serve v2, but only with v2's real manifest.
    redis = connect(redis_url)
    genuine = {1: manifest.manifest_sha256,
               2: publish_tiny_lora(root, "hot", 2, tiny_model_dir).manifest_sha256}
    AdapterDirectory(redis).publish(AdapterRecord(
        run="hot", version=2, path="hot/adapters/v000002", sha256="0" * 64))
    AdapterDirectory(redis).publish(AdapterRecord(
        run="hot", version=3, path="../../../etc", sha256="0" * 64))
    wait_until("the replica to refuse a forged announcement",
               lambda: "adapter refused" in replica.log_path.read_text(), timeout_s=60)
    status = RpcClient(replica.address).call(Rollout, "GetStatus", rollout_pb2.StatusRequest())
    assert status.adapter.version in genuine
    assert status.adapter.sha256 == genuine[status.adapter.version]
    (live,) = ReplicaDirectory(redis).live()
    assert live.adapter_version in genuine


def test_running_episodes_finish_on_their_version(env, start_rollout, start_ckptsync,
                                                  redis_url: str, tmp_path: Path,
                                                  tiny_model_dir: Path) -> None:
    root = RunsRoot(tmp_path / "runs")
    root.root.mkdir(parents=True)
    sync = start_ckptsync(redis_url, root.root)
    replica = start_rollout(env.address, redis_url=redis_url, runs_root=root.root, run="swap")
    result: dict = {}
    long_group = group(g=2, turns=20)
    t = threading.Thread(target=lambda: result.update(
        traj=collect(replica.address, long_group)))
    t.start()
    time.sleep(1.0)
    publish_tiny_lora(root, "swap", 1, tiny_model_dir)
    RpcClient(sync.address).call(sync_pb2_grpc.SyncServiceStub, "Publish",
                                 sync_pb2.PublishRequest(adapter=common_pb2.AdapterRef(
                                     run="swap", version=1)))
    t.join(300)
    assert {tr.adapter.version for tr in result["traj"]} == {0}
    later = collect(replica.address, group(min_version=1))
    assert {tr.adapter.version for tr in later} == {1}


def _retries() -> float:
    from prometheus_client import REGISTRY

    return sum(sample.value for metric in REGISTRY.collect()
               if metric.name == "rlfleet_pool_group_retries"
               for sample in metric.samples if sample.name.endswith("_total"))


def test_replica_killed_mid_request_loses_nothing(env, start_rollout, redis_url: str,
                                                  procs) -> None:
    a = start_rollout(env.address, name="ra", redis_url=redis_url)
    b = start_rollout(env.address, name="rb", redis_url=redis_url)
    pool = RolloutPool(redis_url=redis_url, run="test", stream_timeout_s=300)
    requests = [group(seed=1_000_100 + i, g=3, turns=8) for i in range(4)]
    store = ReplicaDirectory(connect(redis_url))

    def kill_when_busy() -> None:  # SIGKILL replica "ra" while it plays a group
        deadline = time.monotonic() + scaled(120)
        while time.monotonic() < deadline:
            if any(r.replica_id == "ra" and r.active_groups for r in store.live()):
                procs.kill(a)
                return
            time.sleep(0.05)

    retries_before = _retries()
    killer = threading.Thread(target=kill_when_busy)
    killer.start()
    results = list(pool.run_groups(requests, max_in_flight=4))
    killer.join()
    assert not a.alive and b.alive
    assert _retries() > retries_before  # a group really was cut off and re-sent
    assert len(results) == 4
    for request, trajectories in results:
        assert [t.index for t in trajectories] == list(range(request.group_size))
        assert {t.idempotency_key for t in trajectories} == {request.idempotency_key}


def test_replica_joining_mid_run_gets_work(env, start_rollout, redis_url: str) -> None:
    start_rollout(env.address, name="first", redis_url=redis_url)
    pool = RolloutPool(redis_url=redis_url, run="test")
    seen: set[str] = set()
    joined = False
    for i in range(20):
        _, trajectories = next(pool.run_groups([group(seed=1_000_200 + i, g=2, turns=2)]))
        seen |= {t.replica_id for t in trajectories}
        if i == 0:
            start_rollout(env.address, name="second", redis_url=redis_url)
            joined = True
        if "second" in seen:
            break
    assert joined and seen == {"first", "second"}
