"""The before/after table of evaluations: per set the true solve rate with its standard
error, pass@1 (reward > 0, the metric the published seed run reports) beside it, each
labelled, the mean turns, and the solve rate in each band of shortest-path length; a
turn limit that caps the solve rate is stated under it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rlfleet.maze.difficulty import BANDS

SETS = ("eval", "heldout")
SET_LABELS = {"eval": "eval mazes", "heldout": "held-out mazes"}
LABEL_WIDTH = 40


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def comparison_table(columns: Sequence[tuple[str, Mapping]], caps: Sequence[str] = ()
                     ) -> str:
    """`columns`: (heading, evaluation) pairs, e.g. ("before (SFT)", first), ("after",
    last); with two, a change column. An evaluation maps set names (eval, heldout,
    heldout_moves_ge12, ...) to rlfleet.evaluation.summary's numbers."""
    change = len(columns) == 2
    head = f"{'':<{LABEL_WIDTH}}" + "".join(f"{h:>18}" for h, _ in columns)
    lines = [head + (f"{'change':>10}" if change else "")]

    def row(label: str, key: str, name: str, pct: bool, diff: bool = True) -> None:
        values = [doc[name][key] for _, doc in columns]
        text = "".join(f"{_pct(v) if pct else f'{v:.2f}':>18}" for v in values)
        if change and diff:
            d = values[1] - values[0]
            text += f"{100 * d:>+8.1f}pt" if pct else f"{d:>+10.2f}"
        lines.append(f"{label:<{LABEL_WIDTH}}{text}")

    for name in SETS:
        if not all(name in doc for _, doc in columns):
            continue
        n = columns[0][1][name]["episodes"]
        row(f"{n} {SET_LABELS[name]}: true solve", "solve_rate", name, True)
        row("  ± standard error", "solve_rate_se", name, True, diff=False)
        row("  pass@1 (reward > 0, the seed's metric)", "pass_at_1", name, True)
        row("  mean reward", "mean_reward", name, False)
        row("  mean turns", "mean_turns", name, False)
        for key, label, _, _ in BANDS:  # by shortest-path length
            band = f"{name}_{key}"
            if all(band in doc for _, doc in columns):
                m = columns[0][1][band]["episodes"]
                row(f"  {label} ({m}): true solve", "solve_rate", band, True)
    lines.append("true solve: stopped on the target; pass@1: reward > 0, which a reward "
                 "with format credit pays without a solve")
    lines.extend(f"turn cap: {cap}" for cap in caps)
    return "\n".join(lines)
