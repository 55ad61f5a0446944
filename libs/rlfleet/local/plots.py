"""Plots of a run: the learning curve (sampled reward per step, greedy eval solve rate)."""

from __future__ import annotations

from pathlib import Path


def learning_curve(steps: list[dict], evals: list[dict], out: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
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
    ax2.legend(loc="lower right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
