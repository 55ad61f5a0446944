"""The learner's hardware options: refused at start with the numbers when the device, dtype
or cluster cannot run them; gradient buckets; activation checkpointing changes memory,
not the gradients."""

from __future__ import annotations

import pytest
import torch

from rlfleet.learner_config import LearnerConfig
from rlfleet_learner.devices import DeviceError, check_device
from rlfleet_learner.distributed import (
    ClusterTooSmall,
    backend_for,
    buckets,
    check_cluster_gpus,
    wait_for_gpus,
)


def test_dtype_follows_the_device_unless_set() -> None:
    cpu = LearnerConfig.model_validate({})
    gpu = LearnerConfig.model_validate({"model": {"device": "cuda"},
                                        "ray": {"num_gpus_per_worker": 1}})
    assert cpu.model.torch_dtype() == "float32"
    assert gpu.model.torch_dtype() == "bfloat16"
    assert LearnerConfig.model_validate(
        {"model": {"dtype": "bfloat16"}}).model.torch_dtype() == "bfloat16"
    assert backend_for("cpu") == "gloo" and backend_for("cuda") == "nccl"


@pytest.mark.parametrize("bad, message", [
    ({"model": {"device": "cuda"}}, r"cuda but ray.num_gpus_per_worker=0"),
    ({"model": {"device": "cuda"}, "ray": {"num_gpus_per_worker": 0.5}},
     r"num_gpus_per_worker=0.5"),
    ({"model": {"dtype": "float16"}}, "float16 on device cpu"),
    ({"model": {"device": "cuda:1"}, "ray": {"num_gpus_per_worker": 1}}, "device"),
])
def test_configs_the_hardware_cannot_run_are_refused(bad: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LearnerConfig.model_validate(bad)


def test_the_rank_checks_its_own_device() -> None:
    assert check_device("cpu", "float32") == torch.device("cpu")
    with pytest.raises(DeviceError, match="float16 on device cpu"):
        check_device("cpu", "float16")
    if torch.cuda.is_available():
        assert check_device("cuda", "float32").type == "cuda"
    else:
        with pytest.raises(DeviceError, match=r"cuda but this rank sees no CUDA device "
                                              r"\(torch .*0 visible\)"):
            check_device("cuda", "bfloat16")


def test_cluster_checks_name_the_numbers() -> None:
    check_cluster_gpus(2, 1, total=6, largest_node=2)
    with pytest.raises(ClusterTooSmall, match=r"num_workers=4 x ray.num_gpus_per_worker=2 = "
                                              r"8 GPUs, but the Ray cluster has 6"):
        check_cluster_gpus(4, 2, total=6, largest_node=2)
    with pytest.raises(ClusterTooSmall, match="num_gpus_per_worker=4, but the largest Ray "
                                              "node has 2 GPUs"):
        check_cluster_gpus(1, 4, total=6, largest_node=2)
    seen = []
    with pytest.raises(ClusterTooSmall, match=r"has 1 \(waited 0 s"):
        wait_for_gpus(2, 1, 0, lambda: seen.append(1) or (1.0, 1.0))
    assert seen  # looked at the cluster before giving up
    wait_for_gpus(8, 0, 0, lambda: (0.0, 0.0))  # CPU ranks ask for nothing


def test_buckets_keep_order_and_split_by_size_and_dtype() -> None:
    ts = [torch.zeros(4), torch.zeros(4), torch.zeros(16), torch.zeros(2, dtype=torch.float64),
          torch.zeros(1)]
    runs = list(buckets(ts, max_bytes=32))
    assert [[t.numel() for t in r] for r in runs] == [[4, 4], [16], [2], [1]]
    assert [t for r in runs for t in r] == ts


def test_activation_checkpointing_gives_the_same_gradients(tiny_model_dir) -> None:  # noqa: ANN001
    from rlfleet_learner.trainer import PolicyTrainer
    from tests.integration.test_learner_data_parallel import rows

    batch = rows(tiny_model_dir, n=4)
    grads = []
    for checkpointing in (False, True):
        cfg = LearnerConfig.model_validate({
            "model": {"path": str(tiny_model_dir), "lora_rank": 4,
                      "gradient_checkpointing": checkpointing},
            "grpo": {"micro_batch_size": 2, "loss_reduction": "token_mean"},
            "optim": {"lr": 0.05}})
        trainer = PolicyTrainer(cfg, str(tiny_model_dir))
        layers = trainer.model.get_base_model().model.language_model
        assert layers.gradient_checkpointing is checkpointing
        trainer.accumulate(trainer.micro_batches(batch))
        grads.append({n: p.grad.clone() for n, p in trainer.model.named_parameters()
                      if p.requires_grad and p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name, g in grads[0].items():
        torch.testing.assert_close(g, grads[1][name], rtol=1e-5, atol=1e-7)
