"""The path-efficiency reward: its scores, and the service passing rlfleet's conformance
kit (a real gRPC server on loopback)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from path_efficiency_reward import PathEfficiency, reward

from rlfleet.conformance import run_checks
from rlfleet.maze import generate_layout, oracle_texts
from rlfleet.reward import Episode, serve
from rlfleet.tasks import default_tasks
from rlfleet.v1 import common_pb2

HERE = Path(__file__).resolve().parents[1]


def score(seed: int, actions: list[str], task: str = "maze_2d"):
    spec = common_pb2.TaskSpec(task=task, seed=seed, max_turns=100)
    replayed, steps = default_tasks(discover=False).replay(spec, actions)
    return reward.score(Episode(spec, tuple(actions), common_pb2.EpisodeState(), replayed,
                                tuple(steps)))


@pytest.mark.parametrize("task", ["maze_2d", "maze_2d_hard"])
def test_an_optimal_solve_scores_one(task: str) -> None:
    size = 9 if task == "maze_2d" else 11
    s = score(3, oracle_texts(generate_layout(3, size)), task)
    assert s.solved and s.reward == 1.0
    assert dict(s.components) == {"task": 1.0, "efficiency": 1.0}


def test_detours_cost_in_proportion() -> None:
    solve = oracle_texts(generate_layout(3, 9))
    wander = ["no idea", "('move', 7)"]  # two invalid turns, then the optimal path
    s = score(3, wander + solve)
    assert s.solved and s.reward == pytest.approx(len(solve) / (len(solve) + 2))
    assert s.components["efficiency"] == s.reward


@pytest.mark.parametrize("actions", [[], ["('stop', 'stop')"], ["garbage"] * 5])
def test_anything_but_a_true_solve_scores_zero(actions: list[str]) -> None:
    s = score(3, actions)
    assert not s.solved and s.reward == 0.0 and s.components["task"] == 0.0


def test_reaching_the_target_without_stopping_scores_zero() -> None:
    s = score(3, oracle_texts(generate_layout(3, 9))[:-1])
    assert not s.solved and s.reward == 0.0


def test_the_entry_point_names_this_reward() -> None:
    meta = tomllib.loads((HERE / "pyproject.toml").read_text())
    eps = meta["project"]["entry-points"]["rlfleet.rewards"]
    assert eps == {reward.name: "path_efficiency_reward:reward"}
    assert isinstance(reward, PathEfficiency) and reward.version == meta["project"]["version"]


def test_the_service_passes_the_conformance_kit() -> None:
    server = serve(reward, port=0, metrics_port=None, block=False, auth="none")
    try:
        results = run_checks(server.address)
    finally:
        server.stop(grace_s=0)
    failed = [r for r in results if r.outcome == "fail"]
    assert not failed, failed
    passed = {r.name for r in results if r.outcome == "pass"}
    assert {"core.reward_info", "core.reward_scores", "core.reward_errors",
            "maze_2d.reward_scores", "maze_2d_hard.reward_scores"} <= passed


def test_the_containerfile_runs_the_service_as_non_root() -> None:
    lines = [ln.strip() for ln in (HERE / "Containerfile").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    users = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    assert users[-1] == "10001:10001"  # the rlfleet images' user
    copied = [ln.split()[1:-1] for ln in lines if ln.startswith("COPY ")]
    assert all((HERE / src).exists() for srcs in copied for src in srcs)
    scripts = tomllib.loads((HERE / "pyproject.toml").read_text())["project"]["scripts"]
    assert any(ln.startswith("ENTRYPOINT") and f'"{name}"' in ln
               for ln in lines for name in scripts)
    assert 'CMD ["--port", "50051", "--metrics-port", "9101"]' in lines
