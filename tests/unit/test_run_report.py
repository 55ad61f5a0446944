"""What `make run` reports by shortest-path length: the eval's bands, the before/after
table's rows and the third panel of learning_curve.png."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from rlfleet.evaluation.summary import by_length
from rlfleet.evaluation.table import comparison_table
from rlfleet.local.plots import learning_curve
from rlfleet.local.run import run_figures
from rlfleet.maze.difficulty import band, shortest_moves
from rlfleet.maze.tasks import HELDOUT_SEEDS


def played(solved: bool, turns: int = 9) -> SimpleNamespace:
    return SimpleNamespace(final_state=SimpleNamespace(solved=solved), reward=float(solved),
                           turns=[None] * turns)


def test_the_heldout_set_is_summarised_per_band() -> None:
    seeds = list(HELDOUT_SEEDS)
    long = {s for s in seeds if band(shortest_moves(s, 7)) == "moves_ge12"}
    # every long maze solved, no other
    result = by_length("heldout", seeds, {s: played(s in long) for s in seeds}, size=7)
    assert set(result) == {"heldout_moves_8to11", "heldout_moves_ge12"}  # no <= 7 on 7x7
    assert result["heldout_moves_ge12"]["episodes"] == len(long) == 29
    assert result["heldout_moves_ge12"]["solve_rate"] == 1.0
    assert result["heldout_moves_8to11"]["solve_rate"] == 0.0


def summary(episodes: int, rate: float) -> dict:
    return {"episodes": episodes, "solve_rate": rate, "solve_rate_se": 0.03,
            "pass_at_1": rate, "mean_reward": rate, "mean_turns": 12.0}


def eval_doc(step: int, long_rate: float) -> dict:
    return {"event": "eval", "step": step, "heldout": summary(256, 0.4),
            "heldout_moves_8to11": summary(227, 0.45), "heldout_moves_ge12": summary(29, long_rate)}


def test_the_table_has_a_row_per_band_with_its_change() -> None:
    table = comparison_table([("before", eval_doc(0, 0.0)), ("after", eval_doc(80, 0.25))])
    row = next(line for line in table.splitlines() if ">= 12 moves (29)" in line)
    assert row.split()[-3:] == ["0.0%", "25.0%", "+25.0pt"]
    assert "8-11 moves (227)" in table and "<= 7 moves" not in table


def test_the_learning_curve_has_the_bands_panel(tmp_path: Path) -> None:
    steps = [{"step": s, "reward_mean": 0.4, "solve_rate_sampled": 0.4} for s in (1, 2)]
    out = learning_curve(steps, [eval_doc(0, 0.0), eval_doc(2, 0.25)], tmp_path / "c.png")
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(out).shape
    assert (width, height) == (800, 1000)  # three panels; two without band results
    plain = learning_curve(steps, [], tmp_path / "plain.png")
    assert matplotlib.image.imread(plain).shape[:2] == (700, 800)


def test_a_record_keeps_each_sets_rates_and_the_curve() -> None:
    before = {"heldout": summary(256, 0.42), "eval": summary(64, 0.4)}
    after = {"heldout": summary(256, 0.75), "eval": summary(64, 0.7)}
    curve = [{"step": 0, "heldout": 0.42}, {"step": 20, "heldout": 0.5}]
    figures = run_figures({"steps": 20, "wall_clock_s": 600.0, "before": before,
                           "after": after, "curve": curve})
    assert figures["heldout"] == {"before": 0.42, "after": 0.75, "after_se": 0.03,
                                  "episodes": 256}
    assert figures["eval"]["after"] == 0.7 and figures["curve"] == curve
    assert "time_budget_cut" not in figures
