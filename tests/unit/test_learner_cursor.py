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
