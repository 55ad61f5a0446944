"""Trainers as Ray actors: one per data-parallel rank, joined by torch.distributed (gloo on
CPU, NCCL would serve GPUs the same way). The driver splits a step's micro-batches
round-robin over the ranks; every rank back-propagates its share and the gradients are
summed before one identical optimizer step on each rank."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Sequence
from typing import Any

import ray
import torch

from rlfleet.grpo import TrainSample
from rlfleet_learner.config import LearnerConfig
from rlfleet_learner.samples import row_key
from rlfleet_learner.trainer import _ADDITIVE, PolicyTrainer, StepResult, micro_batches


class TrainWorker:
    """One rank. Created through `ray.remote(...)` by `TrainerGroup`."""

    def __init__(self, cfg_json: str, model_dir: str, rank: int, world: int,
                 master: str) -> None:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        if world > 1:
            torch.distributed.init_process_group(
                "gloo", init_method=f"tcp://{master}", rank=rank, world_size=world)
        self.rank = rank
        self.trainer = PolicyTrainer(LearnerConfig.model_validate_json(cfg_json), model_dir)

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


def _free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


class TrainerGroup:
    """The driver's handle on the ranks."""

    def __init__(self, cfg: LearnerConfig, model_dir: str, *, num_cpus: float = 0.0,
                 num_gpus: float = 0.0) -> None:
        world = cfg.ray.num_workers
        master = _free_address()
        actor = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(TrainWorker)
        self.workers = [actor.remote(cfg.model_dump_json(), model_dir, rank, world, master)
                        for rank in range(world)]
        self.micro_batch_size = cfg.grpo_config().micro_batch_size
        self.mini_batches, self.epochs, self.seed = (cfg.optim.mini_batches, cfg.optim.epochs,
                                                     cfg.seed)
        self.steps_done = 0
        # Waiting on every rank's answer also waits for the process group to form.
        self.pad_id = ray.get([w.pad_id.remote() for w in self.workers])[0]

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

    def close(self) -> None:
        for w in self.workers:
            ray.kill(w)
