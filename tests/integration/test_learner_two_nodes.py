"""The learner's ranks placed by their GPU request on a 2-node Ray cluster on this machine
(each node with one fake GPU; the device stays the CPU, so the backend is gloo): the two
ranks land on the two nodes, meet at rank 0's node address, and make the same update as
one rank; asking for more GPUs than the cluster has fails at start, naming the numbers."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import ray
import torch
from ray.cluster_utils import Cluster

from rlfleet.learner_config import LearnerConfig
from rlfleet_learner.devices import DeviceError
from rlfleet_learner.distributed import ClusterTooSmall
from rlfleet_learner.ray_start import SYSTEM_CONFIG, start_with_retry
from rlfleet_learner.workers import TrainerGroup
from tests.integration.test_learner_data_parallel import rows
from tests.waits import scaled

# a multi-node Ray takes the machine: one heavy tier at a time (tests/conftest.py)
pytestmark = pytest.mark.heavy

NODE = {"num_cpus": 1, "num_gpus": 1, "object_store_memory": 80 * 1024 * 1024}


def start_two_nodes() -> Cluster:
    """Two nodes and this process's driver on them; a start that fails ends its nodes."""
    cluster = Cluster()
    try:
        # workers at the driver's priority, as init_local_ray starts them (Ray's default
        # is nice 15: starved beside any CPU-bound process)
        cluster.add_node(**NODE, _system_config=dict(SYSTEM_CONFIG))
        cluster.add_node(**NODE)
        cluster.wait_for_nodes(timeout=scaled(60))
        ray.init(address=cluster.address, include_dashboard=False, configure_logging=False,
                 log_to_driver=False)
    except BaseException:
        cluster.shutdown()
        raise
    return cluster


@pytest.fixture(scope="module")
def two_gpu_nodes():
    cluster = start_with_retry(start_two_nodes)
    session_dir = cluster.head_node.get_session_dir_path()
    yield cluster
    ray.shutdown()
    cluster.shutdown()
    end_leftovers(session_dir)


def end_leftovers(session_dir: str) -> None:
    """What of the Ray session still runs after `Cluster.shutdown()`, ended: on a loaded
    machine its dashboard once outlived the shutdown and the whole test session."""
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if entry.name.isdigit() and session_dir in cmd:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


def config(model_dir, workers: int, device: str = "cpu", **ray_cfg) -> LearnerConfig:  # noqa: ANN001
    return LearnerConfig.model_validate({
        "model": {"path": str(model_dir), "lora_rank": 4, "device": device},
        "grpo": {"micro_batch_size": 2, "loss_reduction": "token_mean"},
        "optim": {"lr": 0.05},
        "ray": {"num_workers": workers, "num_gpus_per_worker": 1, **ray_cfg},
    })


def one_update(model_dir, workers: int, batch) -> tuple[dict, list[dict]]:  # noqa: ANN001
    group = TrainerGroup(config(model_dir, workers), str(model_dir))
    try:
        group.step(batch)
        return group.state()["adapter"], group.placements
    finally:
        group.close()


def test_ranks_land_on_their_gpu_nodes_and_match_one_rank(two_gpu_nodes,
                                                          tiny_model_dir) -> None:
    batch = rows(tiny_model_dir)
    one, _ = one_update(tiny_model_dir, 1, batch)
    two, placements = one_update(tiny_model_dir, 2, batch)
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    nodes = [p["node_id"] for p in placements]
    assert len(set(nodes)) == 2 and set(nodes) == alive  # one rank per GPU node
    assert all(len(p["gpu_ids"]) == 1 for p in placements)  # each holds its GPU
    assert one.keys() == two.keys()
    moved = 0
    for key, value in one.items():
        torch.testing.assert_close(value, two[key], rtol=1e-5, atol=1e-7)
        moved += int("lora_B" in key and value.abs().sum() > 0)
    assert moved > 0  # the update really changed the adapter (B starts at zero)



def test_a_resumed_group_makes_the_bit_identical_next_update(two_gpu_nodes,
                                                             tiny_model_dir) -> None:
    # what a resumed learner does: new ranks, the checkpointed state loaded, the next step
    batch = rows(tiny_model_dir)
    cfg = config(tiny_model_dir, 2)
    cfg = cfg.model_copy(update={"deterministic": True})
    group = TrainerGroup(cfg, str(tiny_model_dir))
    try:
        group.step(batch)
        saved = group.state()
        group.step(batch)
        straight = group.state()["adapter"]
    finally:
        group.close()
    group = TrainerGroup(cfg, str(tiny_model_dir))
    try:
        group.load_state(saved)
        group.step(batch)
        resumed = group.state()["adapter"]
    finally:
        group.close()
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_more_gpus_than_the_cluster_has_fail_at_start(two_gpu_nodes, tiny_model_dir) -> None:
    cfg = config(tiny_model_dir, 3, resources_timeout_s=0)
    with pytest.raises(ClusterTooSmall, match=r"num_workers=3 x .*= 3 GPUs, but the Ray "
                                              r"cluster has 2"):
        TrainerGroup(cfg, str(tiny_model_dir))
    cfg = config(tiny_model_dir, 1, num_gpus_per_worker=2, resources_timeout_s=0)
    with pytest.raises(ClusterTooSmall, match="largest Ray node has 1 GPUs"):
        TrainerGroup(cfg, str(tiny_model_dir))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_asked_of_a_rank_without_cuda_fails_at_start(two_gpu_nodes,
                                                          tiny_model_dir) -> None:
    # the fake GPU gets the rank placed; the rank itself finds no CUDA device
    with pytest.raises(DeviceError, match="cuda but this rank sees no CUDA device"):
        TrainerGroup(config(tiny_model_dir, 2, device="cuda"), str(tiny_model_dir))
    # the group killed its ranks: both GPUs come back to the cluster
    deadline = time.monotonic() + scaled(120)
    while ray.available_resources().get("GPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray.available_resources().get("GPU", 0) == 2
