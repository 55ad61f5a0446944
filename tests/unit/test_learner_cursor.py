"""The learner's seed cursor: every training seed trained exactly once, in any order."""

from __future__ import annotations

import random

import pytest

from rlfleet.maze.tasks import EVAL_SEEDS, HELDOUT_SEEDS, train_seeds
from rlfleet_learner.cursor import SeedCursor


def test_sync_steps_take_consecutive_seeds_and_a_stopped_step_gives_them_back():
    cursor = SeedCursor(7)
    first = cursor.next_seeds(4)
    assert first == train_seeds(0, 4, 7).seeds
    assert cursor.next_seeds(4) == first  # asking takes nothing
    cursor.mark_trained(first)
    second = cursor.next_seeds(4)
    assert set(second).isdisjoint(first) and second == train_seeds(
        train_seeds(0, 4, 7).next_cursor, 4, 7).seeds


def test_out_of_order_training_resumes_without_repeats_or_gaps():
    """Async mode: groups finish out of order; a checkpoint taken at any point and
    resumed hands out exactly the seeds not yet trained."""
    rng = random.Random(0)
    cursor = SeedCursor(7)
    source = cursor.untrained()
    handed = [next(source) for _ in range(40)]
    trained: list[int] = []
    pending = list(handed)
    rng.shuffle(pending)
    for _ in range(5):  # five "steps" of 5 groups, in completion order
        done, pending = pending[:5], pending[5:]
        cursor.mark_trained(done)
        trained += done
    saved = cursor.to_dict()
    resumed = SeedCursor.from_dict(7, saved)
    again = resumed.untrained()
    replayed = [next(again) for _ in range(15)]
    assert set(replayed) == set(handed) - set(trained)  # the untrained ones, no others
    assert not set(replayed) & set(trained)
    assert saved["trained_ahead"]  # some trained seeds lay past the first untrained one


def test_training_a_seed_twice_is_refused():
    cursor = SeedCursor(7)
    seeds = cursor.next_seeds(2)
    cursor.mark_trained(seeds)
    with pytest.raises(ValueError, match="already trained"):
        cursor.mark_trained(seeds[:1])


def test_reserved_mazes_are_never_handed_out():
    cursor = SeedCursor(7)
    source = cursor.untrained()
    from rlfleet.maze.generate import generate_layout

    reserved = {generate_layout(s, 7).key for s in [*EVAL_SEEDS, *HELDOUT_SEEDS]}
    assert all(generate_layout(next(source), 7).key not in reserved for _ in range(300))


def test_update_batches_keep_groups_whole_and_cover_every_row_per_epoch():
    import numpy as np

    from rlfleet.grpo import TrainSample
    from rlfleet_learner.workers import update_batches

    def row(group: str, i: int) -> TrainSample:
        return TrainSample(input_ids=np.arange(3), loss_mask=[0, 1, 1], logprobs=[0, -1, -1],
                           reward=0.0, group_id=group, adapter_version=0, advantage=1.0,
                           extras={"i": i})

    rows = [row(f"g{g}", i) for g in range(5) for i in range(3)]
    assert update_batches(rows, 1, 1, seed=0) == [rows]
    updates = update_batches(rows, 2, 3, seed=7)
    assert len(updates) == 6
    for epoch in range(3):
        part = updates[2 * epoch: 2 * epoch + 2]
        assert sorted(id(r) for u in part for r in u) == sorted(id(r) for r in rows)
        for u in part:  # whole groups only
            groups = {r.group_id for r in u}
            assert sum(1 for r in rows if r.group_id in groups) == len(u)
    assert update_batches(rows, 2, 3, seed=7) == updates  # seeded: reproducible


def test_a_curriculum_band_hands_out_only_its_mazes_and_resumes_past_the_others():
    from rlfleet.maze.difficulty import shortest_moves

    cursor = SeedCursor(7, moves=(12, None))
    seeds = cursor.next_seeds(6)
    assert all(shortest_moves(s, 7) >= 12 for s in seeds)
    # the band's seeds are the same as the unfiltered stream's long ones, in order
    every = SeedCursor(7).next_seeds(200)
    assert seeds == [s for s in every if shortest_moves(s, 7) >= 12][:6]
    cursor.mark_trained(seeds[:3])
    resumed = SeedCursor.from_dict(7, cursor.to_dict(), (12, None))
    assert resumed.next_seeds(3) == seeds[3:]
    source = SeedCursor(7, moves=(8, 8)).untrained()
    assert all(shortest_moves(next(source), 7) == 8 for _ in range(50))


@pytest.mark.parametrize(("band", "message"), [
    ({"min_moves": 20}, "no training maze of size 7 is in that band.*8-16 moves"),
    ({"min_moves": 12, "max_moves": 8}, "max_moves=8 is less than data.min_moves=12"),
    ({"min_moves": 9, "max_moves": 11}, "no training maze of size 7 is in that band"),
])
def test_a_curriculum_band_without_mazes_is_refused_naming_the_numbers(band: dict,
                                                                      message: str) -> None:
    from pydantic import ValidationError

    from rlfleet.learner_config import DataConfig

    with pytest.raises(ValidationError, match=message):
        DataConfig(size=7, **band)
