"""Trainers as Ray actors: one per data-parallel rank, each with the GPU(s) it asks Ray
for (ray.num_gpus_per_worker), joined by torch.distributed (NCCL on GPUs, gloo on CPUs) at
an address on rank 0's node. The driver splits a step's micro-batches round-robin over the
ranks; every rank back-propagates its share and the gradients are summed (in buckets)
before one identical optimizer step on each rank."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from typing import Any

import ray
import torch

from rlfleet.grpo import TrainSample, check_registered_names
from rlfleet.learner_config import LearnerConfig
from rlfleet.policy import load_processor
from rlfleet.policy.observation import check_observation_profile
from rlfleet_learner import distributed
from rlfleet_learner.devices import check_device
from rlfleet_learner.episode_fit import check_episodes_fit
from rlfleet_learner.samples import row_key
from rlfleet_learner.trainer import _ADDITIVE, PolicyTrainer, StepResult, micro_batches


class TrainWorker:
    """One rank. Created through `ray.remote(...)` by `TrainerGroup`, which then calls
    `placement`, `check`, rank 0's `rendezvous_address` and `start`, in that order."""

    def __init__(self, cfg_json: str, model_dir: str, rank: int, world: int) -> None:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        # This process's own registries, checked before anything else: a GRPO variant
        # registered in code in the driver alone is unknown here, and must say so at
        # start-up, naming this rank, rather than deep in the config's validation.
        check_registered_names(
            json.loads(cfg_json).get("grpo", {}),
            where=f"Ray worker rank {rank} (pid {os.getpid()} on "
                  f"{ray.util.get_node_ip_address()})")
        self.cfg = LearnerConfig.model_validate_json(cfg_json)
        self.model_dir, self.rank, self.world = model_dir, rank, world
        self.device: torch.device | None = None
        self.trainer: PolicyTrainer | None = None

    def placement(self) -> dict[str, Any]:
        """Where Ray put this rank: node id and IP, and the GPU ids it was given."""
        ctx = ray.get_runtime_context()
        return {"rank": self.rank, "node_id": ctx.get_node_id(),
                "ip": ray.util.get_node_ip_address(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    def check(self) -> str:
        """The device this rank trains on; DeviceError if it cannot run the config."""
        m = self.cfg.model
        self.device = check_device(m.device, m.torch_dtype())
        return str(self.device)

    def rendezvous_address(self) -> str:
        return distributed.rendezvous_address(ray.util.get_node_ip_address())

    def start(self, address: str | None) -> int:
        """Load the policy, join the group at ``address`` (rank 0's) and take rank 0's
        adapter weights; the tokenizer's pad id."""
        assert self.device is not None, "check() first"
        self.trainer = PolicyTrainer(self.cfg, self.model_dir, device=self.device)
        if self.world > 1:
            assert address is not None
            distributed.join(address, self.rank, self.world, self.device)
            distributed.broadcast_from_rank0(self.trainer.params)
        return self.trainer.pad_id

    def step(self, batches: list, last: bool = True) -> tuple[dict[str, float], int, float]:
        totals = self.trainer.accumulate(batches)
        rows = sum(mb.size for mb in batches)
        return totals, rows, self.trainer.apply(advance_schedule=last)

    def adapter_files(self) -> dict[str, bytes]:
        return self.trainer.adapter_files()

    def bare_seconds(self, batches: list, forward_batch: int) -> tuple[float, float]:
        return self.trainer.bare_seconds(batches, forward_batch)

    def state(self) -> dict[str, Any]:
        t = self.trainer
        return {"adapter": t.lora_state(), "optimizer": t.optimizer.state_dict(),
                "scheduler": t.scheduler.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        t = self.trainer
        t.load_lora_state(state["adapter"])
        t.optimizer.load_state_dict(state["optimizer"])
        t.scheduler.load_state_dict(state["scheduler"])

    def lr(self) -> float:
        return float(self.trainer.optimizer.param_groups[0]["lr"])

    def set_horizon(self, steps: int) -> None:
        self.trainer.set_horizon(steps)

    def pad_id(self) -> int:
        return self.trainer.pad_id


def balanced_micro_batches(rows: Sequence[TrainSample], max_size: int, world: int,
                           pad_id: int) -> list:
    """Micro-batches of at most ``max_size`` distinct sequences, as many as a multiple of
    ``world`` and of near-equal size, so every rank gets the same share of the work."""
    distinct = len({row_key(r) for r in rows})
    if distinct == 0:
        return []
    count = -(-distinct // max_size)
    count = -(-count // world) * world
    return micro_batches(rows, -(-distinct // count), pad_id)


def update_batches(rows: Sequence[TrainSample], mini_batches: int, epochs: int, *,
                   seed: int) -> list[list[TrainSample]]:
    """The rows of each optimizer update of a step: per epoch the step's groups in a
    seeded random order, cut into ``mini_batches`` parts of whole groups (a trajectory's
    rows, and a group's trajectories, always train together)."""
    if mini_batches == 1 and epochs == 1:
        return [list(rows)] if rows else []
    groups: dict[object, list[TrainSample]] = {}
    for r in rows:
        groups.setdefault(r.group_id, []).append(r)
    keys = list(groups)
    rng = random.Random(seed)
    out = []
    for _ in range(epochs):
        rng.shuffle(keys)
        parts = min(mini_batches, len(keys))
        for p in range(parts):
            chunk = [r for k in keys[p::parts] for r in groups[k]]
            if chunk:
                out.append(chunk)
    return out


def _first_error(refs: list) -> list:
    """``ray.get(refs)``, raising the first failure as soon as it happens (a rank that
    failed to load leaves the others waiting at the rendezvous)."""
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        ray.get(done)
    return ray.get(refs)


def cluster_gpus() -> tuple[float, float]:
    """(GPUs in the Ray cluster, GPUs of its largest alive node)."""
    total = float(ray.cluster_resources().get("GPU", 0))
    nodes = [n.get("Resources", {}).get("GPU", 0) for n in ray.nodes() if n.get("Alive")]
    return total, float(max(nodes, default=0))


class TrainerGroup:
    """The driver's handle on the ranks."""

    def __init__(self, cfg: LearnerConfig, model_dir: str, *, num_cpus: float = 0.0) -> None:
        world, gpus = cfg.ray.num_workers, cfg.ray.num_gpus_per_worker
        # a profile the checkpoint marks foreign, or episodes its context cannot hold,
        # fail the run here, at start
        check_observation_profile(model_dir, cfg.data.context)
        check_episodes_fit(cfg, load_processor(model_dir))
        distributed.wait_for_gpus(world, gpus, cfg.ray.resources_timeout_s, cluster_gpus)
        actor = ray.remote(num_cpus=num_cpus, num_gpus=gpus)(TrainWorker)
        self.workers = [actor.remote(cfg.model_dump_json(), model_dir, rank, world)
                        for rank in range(world)]
        try:
            self.placements: list[dict[str, Any]] = ray.get(
                [w.placement.remote() for w in self.workers])
            self.devices: list[str] = _first_error([w.check.remote() for w in self.workers])
            address = (ray.get(self.workers[0].rendezvous_address.remote())
                       if world > 1 else None)
            # Waiting on every rank's answer also waits for the process group to form.
            self.pad_id = _first_error([w.start.remote(address) for w in self.workers])[0]
        except BaseException:
            self.close()
            raise
        self.micro_batch_size = cfg.grpo.micro_batch_size
        self.mini_batches, self.epochs, self.seed = (cfg.optim.mini_batches, cfg.optim.epochs,
                                                     cfg.seed)
        self.steps_done = 0

    def step(self, rows: Sequence[TrainSample]) -> StepResult:
        """One GRPO step: ``epochs`` passes over the rows, each split into
        ``mini_batches`` optimizer updates of whole groups."""
        updates = update_batches(rows, self.mini_batches, self.epochs,
                                 seed=self.seed * 1_000_003 + self.steps_done)
        self.steps_done += 1
        totals: dict[str, float] = {}
        n, forward, norms = 0, 0, []
        for i, chunk in enumerate(updates):
            batches = balanced_micro_batches(chunk, self.micro_batch_size, len(self.workers),
                                             self.pad_id)
            forward += sum(mb.num_forward for mb in batches)
            shards = [batches[r::len(self.workers)] for r in range(len(self.workers))]
            last = i == len(updates) - 1
            results = ray.get([w.step.remote(s, last)
                               for w, s in zip(self.workers, shards, strict=True)])
            for stats, rows_done, _ in results:
                n += rows_done
                for k, v in stats.items():
                    totals[k] = totals.get(k, 0.0) + v
            norms.append(results[0][2])
        # additive stats are per update: their mean over updates is the step's figure
        stats = {k: (v / len(updates) if k in _ADDITIVE else v / max(n, 1))
                 for k, v in totals.items()}
        return StepResult(stats, sum(norms) / len(norms), rows=len(rows),
                          forward_rows=forward // max(1, self.epochs))

    def bare_seconds(self, rows: Sequence[TrainSample], forward_batch: int
                     ) -> tuple[float, float]:
        """Wall seconds of a bare forward+backward and of a bare batched forward of
        ``rows`` (no cache, no merged duplicates), split over the ranks as a step is."""
        batches = micro_batches(rows, self.micro_batch_size, self.pad_id, dedup=False)
        shards = [batches[r::len(self.workers)] for r in range(len(self.workers))]
        times = ray.get([w.bare_seconds.remote(s, forward_batch)
                         for w, s in zip(self.workers, shards, strict=True)])
        return max(t[0] for t in times), max(t[1] for t in times)

    def adapter_files(self) -> dict[str, bytes]:
        return ray.get(self.workers[0].adapter_files.remote())

    def state(self) -> dict[str, Any]:
        return ray.get(self.workers[0].state.remote())

    def load_state(self, state: dict[str, Any]) -> None:
        ray.get([w.load_state.remote(state) for w in self.workers])

    def lr(self) -> float:
        return ray.get(self.workers[0].lr.remote())

    def set_horizon(self, steps: int) -> None:
        """Every rank's schedule decays to 0 at `steps` (a time budget's plan)."""
        ray.get([w.set_horizon.remote(steps) for w in self.workers])

    def close(self) -> None:
        for w in self.workers:
            ray.kill(w)
