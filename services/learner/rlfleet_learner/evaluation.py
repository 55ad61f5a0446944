"""Greedy evaluation through the rollout fleet: the 64 fixed eval mazes and a larger
held-out set. The true solve rate (stopped on the target) is reported apart from pass@1
(reward > 0, which a format-crediting reward service can give without a solve)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from rlfleet.clients.rollout_pool import RolloutPool
from rlfleet.learner_config import LearnerConfig
from rlfleet.maze.difficulty import by_band
from rlfleet.maze.tasks import EVAL_SEEDS, HELDOUT_SEEDS
from rlfleet_learner.requests import eval_episode


def summarize(trajectories: list) -> dict[str, float]:
    n = len(trajectories)
    if n == 0:
        return {"episodes": 0}
    solved = sum(t.final_state.solved for t in trajectories)
    rate = solved / n
    return {
        "episodes": n,
        "solved": solved,
        "solve_rate": rate,
        "solve_rate_se": math.sqrt(rate * (1 - rate) / n),
        "pass_at_1": sum(t.reward > 0 for t in trajectories) / n,
        "mean_reward": statistics.fmean(t.reward for t in trajectories),
        "mean_turns": statistics.fmean(len(t.turns) for t in trajectories),
    }


def by_length(name: str, seeds: list[int], by_seed: dict[int, object], size: int
              ) -> dict[str, dict]:
    """The set's solve rate in each band of shortest-path length (e.g. heldout_moves_ge12);
    bands with no maze of this size are left out."""
    return {f"{name}_{key}": summarize([by_seed[s] for s in members])
            for key, members in by_band(seeds, size).items()}


def evaluate(pool: RolloutPool, cfg: LearnerConfig, version: int,
             progress: Callable[[int, int], None] | None = None, *,
             heldout_only: int = 0) -> dict[str, dict]:
    """Greedy play of the eval and held-out sets; ``heldout_only > 0`` plays only the
    first that many held-out mazes (the cheap periodic points of a learning curve)."""
    if heldout_only:
        sets = {"heldout": list(HELDOUT_SEEDS)[:heldout_only]}
    else:
        sets = {
            "eval": list(EVAL_SEEDS)[: cfg.eval.eval_seeds],
            "heldout": list(HELDOUT_SEEDS)[: cfg.eval.heldout_seeds],
        }
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
    if not heldout_only and sets["heldout"]:
        result.update(by_length("heldout", sets["heldout"], by_seed, cfg.data.size))
    curve = cfg.eval.curve_heldout
    if not heldout_only and 0 < curve < len(sets["heldout"]):
        # The periodic points' subset, read off the full evaluation: the learning curve
        # then starts and ends on the same mazes as its points in between.
        result["heldout_curve"] = summarize([by_seed[s] for s in sets["heldout"][:curve]])
    return result
