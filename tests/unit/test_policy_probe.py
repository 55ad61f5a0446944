"""The policy probes on the shipped checkpoint: agreement with the oracle split by where
its move heads, and whether the feedback sentence changes the greedy move."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.policy.loading import load_policy
from rlfleet.sft.probe import probe_policy

CHECKPOINT = Path(__file__).resolve().parents[2] / "warm-starts" / "tiny-sft"
SEEDS = range(64, 80)  # 16 held-out mazes


@pytest.fixture(scope="module")
def probed() -> dict:
    model, processor = load_policy(CHECKPOINT)
    return probe_policy(model, processor, SEEDS, 7)


def test_the_counts_add_up(probed: dict) -> None:
    assert probed["mazes"] == 16 and probed["size"] == 7
    assert probed["toward_states"] + probed["away_states"] == probed["states"] > 0
    assert probed["toward_agree"] + probed["away_agree"] == probed["agree"]
    assert 0 <= probed["feedback_changes"] <= probed["feedback_cells"] > 0
    assert 0 <= probed["reversals"] <= probed["feedback_moves"]


def test_the_shipped_checkpoint_heads_for_the_target_and_ignores_the_feedback(
        probed: dict) -> None:
    # what the docs report of it: it follows the oracle where the way leads towards the
    # target, rarely where it leads away, and the "Moved ..." sentence barely matters
    assert probed["toward_agree_rate"] > 0.8
    assert probed["away_agree_rate"] < 0.2
    assert probed["feedback_change_rate"] < 0.05
