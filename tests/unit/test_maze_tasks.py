"""Task presets and the eval / held-out / training seed split."""

from __future__ import annotations

import pytest

from rlfleet.maze import (
    EVAL_SEEDS,
    HELDOUT_SEEDS,
    TASKS,
    TRAIN_SEED_BASE,
    generate_layout,
    get_task,
    new_episode,
    seed_split,
    train_seeds,
)


def test_presets() -> None:
    assert TASKS["maze_2d"].size == 9 and TASKS["maze_2d"].max_turns == 20
    assert TASKS["maze_2d_hard"].size == 11 and TASKS["maze_2d_hard"].max_turns == 30
    with pytest.raises(ValueError, match="maze_2d"):
        get_task("maze_3d")


def test_new_episode_overrides() -> None:
    episode = new_episode("maze_2d", 3)
    assert episode.layout == generate_layout(3, 9) and episode.max_turns == 20
    episode = new_episode("maze_2d", 3, size=11, action_format="tags", cell_px=16)
    assert episode.layout.height == 11 and episode.max_turns == 30
    assert episode.action_format == "tags" and episode.cell_px == 16
    assert new_episode("maze_2d", 3, size=11, max_turns=15).max_turns == 15


def test_splits_are_disjoint() -> None:
    assert list(EVAL_SEEDS) == list(range(64))
    assert set(EVAL_SEEDS).isdisjoint(HELDOUT_SEEDS)
    batch = train_seeds(0, 50)
    assert batch.seeds == list(range(TRAIN_SEED_BASE, TRAIN_SEED_BASE + 50))
    assert batch.next_cursor == 50
    assert {seed_split(s) for s in batch.seeds} == {"train"}
    assert seed_split(0) == "eval" and seed_split(64) == "heldout"
    assert seed_split(319) == "heldout" and seed_split(320) == "unassigned"


def test_cursor_continues() -> None:
    first = train_seeds(0, 5, size=9)
    second = train_seeds(first.next_cursor, 5, size=9)
    assert set(first.seeds).isdisjoint(second.seeds)
    assert second.seeds[0] > first.seeds[-1]


def test_training_skips_mazes_equal_to_reserved_ones() -> None:
    # 7x7 has only 768 maze instances, so collisions with the 320 reserved ones are common.
    reserved = {generate_layout(s, 7).key for s in list(EVAL_SEEDS) + list(HELDOUT_SEEDS)}
    batch = train_seeds(0, 100, size=7)
    assert len(batch.seeds) == 100 and batch.next_cursor > 100  # some were skipped
    assert all(generate_layout(s, 7).key not in reserved for s in batch.seeds)


def test_exhausted_size_fails_instead_of_spinning() -> None:
    with pytest.raises(ValueError, match="no training mazes"):
        train_seeds(0, 1, size=5)  # all 16 5x5 instances are eval/held-out mazes


@pytest.mark.parametrize(("cursor", "count"), [(-1, 1), (0, -1), (True, 1), (0, 1.5)])
def test_bad_cursor_or_count(cursor: object, count: object) -> None:
    with pytest.raises(ValueError):
        train_seeds(cursor, count)  # type: ignore[arg-type]
