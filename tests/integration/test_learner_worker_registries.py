"""Configured GRPO names are checked in every process the learner starts: its Ray
workers are separate processes with registries of their own. A variant registered in code
in the driver alone fails at start-up, in the worker, naming the rank; one installed as an
entry point is found by the workers as by the driver."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import ray

from rlfleet.grpo import register_advantage_estimator
from rlfleet.grpo.advantages import ADVANTAGE_ESTIMATORS, group_normalized_advantages
from rlfleet.learner_config import LearnerConfig
from rlfleet_learner.ray_start import init_local_ray
from rlfleet_learner.workers import TrainerGroup, TrainWorker

PLUGIN_SITE = Path(__file__).resolve().parents[1] / "plugins" / "site"


@pytest.fixture(scope="module")
def local_ray():
    # The test plugin package is "installed" for the workers the way it is for the driver
    # in the entry-point test: its directory on their path.
    path = os.pathsep.join(p for p in (str(PLUGIN_SITE), os.environ.get("PYTHONPATH", "")) if p)
    init_local_ray(num_cpus=1, include_dashboard=False,
             object_store_memory=96 * 1024 * 1024, configure_logging=False,
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield
    ray.shutdown()


def config(model_dir: Path, estimator: str) -> LearnerConfig:
    return LearnerConfig.model_validate({
        "model": {"path": str(model_dir), "lora_rank": 4},
        "grpo": {"advantage_estimator": estimator},
        "ray": {"num_workers": 1},
    })


def test_a_variant_registered_in_the_driver_only_fails_at_start_up(
        local_ray, tiny_model_dir) -> None:
    @register_advantage_estimator("driver_only")
    def driver_only(rewards, group_ids, cfg):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
        return group_normalized_advantages(rewards, group_ids, std_normalize=False, eps=cfg.eps)

    try:
        cfg = config(tiny_model_dir, "driver_only")  # the driver knows it
        with pytest.raises(Exception) as err:  # noqa: PT011 - Ray's actor error wraps it
            TrainerGroup(cfg, str(tiny_model_dir))
    finally:
        ADVANTAGE_ESTIMATORS.unregister("driver_only")
    message = str(err.value)
    assert "GRPOConfig.advantage_estimator='driver_only' is not registered" in message
    assert "unknown advantage estimator 'driver_only' in Ray worker rank 0" in message
    assert "'grpo'" in message and "rlfleet.advantage_estimators" in message


def test_an_entry_point_variant_is_known_in_the_workers(
        local_ray, tiny_model_dir, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGIN_SITE))
    if "raw_reward" not in ADVANTAGE_ESTIMATORS:  # listed before the path had the plugin
        ADVANTAGE_ESTIMATORS.discover()
    try:
        cfg = config(tiny_model_dir, "raw_reward")
        assert "rlfleet-test-plugins 0.1.0" in ADVANTAGE_ESTIMATORS.source("raw_reward")
        worker = ray.remote(num_cpus=0)(TrainWorker).remote(
            cfg.model_dump_json(), str(tiny_model_dir), 0, 1)
        assert ray.get(worker.placement.remote())["rank"] == 0  # constructed: name known
        ray.kill(worker)
    finally:
        ADVANTAGE_ESTIMATORS.unregister("raw_reward")


def test_the_workers_run_at_the_drivers_priority(local_ray) -> None:
    # Ray's default worker_niceness (15) starved the trainer ranks beside any CPU-bound
    # process; init_local_ray starts them at nice 0
    @ray.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    assert ray.get(niceness.remote()) == 0
