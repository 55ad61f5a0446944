"""Greedy play of the eval sets through the rollout fleet: each maze one single-episode
group at temperature 0, played by the replicas' own episode player (the env service's
episodes, the reward service's scores), so an evaluation sees exactly what training
sees. The learner evaluates its live adapter version with it; `rlfleet eval` a base
model and an adapter on a fleet of its own."""

from __future__ import annotations

from collections.abc import Callable

from rlfleet.clients.rollout_pool import RolloutPool
from rlfleet.evaluation.summary import by_length, summarize
from rlfleet.learner_config import DataConfig, LearnerConfig
from rlfleet.maze.tasks import EVAL_SEEDS, HELDOUT_SEEDS
from rlfleet.names import to_wire
from rlfleet.v1 import common_pb2, rollout_pb2


def task_spec(data: DataConfig, seed: int, *, train: bool) -> common_pb2.TaskSpec:
    """The env task of one maze; evals play to max_turns (no per-maze margin)."""
    return common_pb2.TaskSpec(
        task=data.task, seed=seed, size=data.size, max_turns=data.max_turns,
        turn_margin=data.turn_margin if train else 0,
        render=common_pb2.RenderOptions(cell_px=data.cell_px))


def eval_episode(data: DataConfig, *, run: str, seed: int, version: int
                 ) -> rollout_pb2.GroupRequest:
    """One greedy episode of the maze `seed` on adapter `version` (0: the base model)."""
    return rollout_pb2.GroupRequest(
        task=task_spec(data, seed, train=False),
        group_size=1,
        sampling=rollout_pb2.SamplingParams(temperature=0.0,
                                            max_new_tokens=data.max_new_tokens),
        min_adapter_version=version,
        idempotency_key=f"{run}/eval/v{version}/seed{seed}",
        include_images=False,
        context_mode=to_wire(common_pb2.Context, data.context),
    )


def eval_sets(eval_seeds: int, heldout_seeds: int, heldout_only: int = 0
              ) -> dict[str, list[int]]:
    """The seeds played: the first `eval_seeds` fixed eval mazes and the first
    `heldout_seeds` held-out ones; `heldout_only > 0`: only the first that many held-out
    mazes (the cheap periodic points of a learning curve)."""
    if heldout_only:
        return {"heldout": list(HELDOUT_SEEDS)[:heldout_only]}
    return {"eval": list(EVAL_SEEDS)[:eval_seeds],
            "heldout": list(HELDOUT_SEEDS)[:heldout_seeds]}


def evaluate(pool: RolloutPool, cfg: LearnerConfig, version: int,
             progress: Callable[[int, int], None] | None = None, *,
             heldout_only: int = 0) -> dict[str, dict]:
    """Greedy play of the config's eval and held-out sets (cfg.eval) with its episodes'
    settings (cfg.data) on adapter `version`; each set summarized, and (a full evaluation)
    by band of shortest-path length (eval_moves_ge12, heldout_moves_8to11, ...)."""
    sets = eval_sets(cfg.eval.eval_seeds, cfg.eval.heldout_seeds, heldout_only)
    requests = [eval_episode(cfg.data, run=cfg.run, seed=seed, version=version)
                for seeds in sets.values() for seed in seeds]
    by_seed: dict[int, object] = {}
    total = len(requests)
    # As many single-episode groups in flight as the live replicas hold (the pool never
    # sends a replica more than it advertises; the rest wait in the pool, not as retries).
    in_flight = max(cfg.fleet.max_groups_in_flight, pool.groups_that_fit(1))
    for request, (trajectory,) in pool.run_groups(requests,
                                                  max_in_flight=max(1, min(total, in_flight))):
        by_seed[request.task.seed] = trajectory
        if progress is not None:
            progress(len(by_seed), total)
    result = {name: summarize([by_seed[s] for s in seeds]) for name, seeds in sets.items()
              if seeds}
    if not heldout_only:  # the long mazes apart: a gain only on short ones is less
        for name in ("eval", "heldout"):
            if sets[name]:
                result.update(by_length(name, sets[name], by_seed, cfg.data.size))
    curve = cfg.eval.curve_heldout
    if not heldout_only and 0 < curve < len(sets["heldout"]):
        # The periodic points' subset, read off the full evaluation: the learning curve
        # then starts and ends on the same mazes as its points in between.
        result["heldout_curve"] = summarize([by_seed[s] for s in sets["heldout"][:curve]])
    return result
