"""The BFS oracle: solves the eval mazes within the limit, from every floor cell."""

from __future__ import annotations

from collections import Counter

import pytest

from rlfleet.maze import (
    EVAL_SEEDS,
    Action,
    Layout,
    MazeEpisode,
    distance_to_target,
    format_action,
    generate_layout,
    oracle_action,
    oracle_actions,
    oracle_policy,
    shortest_path,
)


def test_oracle_solves_every_eval_seed_at_9x9_within_the_limit() -> None:
    for seed in EVAL_SEEDS:
        layout = generate_layout(seed, 9)
        episode = MazeEpisode(layout)
        for action in oracle_actions(layout):
            out = episode.step(format_action(action))
        assert out.reward == 1.0 and out.done, seed
        assert episode.stats.turns <= 20 and episode.stats.wall_bumps == 0


def test_report_eval_path_lengths() -> None:
    """Prints (does not assert) how many eval mazes fit 15 turns and the task limit."""
    for size, limit in ((9, 20), (11, 30)):
        turns = {s: distance_to_target(generate_layout(s, size)) + 1 for s in EVAL_SEEDS}
        over_15 = sorted(s for s, t in turns.items() if t > 15)
        over_limit = sorted(s for s, t in turns.items() if t > limit)
        print(
            f"\n{size}x{size}: turns needed (moves + stop) -> count "
            f"{dict(sorted(Counter(turns.values()).items()))}; more than 15 turns: "
            f"{len(over_15)} {over_15}; more than {limit}: {len(over_limit)} {over_limit}"
        )


def test_oracle_from_every_floor_cell_reaches_the_target() -> None:
    for seed in range(5):
        layout = generate_layout(seed, 11)
        policy = oracle_policy(layout)
        assert set(policy) == set(layout.floor_cells())
        for start, action in policy.items():
            assert action == oracle_action(layout, start)
            path = shortest_path(layout, start)
            assert path[0] == start and path[-1] == layout.target
            assert len(path) - 1 == distance_to_target(layout, start)
            steps = zip(path, path[1:], strict=False)
            assert all(abs(a[0] - b[0]) + abs(a[1] - b[1]) == 1 for a, b in steps)
            assert all(layout.is_floor(cell) for cell in path)
            actions = oracle_actions(layout, start)
            assert actions[-1] == Action.stop() and len(actions) == len(path)


def test_oracle_at_target_is_stop() -> None:
    layout = generate_layout(1, 9)
    assert oracle_action(layout, layout.target) == Action.stop()
    assert oracle_actions(layout, layout.target) == [Action.stop()]


def test_oracle_on_wall_or_cut_off_cell_rejected() -> None:
    layout = generate_layout(1, 9)
    with pytest.raises(ValueError, match="floor"):
        oracle_action(layout, (0, 0))
    walls = [[1] * 5, [1, 0, 0, 0, 1], [1, 1, 1, 1, 1], [1, 0, 1, 1, 1], [1] * 5]
    cut = Layout.from_walls(walls, (1, 1), (1, 3))
    with pytest.raises(ValueError, match="cannot be reached"):
        oracle_action(cut, (3, 1))
    assert (3, 1) not in oracle_policy(cut)


def test_ties_broken_in_visgym_move_order() -> None:
    walls = [[1] * 5, [1, 0, 0, 0, 1], [1, 0, 1, 0, 1], [1, 0, 0, 0, 1], [1] * 5]
    layout = Layout.from_walls(walls, (1, 1), (3, 3))
    assert oracle_action(layout) == Action.move(0)  # right before down
