"""Plots of a run: the learning curve (sampled reward per step, greedy eval solve rate)
and the held-out solve rate by shortest-path length at the start and the end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlfleet.maze.difficulty import BANDS


def learning_curve(steps: list[dict], evals: list[dict], out: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    full = [e for e in evals if any(f"heldout_{key}" in e for key, _, _, _ in BANDS)]
    fig = plt.figure(figsize=(8, 10 if full else 7))
    grid = fig.add_gridspec(3 if full else 2, 1)
    ax1 = fig.add_subplot(grid[0])
    ax2 = fig.add_subplot(grid[1], sharex=ax1)
    if steps:
        xs = [s["step"] for s in steps]
        ax1.plot(xs, [s["reward_mean"] for s in steps], label="mean reward (sampled)",
                 color="#4878cf")
        ax1.plot(xs, [s["solve_rate_sampled"] for s in steps], label="solved (sampled)",
                 color="#6acc65", alpha=0.8)
    ax1.set_ylabel("training rollouts")
    ax1.set_ylim(-0.02, 1.02)
    ax1.legend(loc="lower right")
    ax1.grid(alpha=0.3)
    # One series per set and size: the full sets at the start and end, and the smaller
    # held-out subset of the periodic evals in between.
    colors = iter(("#d65f5f", "#956cb4", "#ee854a", "#8c613c"))
    series: dict[tuple[str, int], list] = {}
    for e in evals:
        for key in ("eval", "heldout", "heldout_curve"):
            if key in e:  # heldout_curve: the periodic subset, read off a full evaluation
                name = "heldout" if key == "heldout_curve" else key
                series.setdefault((name, e[key]["episodes"]), []).append((e["step"], e[key]))
    for (name, episodes), pts in sorted(series.items()):
        xs = [p[0] for p in pts]
        ys = [100 * p[1]["solve_rate"] for p in pts]
        err = [100 * p[1]["solve_rate_se"] for p in pts]
        kind = "eval" if name == "eval" else "held-out"
        ax2.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=f"{episodes} {kind} mazes",
                     color=next(colors, None), linestyle="-" if len(pts) > 2 else "--")
    ax2.set_ylabel("greedy true solve rate (%)")
    ax2.set_xlabel("GRPO step")
    ax2.grid(alpha=0.3)
    if series:  # a run without evals has no curve to name
        ax2.legend(loc="lower right")
    if full:
        by_length(fig.add_subplot(grid[2]), full[0], full[-1])
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def by_length(ax: Any, start: dict, end: dict) -> None:
    """Bars of the held-out solve rate per band of shortest-path length, start and end."""
    bands = [(key, label) for key, label, _, _ in BANDS
             if f"heldout_{key}" in start and f"heldout_{key}" in end]
    xs = range(len(bands))
    for offset, (doc, color) in enumerate(((start, "#8c8c8c"), (end, "#d65f5f"))):
        rates = [100 * doc[f"heldout_{key}"]["solve_rate"] for key, _ in bands]
        errs = [100 * doc[f"heldout_{key}"]["solve_rate_se"] for key, _ in bands]
        ax.bar([x + (offset - 0.5) * 0.4 for x in xs], rates, width=0.4, yerr=errs,
               capsize=3, color=color, label=f"step {doc['step']}")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{label}\n({start[f'heldout_{key}']['episodes']} mazes)"
                        for key, label in bands])
    ax.set_ylabel("held-out greedy solve (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(loc="upper right")
