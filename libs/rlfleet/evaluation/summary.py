"""What a set of greedy episodes says: the true solve rate (stopped on the target) with
its binomial standard error, apart from pass@1 (reward > 0, the published seed run's
metric: SkyRL counts a trajectory with a positive reward as a pass, which a reward with
format credit gives without a solve), and the solve rate in each band of shortest-path
length (rlfleet.maze.difficulty)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from rlfleet.maze.difficulty import by_band


def rate_stderr(hits: int, n: int) -> float:
    """The binomial standard error of a rate of `hits` in `n` (0 for no episode)."""
    if n == 0:
        return 0.0
    p = hits / n
    return math.sqrt(p * (1 - p) / n)


def summarize(trajectories: Sequence[Any]) -> dict[str, float]:
    """A set's numbers from its trajectories (rollout Trajectory messages: reward,
    turns, final_state.solved)."""
    n = len(trajectories)
    if n == 0:
        return {"episodes": 0}
    solved = sum(bool(t.final_state.solved) for t in trajectories)
    passed = sum(t.reward > 0 for t in trajectories)
    return {
        "episodes": n,
        "solved": solved,
        "solve_rate": solved / n,
        "solve_rate_se": rate_stderr(solved, n),
        "pass_at_1": passed / n,
        "pass_at_1_se": rate_stderr(passed, n),
        "mean_reward": statistics.fmean(t.reward for t in trajectories),
        "mean_turns": statistics.fmean(len(t.turns) for t in trajectories),
    }


def by_length(name: str, seeds: Sequence[int], by_seed: Mapping[int, Any], size: int
              ) -> dict[str, dict]:
    """The set's numbers in each band of shortest-path length (e.g. heldout_moves_ge12);
    bands with no maze of this size are left out."""
    return {f"{name}_{key}": summarize([by_seed[s] for s in members])
            for key, members in by_band(seeds, size).items()}
