"""bench/bench_grpo_vs_sft.py continues SFT from the GRPO run's own start, with the recipe
that made that start (the equal-compute baseline from a start of any recipe)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.bench_grpo_vs_sft import DEFAULT_RECIPE, REPO, start_and_recipe


def test_the_shipped_start_continues_its_own_recipe() -> None:
    start, recipe = start_and_recipe({"config": {"model": {"path": "warm-starts/tiny-sft"}}})
    assert start == REPO / "warm-starts" / "tiny-sft"
    made = json.loads((start / "sft_summary.json").read_text())["config"]
    assert recipe == {key: made.get(key, value) for key, value in DEFAULT_RECIPE.items()}
    assert recipe["context"] == "frame_only" and recipe["lr"] == 1e-3


def test_a_start_of_another_recipe_continues_that_recipe(tmp_path: Path) -> None:
    (tmp_path / "sft_summary.json").write_text(json.dumps(
        {"config": {"context": "last_frame", "agent_aux": 0.5, "feedback_aux": 1.0,
                    "lr": 5e-4, "batch": 16, "steps": 200}}))
    start, recipe = start_and_recipe({"config": {"model": {"path": str(tmp_path)}}})
    assert start == tmp_path
    assert recipe == {"context": "last_frame", "agent_aux": 0.5, "feedback_aux": 1.0,
                      "lr": 5e-4, "batch": 16}


def test_a_start_without_a_record_gets_the_shipped_recipe(tmp_path: Path) -> None:
    assert start_and_recipe({"config": {"model": {"path": str(tmp_path)}}}) == (
        tmp_path, DEFAULT_RECIPE)
